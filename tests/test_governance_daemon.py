"""Governance through a real daemon, where tools run: secrets in runs, budgets, the
ledger, the audit trail, approvals that release runs, idempotency, run history, the CLI,
and nothing lost on a kill -9. What is decided before any run is in test_governance.py,
in process."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import RUNNERD, run_cli
from daemon import Daemon, concurrently, envelope, running_daemon, serving_again
from test_governance import audit, gov_app, put_secret

pytestmark = pytest.mark.jail
# The tests on the module's daemon run on both stores.
BACKENDS = ("sqlite", "postgresql")

MARKER = "zz-marker-Q7vK2pL9"
DAEMON_SETTINGS = {"approval_ttl_s": "600"}  # as test_governance.py's app has them


@pytest.fixture(scope="module")
def gov(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> tuple[Daemon, dict[str, Any]]:
    return daemon, daemon.ship(gov_app(tmp_path_factory.mktemp("gov")))


# --- secrets ----------------------------------------------------------------------------------


def test_secret_reaches_only_its_own_install(
    gov: tuple[Daemon, dict[str, Any]], tmp_path: Path
) -> None:
    d, install = gov
    assert put_secret(d, install["installId"], "API_TOKEN", "tok-" + "x" * 20).status_code == 200
    run = d.run(install["installId"], "echo", {"text": "hi"}).json()
    assert run["output"] == {"echo": "hi", "secret_len": 24, "leak": None}
    other_ws = d.store().create_workspace("Other").id
    other_admin = d.person("other-admin@example.com", role="admin", workspace_id=other_ws)
    version = d.call("GET", "/api/v2/apps", other_admin, params={"workspaceId": other_ws}).json()[
        "data"
    ][0]["versions"][0]
    other = d.call(
        "POST",
        "/api/v2/apps/installs",
        other_admin,
        params={"workspaceId": other_ws},
        json={"appSlug": "gov", "version": version["version"]},
    ).json()
    seen = d.run(other["installId"], "echo", {"text": "x"}, key=other_admin).json()
    assert seen["output"]["secret_len"] == 0
    leaked = d.run(install["installId"], "echo", {"leak": True}).json()
    assert leaked["status"] == "failed" and leaked["output"] is None
    assert leaked["error"] == "output withheld: it contains the value of the secret API_TOKEN"


def test_the_cipher_is_loaded_only_where_there_are_secrets(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    """The cipher (about 6 MB of an idle daemon) is not in a daemon whose installs have no
    secrets; the first secret loads it, and a daemon started on a store holding secrets
    loads it at start, not in its first call."""

    def cipher_in(pid: int) -> bool:
        return "cryptography" in Path(f"/proc/{pid}/maps").read_text()

    with running_daemon(toolchain_dir, warm_jails="0") as d:
        iid = d.ship(gov_app(tmp_path))["installId"]
        assert d.run(iid, "echo", {"text": "a"}).json()["output"]["secret_len"] == 0
        assert not cipher_in(d.proc.pid)
        assert put_secret(d, iid, "API_TOKEN", "tok-" + "c" * 20).status_code == 200
        assert cipher_in(d.proc.pid)
        assert d.run(iid, "echo", {"text": "b"}).json()["output"]["secret_len"] == 24
        d.proc.terminate()
        d.proc.wait(timeout=20)
        with serving_again(d) as restart:
            assert cipher_in(restart.pid)
            assert d.run(iid, "echo", {"text": "c"}).json()["output"]["secret_len"] == 24


def test_cli_sets_a_secret_from_stdin_and_the_key_rotates(
    gov: tuple[Daemon, dict[str, Any]],
) -> None:
    d, install = gov
    env = d.client_env()
    value = "cli-secret-" + "v" * 13
    proc = subprocess.run(
        [RUNNERD, "app", "secrets", "set", "API_TOKEN", "--app", "gov"],
        input=value + "\n",
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("set API_TOKEN at "), proc.stderr
    assert value not in " ".join(proc.args)
    key_file = d.data_dir / "secrets.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    before = key_file.read_text()
    rotated = subprocess.run(
        [RUNNERD, "admin", "rotate-secrets-key", "--json"], capture_output=True, text=True, env=env
    )
    assert rotated.returncode == 0, rotated.stderr
    assert key_file.read_text() != before
    run = d.run(install["installId"], "echo", {}).json()
    assert run["output"]["secret_len"] == len(value)  # the daemon reads the rotated key
    if "RUNNERD_DATABASE_URL" in d.env:  # PostgreSQL: what the store holds, sealed
        store = d.store()
        sealed = store.sealed_secrets(install["installId"])
        store.close()
        assert sealed and all(value.encode() not in row[4] for row in sealed)
    else:
        assert value.encode() not in (d.data_dir / "runnerd.db").read_bytes()


# --- budgets, ledger ----------------------------------------------------------------------------


def test_every_run_is_metered_at_least_a_millisecond(gov: tuple[Daemon, dict[str, Any]]) -> None:
    """A warm run can take under a millisecond: its duration is rounded up, never to a
    free 0, and the budget meters exactly what the runs report."""
    d, install = gov
    iid = install["installId"]
    before = d.call("GET", f"/api/v2/apps/installs/{iid}/budget", d.admin_key).json()["usedMs"]
    durations = []
    for _ in range(5):
        time.sleep(0.2)  # a waiting jail for each call
        run = d.run(iid, "echo", {})
        assert run.status_code == 200, run.text
        durations.append(run.json()["durationMs"])
    after = d.call("GET", f"/api/v2/apps/installs/{iid}/budget", d.admin_key).json()["usedMs"]
    assert min(durations) >= 1, durations
    assert after - before == sum(durations)


def test_budget_refuses_when_spent_and_concurrent_calls_cannot_overshoot(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    with running_daemon(toolchain_dir) as d:
        iid = d.ship(gov_app(tmp_path))["installId"]
        assert (
            d.call("GET", f"/api/v2/apps/installs/{iid}/budget", d.admin_key).json()["monthlyMs"]
            is None
        )  # unlimited by default
        member = d.person("budget-member@example.com")
        envelope(
            d.call("PUT", f"/api/v2/apps/installs/{iid}/budget", member, json={"monthlyMs": 5}),
            403,
            "INSUFFICIENT_WORKSPACE_ROLE",
        )
        d.call("PUT", f"/api/v2/apps/installs/{iid}/budget", d.admin_key, json={"monthlyMs": 1000})
        results = concurrently(4, lambda: d.run(iid, "slow", {"ms": 600}))
        codes = sorted(r.status_code for r in results)
        assert codes == [200, 403, 403, 403], codes  # the first reserved its 20 s timeout
        refused = next(r for r in results if r.status_code == 403)
        error = envelope(refused, 403, "budget_exhausted")
        budget = d.call("GET", f"/api/v2/apps/installs/{iid}/budget", d.admin_key).json()
        assert error["details"]["resetsAt"] == budget["resetsAt"]
        assert budget["resetsAt"].endswith("-01T00:00:00.000Z")
        assert budget["reservedMs"] == 0 and 600 <= budget["usedMs"] < 1000
        # Not spent yet (used < 1000): one more run is admitted and spends it.
        assert d.run(iid, "slow", {"ms": 500}).status_code == 200
        envelope(d.run(iid, "echo", {}), 403, "budget_exhausted")
        d.call("PUT", f"/api/v2/apps/installs/{iid}/budget", d.admin_key, json={"monthlyMs": None})
        assert d.run(iid, "echo", {}).status_code == 200
        reasons = [e["reason"] for e in audit(d, action="tool.refuse")]
        assert reasons.count("budget_exhausted") == 4
        changes = [e["detail"]["monthlyMs"] for e in audit(d, action="budget.set")]
        assert changes == [1000, None]


def test_ledger_has_one_row_per_run_with_its_payer(gov: tuple[Daemon, dict[str, Any]]) -> None:
    d, install = gov
    iid = install["installId"]
    direct = d.run(iid, "slow", {"ms": 1}).json()
    workflow = d.call(
        "POST",
        "/api/v2/apps/tools/gov/slow/run",
        d.bound_token(d.admin_key, "workflow"),  # a workflow's token proves the surface
        params={"workspaceId": d.workspace_id},
        json={"input": {"ms": 1}, "surface": "workflow", "workflowRunId": "wfr_ledger"},
    ).json()
    month = time.strftime("%Y-%m", time.gmtime())
    rows = d.call(
        "GET",
        "/api/v2/ledger",
        d.admin_key,
        params={"workspaceId": d.workspace_id, "month": month, "installId": iid},
    ).json()["data"]
    by_run = {r["runId"]: r for r in rows}
    mine = by_run[direct["runId"]]
    assert (mine["kind"], mine["payerKind"], mine["payerId"]) == (
        "app-tool",
        "workspace",
        d.workspace_id,
    )
    assert mine["sandboxMs"] == direct["durationMs"] and mine["tool"] == "slow"
    assert (mine["appId"], mine["installId"], mine["versionId"]) == (
        install["appId"],
        iid,
        install["versionId"],
    )
    assert by_run[workflow["runId"]]["payerKind"] == "workflow_run"
    by_payer = d.call(
        "GET",
        "/api/v2/ledger",
        d.admin_key,
        params={"workspaceId": d.workspace_id, "payer": "wfr_ledger"},
    ).json()
    assert [r["runId"] for r in by_payer["data"]] == [workflow["runId"]]
    member = d.person("ledger-member@example.com")
    envelope(
        d.call("GET", "/api/v2/ledger", member, params={"workspaceId": d.workspace_id}),
        403,
        "INSUFFICIENT_WORKSPACE_ROLE",
    )
    export = subprocess.run(
        [RUNNERD, "ledger", "export", "--month", month, "--format", "csv"],
        capture_output=True,
        text=True,
        env=d.env,
        check=True,
    )
    exported = list(csv.DictReader(io.StringIO(export.stdout)))
    assert direct["runId"] in {r["run_id"] for r in exported}
    as_json = json.loads(
        subprocess.run(
            [RUNNERD, "ledger", "export", "--month", month, "--format", "json"],
            capture_output=True,
            text=True,
            env=d.env,
            check=True,
        ).stdout
    )
    assert {r["run_id"] for r in as_json} == {r["run_id"] for r in exported}


# --- audit --------------------------------------------------------------------------------------


@pytest.mark.smoke
def test_audit_records_runs_refusals_and_management(gov: tuple[Daemon, dict[str, Any]]) -> None:
    d, install = gov
    iid = install["installId"]
    ok = d.run(iid, "echo", {"text": "a"}).json()
    d.run(iid, "nope", {})
    entries = audit(d)
    run_entry = next(e for e in entries if e["detail"].get("runId") == ok["runId"])
    assert (run_entry["action"], run_entry["tool"], run_entry["surface"], run_entry["status"]) == (
        "tool.run",
        "echo",
        "api",
        "succeeded",
    )
    assert run_entry["durationMs"] == ok["durationMs"]
    assert run_entry["actorUserId"] == d.store().ensure_user("ada@example.com").id
    assert (run_entry["installId"], run_entry["versionId"]) == (iid, install["versionId"])
    refusal = [e for e in entries if e["action"] == "tool.refuse" and e["tool"] == "nope"]
    assert refusal and refusal[-1]["reason"] == "TOOL_NOT_FOUND"
    actions = {e["action"] for e in entries}
    assert {"app.deploy", "app.publish", "app.install", "key.create", "member.set"} <= actions
    page = d.call(
        "GET", "/api/v2/audit", d.admin_key, params={"workspaceId": d.workspace_id, "limit": "2"}
    ).json()
    assert len(page["data"]) == 2 and page["nextCursor"] == str(page["data"][1]["seq"])
    after = d.call(
        "GET",
        "/api/v2/audit",
        d.admin_key,
        params={"workspaceId": d.workspace_id, "limit": "2", "cursor": page["nextCursor"]},
    ).json()
    assert after["data"][0]["seq"] > page["data"][1]["seq"]


def test_audit_verify_finds_an_edited_or_deleted_entry(toolchain_dir: Path, tmp_path: Path) -> None:
    with running_daemon(toolchain_dir) as d:
        iid = d.ship(gov_app(tmp_path))["installId"]
        for _ in range(3):
            d.run(iid, "echo", {})
        verify = [RUNNERD, "audit", "verify", "--json"]
        intact = json.loads(
            subprocess.run(verify, capture_output=True, text=True, env=d.env, check=True).stdout
        )
        assert intact["firstBroken"] is None and intact["entries"] > 8
        db = sqlite3.connect(d.data_dir / "runnerd.db")
        target = db.execute(
            "SELECT seq FROM audit WHERE action = 'tool.run' ORDER BY seq LIMIT 1"
        ).fetchone()[0]
        db.execute("UPDATE audit SET status = 'failed' WHERE seq = ?", [target])
        db.commit()
        edited = subprocess.run(verify, capture_output=True, text=True, env=d.env)
        assert edited.returncode == 1
        assert json.loads(edited.stdout)["firstBroken"] == target
        db.execute("UPDATE audit SET status = 'succeeded' WHERE seq = ?", [target])
        db.execute("DELETE FROM audit WHERE seq = ?", [target + 1])
        db.commit()
        deleted = json.loads(
            subprocess.run(verify, capture_output=True, text=True, env=d.env).stdout
        )
        assert deleted["firstBroken"] == target + 2
        last = db.execute("SELECT MAX(seq) FROM audit").fetchone()[0]
        db.execute("DELETE FROM audit WHERE seq >= ?", [target + 2])
        db.commit()
        db.close()
        tail = json.loads(subprocess.run(verify, capture_output=True, text=True, env=d.env).stdout)
        assert tail["firstBroken"] == target + 1 and last > target


# --- approvals ----------------------------------------------------------------------------------


def test_write_tool_from_chat_waits_for_the_person_who_asked(
    gov: tuple[Daemon, dict[str, Any]],
) -> None:
    d, install = gov
    iid = install["installId"]
    asker = d.person("asker@example.com")
    pending = d.run(iid, "send", {"to": "bob"}, key=asker, surface="chat")
    assert pending.status_code == 202
    body = pending.json()
    assert set(body) == {"status", "approvalId", "expiresAt"}
    assert body["status"] == "pending_approval"
    other = d.person("other-member@example.com")
    envelope(
        d.call("POST", f"/api/v2/approvals/{body['approvalId']}/approve", other),
        403,
        "NOT_AN_APPROVER",
    )
    approved = d.call("POST", f"/api/v2/approvals/{body['approvalId']}/approve", asker).json()
    assert approved["status"] == "approved" and approved["runId"]
    envelope(
        d.call("POST", f"/api/v2/approvals/{body['approvalId']}/approve", asker),
        409,
        "APPROVAL_NOT_PENDING",
    )  # one approval releases exactly one run
    detail = d.ended_run(approved["runId"], asker)
    assert detail["run"]["status"] == "succeeded" and detail["output"] == {"sent": "bob"}
    assert detail["run"]["approvalId"] == body["approvalId"]
    assert detail["run"]["surface"] == "chat"
    # api and workflow calls (a workflow's token: the body alone proves no surface) run
    # write tools directly, as app and test calls do: only chat and relay calls wait.
    for surface in ("api", "workflow"):
        direct = d.run(iid, "send", {"to": surface}, surface=surface)
        assert direct.status_code == 200 and direct.json()["output"] == {"sent": surface}
        assert d.ended_run(direct.json()["runId"])["run"]["surface"] == surface


def test_relay_write_needs_an_approver_and_denials_are_audited(
    gov: tuple[Daemon, dict[str, Any]],
) -> None:
    d, install = gov
    iid = install["installId"]
    relay_user = d.person("relay-bot@example.com")
    first = d.run(iid, "send", {"to": "x"}, key=relay_user, surface="relay").json()
    envelope(
        d.call("POST", f"/api/v2/approvals/{first['approvalId']}/approve", relay_user),
        403,
        "NOT_AN_APPROVER",
    )
    store = d.store()
    approver_id = store.ensure_user("approver@example.com").id
    store.set_membership(
        d.workspace_id, approver_id, role="member", apps_access=True, approver=True
    )
    approver = store.create_key(kind="personal", user_id=approver_id)[1]
    store.close()
    denied = d.call("POST", f"/api/v2/approvals/{first['approvalId']}/deny", approver).json()
    assert denied["status"] == "denied" and denied["runId"] is None
    second = d.run(iid, "send", {"to": "y"}, key=relay_user, surface="relay").json()
    assert (
        d.call("POST", f"/api/v2/approvals/{second['approvalId']}/approve", approver).json()[
            "status"
        ]
        == "approved"
    )
    decisions = [(e["action"], e["detail"]["approvalId"]) for e in audit(d, action="approval")]
    assert ("approval.deny", first["approvalId"]) in decisions
    assert ("approval.approve", second["approvalId"]) in decisions
    listed = d.call(
        "GET",
        "/api/v2/approvals",
        approver,
        params={"workspaceId": d.workspace_id, "status": "denied"},
    ).json()
    assert first["approvalId"] in [a["approvalId"] for a in listed["data"]]


# --- idempotency --------------------------------------------------------------------------------


def test_idempotency_key_returns_the_first_run_and_charges_once(
    gov: tuple[Daemon, dict[str, Any]],
) -> None:
    d, install = gov
    iid = install["installId"]
    headers = {"Idempotency-Key": "order-42"}

    def call(value: dict[str, Any]) -> Any:
        return d.call(
            "POST",
            f"/api/v2/apps/installs/{iid}/tools/slow/run",
            d.admin_key,
            json={"input": value},
            headers=headers,
        )

    results = concurrently(3, lambda: call({"ms": 300}))
    bodies = [r.json() for r in results]
    assert all(r.status_code == 200 for r in results)
    assert len({b["runId"] for b in bodies}) == 1
    assert all(b == bodies[0] for b in bodies)
    again = call({"ms": 300}).json()
    assert again == bodies[0]
    ledger = d.call(
        "GET", "/api/v2/ledger", d.admin_key, params={"workspaceId": d.workspace_id}
    ).json()["data"]
    assert [r["runId"] for r in ledger].count(bodies[0]["runId"]) == 1
    assert (
        len([r for r in d.store().list_runs(iid, tool="slow") if r.id == bodies[0]["runId"]]) == 1
    )
    envelope(call({"ms": 301}), 409, "IDEMPOTENCY_KEY_REUSED")


def test_an_idempotency_key_finds_the_call_it_held_for_approval(
    gov: tuple[Daemon, dict[str, Any]],
) -> None:
    """A relay retrying a held write call with its Idempotency-Key gets the same approval
    (not a second one to decide), then the run it released; after a denial the retry
    asks again."""
    d, install = gov
    iid = install["installId"]

    def send(key: str, to: str) -> Any:
        return d.call(
            "POST", f"/api/v2/apps/installs/{iid}/tools/send/run",
            d.bound_token(d.admin_key, "relay"),  # a relay's token proves the surface
            json={"input": {"to": to}, "surface": "relay"}, headers={"Idempotency-Key": key},
        )  # fmt: skip

    def pending() -> list[str]:
        listed = d.call("GET", "/api/v2/approvals", d.admin_key,
                        params={"workspaceId": d.workspace_id, "status": "pending"})  # fmt: skip
        return [a["approvalId"] for a in listed.json()["data"]]

    first = send("relay-7", "a")
    assert first.status_code == 202, first.text
    held = first.json()["approvalId"]
    again = send("relay-7", "a")
    assert again.status_code == 202 and again.json()["approvalId"] == held
    assert pending().count(held) == 1 and len(set(pending())) == len(pending())
    envelope(send("relay-7", "b"), 409, "IDEMPOTENCY_KEY_REUSED")
    approved = d.call("POST", f"/api/v2/approvals/{held}/approve", d.admin_key).json()
    ran = send("relay-7", "a")
    assert ran.status_code == 200 and ran.json()["runId"] == approved["runId"], ran.text
    assert ran.json()["output"] == {"sent": "a"}

    denied_first = send("relay-8", "c").json()["approvalId"]
    d.call("POST", f"/api/v2/approvals/{denied_first}/deny", d.admin_key)
    asked_again = send("relay-8", "c")
    assert asked_again.status_code == 202
    assert asked_again.json()["approvalId"] not in (denied_first, held)


# --- run history --------------------------------------------------------------------------------


def test_run_history_filters_pages_and_latest(gov: tuple[Daemon, dict[str, Any]]) -> None:
    d, install = gov
    iid = install["installId"]
    for _ in range(3):
        d.run(iid, "echo", {})
    page = d.call(
        "GET",
        f"/api/v2/apps/installs/{iid}/runs",
        d.admin_key,
        params={"tool": "echo", "limit": "2"},
    ).json()
    assert len(page["data"]) == 2 and page["nextCursor"] == page["data"][1]["runId"]
    run = page["data"][0]
    assert set(run) >= {
        "runId",
        "tool",
        "version",
        "status",
        "durationMs",
        "surface",
        "userId",
        "userEmail",
        "startedAt",
    }
    assert "input" not in run and "output" not in run
    assert run["userEmail"] == "ada@example.com"
    older = d.call(
        "GET",
        f"/api/v2/apps/installs/{iid}/runs",
        d.admin_key,
        params={"tool": "echo", "limit": "2", "cursor": page["nextCursor"]},
    ).json()
    assert older["data"][0]["runId"] < page["data"][1]["runId"]
    failed = d.call(
        "GET", f"/api/v2/apps/installs/{iid}/runs", d.admin_key, params={"status": "failed"}
    ).json()["data"]
    assert all(r["status"] == "failed" for r in failed)
    latest = d.call(
        "GET", f"/api/v2/apps/installs/{iid}/runs/latest", d.admin_key, params={"perTool": "2"}
    ).json()["data"]
    assert len(latest["echo"]) == 2 and latest["echo"][0]["runId"] == page["data"][0]["runId"]


# --- nothing recorded, nothing lost -------------------------------------------------------------


def test_no_input_output_or_secret_byte_is_on_disk(toolchain_dir: Path, tmp_path: Path) -> None:
    with running_daemon(toolchain_dir) as d:
        iid = d.ship(gov_app(tmp_path))["installId"]
        put_secret(d, iid, "API_TOKEN", MARKER + "-secret")
        for tool, value in (
            ("echo", {"text": MARKER + "-input"}),
            ("send", {"to": MARKER}),
            ("echo", {"leak": True, "text": MARKER}),
        ):
            d.run(iid, tool, value, headers={"Idempotency-Key": "k-" + tool})
        d.run(iid, "send", {"to": MARKER}, surface="chat")  # held for approval, in memory
        d.run(iid, "nope", {"text": MARKER})  # refused
        d.proc.send_signal(signal.SIGTERM)
        d.proc.wait(timeout=20)
        found = []
        for path in d.data_dir.rglob("*"):
            if path.is_file() and MARKER.encode() in path.read_bytes():
                found.append(str(path))
        assert found == []
        assert (d.data_dir / "runnerd.db-wal").exists() or (d.data_dir / "runnerd.db").exists()


def test_kill_9_during_a_run_leaves_its_rows_and_the_restart_closes_them(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    with running_daemon(toolchain_dir) as d:
        iid = d.ship(gov_app(tmp_path))["installId"]
        d.call(
            "PUT", f"/api/v2/apps/installs/{iid}/budget", d.admin_key, json={"monthlyMs": 600_000}
        )

        def doomed_call() -> None:
            with contextlib.suppress(httpx.TransportError):  # the daemon dies under it
                d.run(iid, "slow", {"ms": 5000})

        thread = threading.Thread(target=doomed_call, daemon=True)
        thread.start()
        time.sleep(1.0)
        store = d.store()
        [running] = store.list_runs(iid, status="running")
        assert store.budget(iid).reserved_ms == 20000
        store.close()
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(timeout=10)
        with serving_again(d):
            store = d.store()
            row = store.get_run(running.id)
            assert row is not None
            assert (row.status, row.error_kind) == ("failed", "interrupted")
            assert row.duration_ms is not None and 900 <= row.duration_ms <= 20000
            ledger = store.ledger(install_id=iid)
            assert [r["sandbox_ms"] for r in ledger if r["run_id"] == running.id] == [
                row.duration_ms
            ]
            entries = store.audit_entries(install_id=iid, action="tool.run")
            closing = [e for e in entries if e.detail.get("runId") == running.id]
            assert [(e.status, e.reason) for e in closing] == [("failed", "interrupted")]
            budget = store.budget(iid)
            assert budget.reserved_ms == 0 and budget.used_ms >= row.duration_ms
            assert store.verify_audit()[1] is None
            store.close()
            detail = d.call("GET", f"/api/v2/runs/{running.id}", d.admin_key).json()
            assert detail["run"]["errorKind"] == "interrupted"


def test_governance_from_the_cli(gov: tuple[Daemon, dict[str, Any]]) -> None:
    d, _ = gov
    env = d.client_env()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=env)

    assert cli("app", "budget", "set", "--app", "gov", "--ms", "900000").stdout.startswith(
        "budget 900,000 ms; "
    )
    shown = json.loads(cli("app", "budget", "show", "--app", "gov", "--json").stdout)
    assert shown["monthlyMs"] == 900000
    cli("app", "budget", "set", "--app", "gov", "--unlimited")
    # A chat client's token: the CLI's own personal key proves no chat.
    chat = {**env, "RUNNERD_API_KEY": d.bound_token(d.admin_key, "chat")}
    waiting = run_cli("tools", "run", "gov/send", "--input", '{"to": "cli"}', env=chat)
    assert waiting.returncode == 0 and waiting.stdout.startswith("waiting for approval apr_")
    approval_id = waiting.stdout.split()[3]
    listed = cli("approvals", "list", "--status", "pending")
    assert approval_id in listed.stdout
    approved = cli("approvals", "approve", approval_id)
    assert approved.stdout.startswith(f"approved {approval_id}; run run_")
    run_id = approved.stdout.split()[-1]
    for _ in range(100):
        got = json.loads(cli("runs", "get", run_id, "--json").stdout)
        if got["run"]["status"] != "running":
            break
        time.sleep(0.05)
    assert got["output"] == {"sent": "cli"}
    history = cli("runs", "list", "--app", "gov", "--tool", "send")
    assert run_id in history.stdout and "chat" in history.stdout
    denied = cli("approvals", "deny", approval_id)
    assert denied.returncode == 1 and "APPROVAL_NOT_PENDING" in denied.stderr
    names = cli("app", "secrets", "list", "--app", "gov")
    assert names.returncode == 0


def test_run_output_is_only_for_the_asker_and_admins(gov: tuple[Daemon, dict[str, Any]]) -> None:
    d, install = gov
    asker = d.person("asker2@example.com")
    other = d.person("curious@example.com")
    run = d.run(install["installId"], "echo", {"text": "mine"}, key=asker).json()
    mine = d.call("GET", f"/api/v2/runs/{run['runId']}", asker).json()
    assert mine["outputAvailable"] and mine["output"]["echo"] == "mine"
    theirs = d.call("GET", f"/api/v2/runs/{run['runId']}", other).json()
    assert (theirs["outputAvailable"], theirs["output"]) == (False, None)
    assert theirs["run"]["status"] == "succeeded"
    admin = d.call("GET", f"/api/v2/runs/{run['runId']}", d.admin_key).json()
    assert admin["output"]["echo"] == "mine"


def test_approving_on_a_spent_budget_keeps_the_approval_pending(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    with running_daemon(toolchain_dir) as d:
        iid = d.ship(gov_app(tmp_path))["installId"]
        pending = d.run(iid, "send", {"to": "later"}, surface="chat").json()
        budget = f"/api/v2/apps/installs/{iid}/budget"
        d.call("PUT", budget, d.admin_key, json={"monthlyMs": 0})
        approve = f"/api/v2/approvals/{pending['approvalId']}/approve"
        envelope(d.call("POST", approve, d.admin_key), 403, "budget_exhausted")
        listed = d.call(
            "GET", "/api/v2/approvals", d.admin_key, params={"workspaceId": d.workspace_id}
        ).json()["data"]
        assert [a["status"] for a in listed] == ["pending"]
        d.call("PUT", budget, d.admin_key, json={"monthlyMs": None})
        approved = d.call("POST", approve, d.admin_key).json()
        assert approved["status"] == "approved" and approved["runId"]
