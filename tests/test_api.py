"""The HTTP API's contract, through the daemon's app in this process (tests/inproc.py: real
SQLite or PostgreSQL, no jail): seed endpoints field for field, access rules, refusals,
lifecycle, errors, limits. What runs tools is in test_api_daemon.py, on a real daemon."""

from __future__ import annotations

import base64
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import EXAMPLE, write_app
from daemon import envelope
from inproc import InProcess, in_process
from runnerd.store import Store
from runnerd.upload.walk import read_app_dir

# The tests on the module's app run on both stores.
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
def install(app_daemon: InProcess) -> dict[str, Any]:
    return app_daemon.ship(EXAMPLE)


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


@pytest.mark.smoke
def test_healthz_and_readyz(app_daemon: InProcess) -> None:
    assert app_daemon.call("GET", "/healthz").json() == {"status": "ok", "checks": None}
    ready = app_daemon.call("GET", "/readyz").json()
    assert ready["status"] == "ready"
    assert ready["checks"]["store"] == "ok" and ready["checks"]["nsjail"] == "ok"


# --- List App Tools (seed 003) ---------------------------------------------------------------


def test_list_tools_answers_the_seed_body_field_for_field(
    app_daemon: InProcess, install: dict[str, Any]
) -> None:
    response = app_daemon.call(
        "GET",
        "/api/v2/apps/tools",
        app_daemon.admin_key,
        params={"workspaceId": app_daemon.workspace_id},
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


def test_list_tools_filtered_by_install(app_daemon: InProcess, install: dict[str, Any]) -> None:
    ok = app_daemon.call(
        "GET",
        "/api/v2/apps/tools",
        app_daemon.admin_key,
        params={"workspaceId": app_daemon.workspace_id, "installId": install["installId"]},
    )
    assert {t["installId"] for t in ok.json()["data"]} == {install["installId"]}
    missing = app_daemon.call(
        "GET",
        "/api/v2/apps/tools",
        app_daemon.admin_key,
        params={"workspaceId": app_daemon.workspace_id, "installId": "inst_x"},
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
def test_list_tools_query_length_rules(app_daemon: InProcess, params: dict[str, str]) -> None:
    response = app_daemon.call("GET", "/api/v2/apps/tools", app_daemon.admin_key, params=params)
    envelope(response, 400, "INVALID_QUERY")


def test_list_tools_access_rules(app_daemon: InProcess, install: dict[str, Any]) -> None:
    path, params = "/api/v2/apps/tools", {"workspaceId": app_daemon.workspace_id}
    envelope(app_daemon.call("GET", path, None, params=params), 401)
    envelope(app_daemon.call("GET", path, "rk_p_nope", params=params), 401)
    ws_key = app_daemon.key(kind="workspace", workspace_id=app_daemon.workspace_id)
    envelope(app_daemon.call("GET", path, ws_key, params=params), 403, "WORKSPACE_KEY_NOT_ALLOWED")
    no_apps = app_daemon.person("no-apps@example.com", role="admin", apps_access=False)
    error = envelope(
        app_daemon.call("GET", path, no_apps, params=params), 403, "INSUFFICIENT_WORKSPACE_ROLE"
    )
    assert "no Apps access" in error["message"] and "--apps-access" in error["message"]
    outsider_ws = app_daemon.store().create_workspace("Other").id
    outsider = app_daemon.person("outsider@example.com", workspace_id=outsider_ws)
    envelope(
        app_daemon.call("GET", path, outsider, params=params), 403, "INSUFFICIENT_WORKSPACE_ROLE"
    )
    viewer = app_daemon.person("viewer@example.com", role="viewer")
    assert app_daemon.call("GET", path, viewer, params=params).status_code == 200
    store = app_daemon.store()
    user = store.ensure_user("viewer@example.com")
    no_read = store.create_key(kind="token", user_id=user.id, scopes=("tools:run",))[1]
    read = store.create_key(kind="token", user_id=user.id, scopes=("api:read",))[1]
    store.close()
    envelope(app_daemon.call("GET", path, no_read, params=params), 403, "INSUFFICIENT_SCOPE")
    assert app_daemon.call("GET", path, read, params=params).status_code == 200


# --- Run a tool: what is refused before it starts --------------------------------------------


@pytest.mark.smoke
def test_refusals_before_the_start_are_envelopes(
    app_daemon: InProcess, install: dict[str, Any]
) -> None:
    iid = install["installId"]
    bad = envelope(
        app_daemon.run(iid, "score_offer", {**OFFER, "tier": "gold"}), 400, "INVALID_INPUT"
    )
    assert bad["details"]["pointer"] == "/tier"
    envelope(
        app_daemon.run(iid, "score_offer", {**OFFER, "pad": "x" * (256 * 1024)}),
        400,
        "INPUT_TOO_LARGE",
    )
    envelope(app_daemon.run(iid, "nope", {}), 404, "TOOL_NOT_FOUND")
    envelope(app_daemon.run("inst_missing", "score_offer", OFFER), 404)
    envelope(
        app_daemon.call(
            "POST",
            f"/api/v2/apps/installs/{iid}/tools/score_offer/run",
            app_daemon.admin_key,
            content=b"{not json",
            headers={"content-type": "application/json"},
        ),
        400,
        "INVALID_BODY",
    )
    envelope(app_daemon.run(iid, "score_offer", OFFER, surface="telepathy"), 400, "INVALID_BODY")
    ws_key = app_daemon.key(kind="workspace", workspace_id=app_daemon.workspace_id)
    envelope(
        app_daemon.run(iid, "score_offer", OFFER, key=ws_key), 403, "WORKSPACE_KEY_NOT_ALLOWED"
    )
    viewer = app_daemon.person("viewer2@example.com", role="viewer")
    envelope(
        app_daemon.run(iid, "score_offer", OFFER, key=viewer), 403, "INSUFFICIENT_WORKSPACE_ROLE"
    )
    no_apps = app_daemon.person("member-no-apps@example.com", apps_access=False)
    envelope(
        app_daemon.run(iid, "score_offer", OFFER, key=no_apps), 403, "INSUFFICIENT_WORKSPACE_ROLE"
    )


def test_run_by_reference_refuses_as_before_with_the_governor_deciding(
    app_daemon: InProcess, install: dict[str, Any]
) -> None:
    """Who may run is the governor's to say (and audit, tests/test_governor_surfaces.py);
    the answers by reference are those they were: someone outside the workspace, a viewer
    and a member without the Apps module are refused (with or without an install of the
    app), a member is told there is no such install, and gets the input's refusal."""

    def by_reference(key: str, slug: str = "deal-desk", value: Any = OFFER) -> httpx.Response:
        return app_daemon.call(
            "POST",
            f"/api/v2/apps/tools/{slug}/score_offer/run",
            key,
            params={"workspaceId": app_daemon.workspace_id},
            json={"input": value},
        )

    other = app_daemon.store().create_workspace("Elsewhere").id
    outsider = app_daemon.person("ref-outsider@example.com", workspace_id=other)
    viewer = app_daemon.person("ref-viewer@example.com", role="viewer")
    no_apps = app_daemon.person("ref-no-apps@example.com", apps_access=False)
    for key in (outsider, viewer, no_apps):
        for slug in ("deal-desk", "no-such-app"):
            envelope(by_reference(key, slug), 403, "INSUFFICIENT_WORKSPACE_ROLE")
    member = app_daemon.person("ref-member@example.com")
    missing = envelope(by_reference(member, "no-such-app"), 404, "INSTALL_NOT_FOUND")
    assert missing["message"] == "The workspace has no install of this app"
    bad = envelope(by_reference(member, value={**OFFER, "tier": "gold"}), 400, "INVALID_INPUT")
    assert bad["details"]["pointer"] == "/tier"


# --- lifecycle --------------------------------------------------------------------------------


@pytest.mark.smoke
def test_deploy_refusal_lists_every_problem(app_daemon: InProcess, tmp_path: Path) -> None:
    root = tmp_path / "broken"
    (root / "tools").mkdir(parents=True)
    (root / "agentserve.app.yaml").write_text("slug: broken\nname: Broken\ntools: ./tools/*\n")
    (root / "tools" / "a.tool.yaml").write_text(
        "name: a\ndescription: x\ntimeoutMs: 10\ninput: {type: object}\noutput: {type: object}\n"
    )
    (root / "tools" / "a.py").write_text("def run(:\n")
    error = envelope(app_daemon.deploy(root), 400, "BUNDLE_REJECTED")
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
    assert app_daemon.store().get_app("broken") is None


def test_deploy_needs_a_builder_and_versions_are_immutable(
    app_daemon: InProcess, tmp_path: Path
) -> None:
    app = versioned_app(tmp_path / "v", "9.0.0")
    member = app_daemon.person("plain-member@example.com")
    envelope(app_daemon.deploy(app, key=member), 403, "INSUFFICIENT_WORKSPACE_ROLE")
    builder = app_daemon.person("builder@example.com", role="builder")
    assert app_daemon.deploy(app, key=builder).status_code == 201
    envelope(app_daemon.deploy(app, key=builder), 409, "VERSION_EXISTS")


def test_two_workspaces_deploying_one_new_slug_at_once_do_not_both_get_it(
    app_daemon: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slug belongs to the workspace that deployed it first, decided in the transaction
    that stores the version: of two deploys of one new slug from two workspaces, both
    checked before either stored, one stores it and the other is refused, as a later
    deploy from that workspace is."""
    store = app_daemon.store()
    rival = store.create_workspace("Rival").id
    store.close()
    keys = {
        app_daemon.workspace_id: app_daemon.admin_key,
        rival: app_daemon.person("rival-builder@example.com", role="builder", workspace_id=rival),
    }
    app = write_app(tmp_path / "contested", "contested", {"echo": "def run(i):\n    return i\n"})
    files = {p: base64.b64encode(d).decode() for p, d in read_app_dir(app).items()}

    def deploy(workspace_id: str) -> httpx.Response:
        return app_daemon.call(
            "POST",
            "/api/v2/apps/deploy",
            keys[workspace_id],
            params={"workspaceId": workspace_id},
            json={"files": files},
        )

    # Both deploys are checked, and neither has stored its version, when both store.
    both_checked = threading.Barrier(2, timeout=30)
    add_version = Store.add_version

    def once_both_are_checked(self: Store, *args: Any, **kw: Any) -> Any:
        both_checked.wait()
        return add_version(self, *args, **kw)

    monkeypatch.setattr(Store, "add_version", once_both_are_checked)
    with ThreadPoolExecutor(2) as pool:
        answers = dict(zip(keys, pool.map(deploy, keys), strict=True))
    monkeypatch.undo()

    statuses = sorted(answer.status_code for answer in answers.values())
    assert statuses == [201, 403], [answer.text for answer in answers.values()]
    [owner] = [ws for ws, answer in answers.items() if answer.status_code == 201]
    [refused] = [ws for ws in keys if ws != owner]
    first = envelope(answers[refused], 403, "APP_OWNED_BY_ANOTHER_WORKSPACE")
    later = envelope(deploy(refused), 403, "APP_OWNED_BY_ANOTHER_WORKSPACE")
    assert first["message"] == later["message"] == "app 'contested' belongs to another workspace"
    store = app_daemon.store()
    try:
        contested = store.get_app("contested")
        assert contested is not None and contested.workspace_id == owner
        assert len(store.list_versions(contested.id)) == 1
    finally:
        store.close()


def test_install_needs_admin_and_a_published_version(app_daemon: InProcess, tmp_path: Path) -> None:
    version = app_daemon.deploy(versioned_app(tmp_path / "d", "draft-1")).json()["version"]
    params = {"workspaceId": app_daemon.workspace_id}
    body = {"appSlug": "versioned", "version": version["version"]}
    envelope(
        app_daemon.call(
            "POST", "/api/v2/apps/installs", app_daemon.admin_key, params=params, json=body
        ),
        400,
        "VERSION_NOT_PUBLISHED",
    )
    builder = app_daemon.person("builder2@example.com", role="builder")
    envelope(
        app_daemon.call("POST", "/api/v2/apps/installs", builder, params=params, json=body),
        403,
        "INSUFFICIENT_WORKSPACE_ROLE",
    )


def test_app_list_never_returns_code(app_daemon: InProcess, install: dict[str, Any]) -> None:
    body = app_daemon.call(
        "GET", "/api/v2/apps", app_daemon.admin_key, params={"workspaceId": app_daemon.workspace_id}
    ).json()
    text = json.dumps(body)
    assert "deal-desk" in text
    assert "def run" not in text and "export function" not in text


# --- errors everywhere ------------------------------------------------------------------------


def test_every_route_answers_errors_in_the_envelope(app_daemon: InProcess) -> None:
    from runnerd.api.routes import OPS

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
            requestId="oar_x",
        )
        allowed = {o.method for o in OPS if o.path == op.path}
        wrong = next(m for m in ("PATCH", "DELETE", "PUT") if m not in allowed)
        envelope(app_daemon.call(wrong, path), 405)
        params = {"workspaceId": app_daemon.workspace_id}
        if op.method != "GET":  # a cross-site form's body, even with a valid key
            form = app_daemon.call(
                op.method,
                path,
                app_daemon.admin_key,
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
            envelope(app_daemon.call(op.method, path, params=params, json=body), 401)
    envelope(app_daemon.call("GET", "/api/v2/nothing/here"), 404)
    envelope(app_daemon.call("GET", "/nothing/here"), 404)
    page = app_daemon.call("GET", "/")  # the Manage page
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


@pytest.mark.smoke
def test_openapi_served_matches_the_checked_in_file(app_daemon: InProcess) -> None:
    served = app_daemon.call("GET", "/api/v2/openapi.json").json()
    checked_in = json.loads((EXAMPLE.parent.parent / "schemas" / "openapi.json").read_text())
    assert served == checked_in
    assert served["openapi"] == "3.1.0"
    tools = served["paths"]["/api/v2/apps/tools"]["get"]
    assert {p["name"] for p in tools["parameters"]} == {"workspaceId", "installId"}


# --- load limits (their own apps) -------------------------------------------------------------


def test_rate_limit_is_429_with_retry_after(toolchain_dir: Path) -> None:
    with in_process(toolchain_dir, rate_limit_burst="3", rate_limit_per_second="0.5") as d:
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


def test_unexpected_error_is_500_without_a_stack(toolchain_dir: Path, tmp_path: Path) -> None:
    with in_process(toolchain_dir) as d:
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
