"""The HTTP API through a real `runnerd serve` (uvicorn on a free port, real SQLite, real
nsjail) where tools run: a run's answer and its rows, failures and timeouts, a switch
under a running call, the run queue, warm jails. The rest of the API's contract is in
test_api.py, in process."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLE, write_app
from daemon import Daemon, concurrently, envelope, running_daemon
from test_api import OFFER, versioned_app

pytestmark = pytest.mark.jail
# The tests on the module's daemon run on both stores.
BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="module")
def install(daemon: Daemon) -> dict[str, Any]:
    return daemon.ship(EXAMPLE)


# --- Run a tool -------------------------------------------------------------------------------


@pytest.mark.smoke
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


def test_run_by_reference_records_the_workflow_run(daemon: Daemon, install: dict[str, Any]) -> None:
    member = daemon.person("member@example.com")
    response = daemon.call(
        "POST",
        "/api/v2/apps/tools/deal-desk/route_ticket/run",
        daemon.bound_token(member, "workflow"),  # a workflow's token proves the surface
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


# --- load limits (their own daemons) ----------------------------------------------------------


def test_runs_past_the_queue_are_503(toolchain_dir: Path, tmp_path: Path) -> None:
    with running_daemon(toolchain_dir, max_concurrent_runs="1", max_queued_runs="1") as d:
        iid = d.ship(versioned_app(tmp_path / "q", "1.0.0"))["installId"]
        results = concurrently(4, lambda: d.run(iid, "which", {"ms": 1200}))
        codes = sorted(r.status_code for r in results)
        assert codes.count(200) == 2 and codes.count(503) == 2, codes
        busy = next(r for r in results if r.status_code == 503)
        envelope(busy, 503, "RUN_QUEUE_FULL")
        assert busy.headers["Retry-After"] == "1"


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
    # A fresh /tmp each time, and never root: 1000 in an nsjail, the run's own mapped uid
    # in a child of a Python template.
    assert [o["seen"] for o in outputs] == [False] * 4
    assert all(o["uid"] > 0 for o in outputs), outputs
    # The replies came before the jails ended; each jail still ends, with its sleeper.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        sleepers = [
            p
            for p in Path("/proc").glob("[0-9]*/cmdline")
            if _of_a_run(p) and _uid(p.parent) in range(620000, 620064)
        ]
        if len(sleepers) <= 2:  # only the waiting jails of the pool remain
            break
        time.sleep(0.1)
    assert len(sleepers) <= 2


def _of_a_run(cmdline: Path) -> bool:
    """Whether the process is a run's (a jail's harness, a template's child or what it
    started), not a template itself (whose parent is its nsjail)."""
    own = _read(cmdline)
    if b"template_py" not in own:  # a template's argv names the harness too
        return b"harness_py" in own
    status = _read(cmdline.parent / "status").decode().splitlines()
    parent = next((line.split()[1] for line in status if line.startswith("PPid:")), "0")
    return b"nsjail" not in _read(Path("/proc") / parent / "cmdline")


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
