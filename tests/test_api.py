"""The HTTP API through a real `runnerd serve` (uvicorn on a free port, real SQLite, real
nsjail): seed endpoints field for field, access rules, lifecycle, errors."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLE, write_app
from daemon import Daemon, concurrently, envelope, running_daemon

pytestmark = pytest.mark.jail
# The tests on the module's daemon run on both stores.
BACKENDS = ("sqlite", "postgresql")

SEED_TOOL_FIELDS = [
    "reference",
    "name",
    "description",
    "effect",
    "language",
    "inputSchema",
    "outputSchema",
    "timeoutMs",
    "appId",
    "appSlug",
    "installId",
    "versionId",
    "version",
]
OFFER = {
    "discountPct": 12,
    "marginPct": 30,
    "termMonths": 24,
    "dealSize": 120000,
    "tier": "enterprise",
}


@pytest.fixture(scope="module")
def install(daemon: Daemon) -> dict[str, Any]:
    return daemon.ship(EXAMPLE)


def versioned_app(root: Path, version: str, *, extra: str = "") -> Path:
    """An app whose tool `which` reports its version, after sleeping input.ms."""
    source = (
        "import time\n"
        + extra
        + "def run(i):\n    time.sleep(i.get('ms', 0) / 1000)\n"
        + f"    return {{'version': '{version}'}}\n"
    )
    which = {
        "description": "Says which version runs.",
        "timeoutMs": 20000,
        "input": {"type": "object", "properties": {"ms": {"type": "integer"}}},
        "output": {"type": "object", "required": ["version"]},
    }
    return write_app(root, "versioned", {"which": source}, version=version, docs={"which": which})


# --- health -----------------------------------------------------------------------------------


def test_healthz_and_readyz(daemon: Daemon) -> None:
    assert daemon.call("GET", "/healthz").json() == {"status": "ok", "checks": None}
    ready = daemon.call("GET", "/readyz").json()
    assert ready["status"] == "ready"
    assert ready["checks"]["store"] == "ok" and ready["checks"]["nsjail"] == "ok"


# --- List App Tools (seed 003) ---------------------------------------------------------------


def test_list_tools_answers_the_seed_body_field_for_field(
    daemon: Daemon, install: dict[str, Any]
) -> None:
    response = daemon.call(
        "GET", "/api/v2/apps/tools", daemon.admin_key, params={"workspaceId": daemon.workspace_id}
    )
    assert response.status_code == 200
    body = response.json()
    assert list(body) == ["data", "nextCursor"] and body["nextCursor"] is None
    by_name = {t["name"]: t for t in body["data"]}
    score = by_name["score_offer"]
    assert list(score) == SEED_TOOL_FIELDS
    assert score["reference"] == "deal-desk/score_offer"
    assert (score["language"], score["effect"], score["timeoutMs"]) == ("typescript", "read", 10000)
    assert by_name["route_ticket"]["language"] == "python"
    assert (score["installId"], score["versionId"], score["version"]) == (
        install["installId"],
        install["versionId"],
        "1",
    )
    assert score["inputSchema"]["required"] == [
        "discountPct",
        "marginPct",
        "termMonths",
        "dealSize",
        "tier",
    ]
    assert "source" not in json.dumps(body) and "compiled" not in json.dumps(body)


def test_list_tools_filtered_by_install(daemon: Daemon, install: dict[str, Any]) -> None:
    ok = daemon.call(
        "GET",
        "/api/v2/apps/tools",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id, "installId": install["installId"]},
    )
    assert {t["installId"] for t in ok.json()["data"]} == {install["installId"]}
    missing = daemon.call(
        "GET",
        "/api/v2/apps/tools",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id, "installId": "inst_x"},
    )
    envelope(missing, 404)


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"workspaceId": ""},
        {"workspaceId": "w" * 129},
        {"workspaceId": "ws", "installId": ""},
        {"workspaceId": "ws", "installId": "i" * 65},
    ],
)
def test_list_tools_query_length_rules(daemon: Daemon, params: dict[str, str]) -> None:
    response = daemon.call("GET", "/api/v2/apps/tools", daemon.admin_key, params=params)
    envelope(response, 400, "INVALID_QUERY")


def test_list_tools_access_rules(daemon: Daemon, install: dict[str, Any]) -> None:
    path, params = "/api/v2/apps/tools", {"workspaceId": daemon.workspace_id}
    envelope(daemon.call("GET", path, None, params=params), 401)
    envelope(daemon.call("GET", path, "rk_p_nope", params=params), 401)
    ws_key = daemon.key(kind="workspace", workspace_id=daemon.workspace_id)
    envelope(daemon.call("GET", path, ws_key, params=params), 403, "WORKSPACE_KEY_NOT_ALLOWED")
    no_apps = daemon.person("no-apps@example.com", role="admin", apps_access=False)
    error = envelope(
        daemon.call("GET", path, no_apps, params=params), 403, "INSUFFICIENT_WORKSPACE_ROLE"
    )
    assert error["message"] == "Insufficient workspace permissions"
    outsider_ws = daemon.store().create_workspace("Other").id
    outsider = daemon.person("outsider@example.com", workspace_id=outsider_ws)
    envelope(daemon.call("GET", path, outsider, params=params), 403, "INSUFFICIENT_WORKSPACE_ROLE")
    viewer = daemon.person("viewer@example.com", role="viewer")
    assert daemon.call("GET", path, viewer, params=params).status_code == 200
    store = daemon.store()
    user = store.ensure_user("viewer@example.com")
    no_read = store.create_key(kind="token", user_id=user.id, scopes=("tools:run",))[1]
    read = store.create_key(kind="token", user_id=user.id, scopes=("api:read",))[1]
    store.close()
    envelope(daemon.call("GET", path, no_read, params=params), 403, "INSUFFICIENT_SCOPE")
    assert daemon.call("GET", path, read, params=params).status_code == 200


# --- Run a tool -------------------------------------------------------------------------------


def test_run_answers_200_with_the_five_fields(daemon: Daemon, install: dict[str, Any]) -> None:
    response = daemon.run(install["installId"], "score_offer", OFFER)
    assert response.status_code == 200
    body = response.json()
    assert list(body) == ["runId", "status", "output", "error", "durationMs"]
    assert body["status"] == "succeeded" and body["error"] is None
    assert body["output"]["decision"] == "approve" and body["durationMs"] > 0
    row = daemon.store().get_run(body["runId"])
    assert row is not None
    assert (row.status, row.tool, row.surface) == ("succeeded", "score_offer", "api")
    assert row.user_id == daemon.store().ensure_user("ada@example.com").id


def test_whoever_holds_an_answer_finds_its_run_ended_in_the_ledger(
    daemon: Daemon, install: dict[str, Any]
) -> None:
    # A run's end is committed before its answer is sent, so another process reading the
    # store the instant the answer arrives already sees the end (row and ledger row).
    store = daemon.store()
    try:
        for _ in range(25):
            body = daemon.run(install["installId"], "score_offer", OFFER).json()
            row = store.get_run(body["runId"])
            assert row is not None and row.status == "succeeded", row
            ledger = store.ledger(install_id=install["installId"])
            assert body["runId"] in {entry["run_id"] for entry in ledger}
    finally:
        store.close()


def test_failed_and_timed_out_runs_are_200_too(daemon: Daemon, tmp_path: Path) -> None:
    root = write_app(
        tmp_path / "bad",
        "crashy",
        {"boom": "def run(i):\n    raise KeyError('missing')\n",
         "spin": "def run(i):\n    while True:\n        pass\n"},
        docs={"boom": {"description": "d", "timeoutMs": 5000},
              "spin": {"description": "d", "timeoutMs": 1000}},
    )  # fmt: skip
    installed = daemon.ship(root)
    boom = daemon.run(installed["installId"], "boom", {})
    assert boom.status_code == 200
    assert boom.json()["status"] == "failed" and boom.json()["output"] is None
    assert boom.json()["error"].startswith("KeyError: 'missing'")
    spin = daemon.run(installed["installId"], "spin", {})
    assert spin.status_code == 200 and spin.json()["status"] == "timed_out"


def test_refusals_before_the_start_are_envelopes(daemon: Daemon, install: dict[str, Any]) -> None:
    iid = install["installId"]
    bad = envelope(daemon.run(iid, "score_offer", {**OFFER, "tier": "gold"}), 400, "INVALID_INPUT")
    assert bad["details"]["pointer"] == "/tier"
    envelope(
        daemon.run(iid, "score_offer", {**OFFER, "pad": "x" * (256 * 1024)}), 400, "INPUT_TOO_LARGE"
    )
    envelope(daemon.run(iid, "nope", {}), 404, "TOOL_NOT_FOUND")
    envelope(daemon.run("inst_missing", "score_offer", OFFER), 404)
    envelope(
        daemon.call(
            "POST",
            f"/api/v2/apps/installs/{iid}/tools/score_offer/run",
            daemon.admin_key,
            content=b"{not json",
            headers={"content-type": "application/json"},
        ),
        400,
        "INVALID_BODY",
    )
    envelope(daemon.run(iid, "score_offer", OFFER, surface="telepathy"), 400, "INVALID_BODY")
    ws_key = daemon.key(kind="workspace", workspace_id=daemon.workspace_id)
    envelope(daemon.run(iid, "score_offer", OFFER, key=ws_key), 403, "WORKSPACE_KEY_NOT_ALLOWED")
    viewer = daemon.person("viewer2@example.com", role="viewer")
    envelope(daemon.run(iid, "score_offer", OFFER, key=viewer), 403, "INSUFFICIENT_WORKSPACE_ROLE")
    no_apps = daemon.person("member-no-apps@example.com", apps_access=False)
    envelope(daemon.run(iid, "score_offer", OFFER, key=no_apps), 403, "INSUFFICIENT_WORKSPACE_ROLE")


def test_run_by_reference_records_the_workflow_run(daemon: Daemon, install: dict[str, Any]) -> None:
    member = daemon.person("member@example.com")
    response = daemon.call(
        "POST",
        "/api/v2/apps/tools/deal-desk/route_ticket/run",
        member,
        params={"workspaceId": daemon.workspace_id},
        json={
            "input": {"subject": "Invoice 7", "customer_tier": "enterprise"},
            "surface": "workflow",
            "workflowRunId": "wfr_123",
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["output"] == {"queue": "billing", "priority": "high"}
    row = daemon.store().get_run(body["runId"])
    assert row is not None
    assert (row.surface, row.workflow_run_id) == ("workflow", "wfr_123")
    assert row.user_id == daemon.store().ensure_user("member@example.com").id
    envelope(
        daemon.call(
            "POST",
            "/api/v2/apps/tools/no-such-app/x/run",
            member,
            params={"workspaceId": daemon.workspace_id},
            json={"input": {}},
        ),
        404,
        "INSTALL_NOT_FOUND",
    )


# --- lifecycle --------------------------------------------------------------------------------


def test_deploy_refusal_lists_every_problem(daemon: Daemon, tmp_path: Path) -> None:
    root = tmp_path / "broken"
    (root / "tools").mkdir(parents=True)
    (root / "agentserve.app.yaml").write_text("slug: broken\nname: Broken\ntools: ./tools/*\n")
    (root / "tools" / "a.tool.yaml").write_text(
        "name: a\ndescription: x\ntimeoutMs: 10\ninput: {type: object}\noutput: {type: object}\n"
    )
    (root / "tools" / "a.py").write_text("def run(:\n")
    error = envelope(daemon.deploy(root), 400, "BUNDLE_REJECTED")
    assert error["details"]["problems"] == [
        {"file": "tools/a.py", "message": "Python syntax error: invalid syntax", "line": 1},
        {
            "file": "tools/a.tool.yaml",
            "line": 3,
            "message": (
                "timeoutMs: time limit for one run in milliseconds, including starting the "
                "sandbox: an integer from 1000 to 300000 (default 30000); got 10"
            ),
        },
    ]
    assert daemon.store().get_app("broken") is None


def test_deploy_needs_a_builder_and_versions_are_immutable(daemon: Daemon, tmp_path: Path) -> None:
    app = versioned_app(tmp_path / "v", "9.0.0")
    member = daemon.person("plain-member@example.com")
    envelope(daemon.deploy(app, key=member), 403, "INSUFFICIENT_WORKSPACE_ROLE")
    builder = daemon.person("builder@example.com", role="builder")
    assert daemon.deploy(app, key=builder).status_code == 201
    envelope(daemon.deploy(app, key=builder), 409, "VERSION_EXISTS")


def test_install_needs_admin_and_a_published_version(daemon: Daemon, tmp_path: Path) -> None:
    version = daemon.deploy(versioned_app(tmp_path / "d", "draft-1")).json()["version"]
    params = {"workspaceId": daemon.workspace_id}
    body = {"appSlug": "versioned", "version": version["version"]}
    envelope(
        daemon.call("POST", "/api/v2/apps/installs", daemon.admin_key, params=params, json=body),
        400,
        "VERSION_NOT_PUBLISHED",
    )
    builder = daemon.person("builder2@example.com", role="builder")
    envelope(
        daemon.call("POST", "/api/v2/apps/installs", builder, params=params, json=body),
        403,
        "INSUFFICIENT_WORKSPACE_ROLE",
    )


def test_switch_is_atomic_and_rollback_returns(daemon: Daemon, tmp_path: Path) -> None:
    first = daemon.ship(versioned_app(tmp_path / "a", "1.0.0"))
    iid = first["installId"]
    second = daemon.deploy(versioned_app(tmp_path / "b", "2.0.0")).json()["version"]
    daemon.call(
        "POST",
        "/api/v2/apps/versioned/versions/2.0.0/publish",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id},
    )
    slow: dict[str, Any] = {}

    def slow_call() -> None:
        slow["response"] = daemon.run(iid, "which", {"ms": 1500})

    thread = threading.Thread(target=slow_call)
    thread.start()
    import time

    time.sleep(0.5)  # the slow run has started on 1.0.0
    switched = daemon.call(
        "POST", f"/api/v2/apps/installs/{iid}/switch", daemon.admin_key, json={"version": "2.0.0"}
    )
    assert switched.status_code == 200 and switched.json()["version"] == "2.0.0"
    assert switched.json()["previousVersionId"] == first["versionId"]
    assert daemon.run(iid, "which", {}).json()["output"] == {"version": "2.0.0"}
    thread.join()
    assert slow["response"].json()["output"] == {"version": "1.0.0"}
    rolled = daemon.call("POST", f"/api/v2/apps/installs/{iid}/rollback", daemon.admin_key)
    assert rolled.json()["version"] == "1.0.0"
    assert daemon.run(iid, "which", {}).json()["output"] == {"version": "1.0.0"}
    assert second["versionId"] == rolled.json()["previousVersionId"]


def test_app_list_never_returns_code(daemon: Daemon, install: dict[str, Any]) -> None:
    body = daemon.call(
        "GET", "/api/v2/apps", daemon.admin_key, params={"workspaceId": daemon.workspace_id}
    ).json()
    text = json.dumps(body)
    assert "deal-desk" in text
    assert "def run" not in text and "export function" not in text


# --- errors everywhere ------------------------------------------------------------------------


def test_every_route_answers_errors_in_the_envelope(daemon: Daemon) -> None:
    from runnerd.daemon.app import OPS

    for op in OPS:
        path = op.path.format(
            installId="inst_x",
            toolName="t",
            appSlug="a",
            version="1",
            name="KEY",
            runId="run_x",
            approvalId="apr_x",
            workspaceId="ws_x",
            keyId="key_x",
            userId="usr_x",
        )
        allowed = {o.method for o in OPS if o.path == op.path}
        wrong = next(m for m in ("PATCH", "DELETE", "PUT") if m not in allowed)
        envelope(daemon.call(wrong, path), 405)
        params = {"workspaceId": daemon.workspace_id}
        if op.method != "GET":  # a cross-site form's body, even with a valid key
            form = daemon.call(
                op.method,
                path,
                daemon.admin_key,
                params=params,
                content=b'{"a": 1}',
                headers={"content-type": "text/plain"},
            )
            if op.body is not None:
                envelope(form, 415, "CONTENT_TYPE_NOT_JSON")
            else:
                envelope(form, 400, "BODY_NOT_ALLOWED")
        if op.authenticated:
            body = {} if op.body is not None else None
            envelope(daemon.call(op.method, path, params=params, json=body), 401)
    envelope(daemon.call("GET", "/api/v2/nothing/here"), 404)
    envelope(daemon.call("GET", "/nothing/here"), 404)
    page = daemon.call("GET", "/")  # the Manage page
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_openapi_served_matches_the_checked_in_file(daemon: Daemon) -> None:
    served = daemon.call("GET", "/api/v2/openapi.json").json()
    checked_in = json.loads((EXAMPLE.parent.parent / "schemas" / "openapi.json").read_text())
    assert served == checked_in
    assert served["openapi"] == "3.1.0"
    tools = served["paths"]["/api/v2/apps/tools"]["get"]
    assert {p["name"] for p in tools["parameters"]} == {"workspaceId", "installId"}


# --- load limits (their own daemons) ----------------------------------------------------------


def test_rate_limit_is_429_with_retry_after(toolchain_dir: Path) -> None:
    with running_daemon(toolchain_dir, rate_limit_burst="3", rate_limit_per_second="0.5") as d:
        params = {"workspaceId": d.workspace_id}
        codes = [
            d.call("GET", "/api/v2/apps/tools", d.admin_key, params=params).status_code
            for _ in range(4)
        ]
        assert codes == [200, 200, 200, 429]
        limited = d.call("GET", "/api/v2/apps/tools", d.admin_key, params=params)
        error = envelope(limited, 429)
        assert error["message"] == "API rate limit exceeded"
        assert error["details"]["retryAfter"].endswith("Z")
        assert int(limited.headers["Retry-After"]) >= 1
        other = d.person("other@example.com")  # buckets are per key
        assert d.call("GET", "/api/v2/apps/tools", other, params=params).status_code == 200


def test_runs_past_the_queue_are_503(toolchain_dir: Path, tmp_path: Path) -> None:
    with running_daemon(toolchain_dir, max_concurrent_runs="1", max_queued_runs="1") as d:
        iid = d.ship(versioned_app(tmp_path / "q", "1.0.0"))["installId"]
        results = concurrently(4, lambda: d.run(iid, "which", {"ms": 1200}))
        codes = sorted(r.status_code for r in results)
        assert codes.count(200) == 2 and codes.count(503) == 2, codes
        busy = next(r for r in results if r.status_code == 503)
        envelope(busy, 503, "RUN_QUEUE_FULL")
        assert busy.headers["Retry-After"] == "1"


def test_unexpected_error_is_500_without_a_stack(toolchain_dir: Path, tmp_path: Path) -> None:
    with running_daemon(toolchain_dir) as d:
        d.ship(versioned_app(tmp_path / "z", "1.0.0"))
        # Break the database under the running daemon: the next query fails inside it.
        store = d.store()
        store.db.execute("PRAGMA foreign_keys = OFF")
        store.db.execute("DROP TABLE memberships")
        store.close()
        response = d.call(
            "GET", "/api/v2/apps/tools", d.admin_key, params={"workspaceId": d.workspace_id}
        )
        error = envelope(response, 500)
        assert error == {"code": "INTERNAL_ERROR", "message": "Internal server error"}
        log = (d.data_dir / "serve.log").read_text()
        assert "internal error OperationalError on GET /api/v2/apps/tools" in log
        assert "no such table" not in log  # the message is not logged, only type and place


# --- warm jails (the daemon starts jails ahead of calls) --------------------------------------


def test_warm_jails_serve_one_call_each_and_leave_nothing(daemon: Daemon, tmp_path: Path) -> None:
    mark = (
        "import os, time\n"
        "def run(i):\n"
        "    seen = os.path.exists('/tmp/mark')\n"
        "    open('/tmp/mark', 'w').write('x')\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        time.sleep(600)\n"
        "    return {'seen': seen, 'uid': os.getuid()}\n"
    )
    root = write_app(tmp_path / "warm", "warm", {"mark": mark}, docs={"mark": {"description": "d"}})
    iid = daemon.ship(root)["installId"]
    outputs = [daemon.run(iid, "mark", {}).json()["output"] for _ in range(4)]
    assert outputs == [{"seen": False, "uid": 1000}] * 4
    # The replies came before the jails ended; each jail still ends, with its sleeper.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        sleepers = [
            p
            for p in Path("/proc").glob("[0-9]*/cmdline")
            if b"harness_py" in _read(p) and _uid(p.parent) in range(620000, 620064)
        ]
        if len(sleepers) <= 2:  # only the waiting jails of the pool remain
            break
        time.sleep(0.1)
    assert len(sleepers) <= 2


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _uid(proc_dir: Path) -> int:
    for line in _read(proc_dir / "status").decode().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return -1
