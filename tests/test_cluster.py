"""Two real `runnerd serve` nodes on one PostgreSQL database (a throwaway cluster, see
tests/pg_cluster.py), each reached through HTTP: every rule that holds for one daemon
holds across them."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from conftest import RUNNERD, run_cli, write_app
from daemon import Daemon, envelope, free_port, running_daemon, running_nodes
from pg_cluster import PgCluster
from runnerd.store import MIGRATIONS
from runnerd.store.db import lock_id
from test_governance import gov_app

pytestmark = pytest.mark.jail

LEASE_S = "3"


@pytest.fixture(scope="module")
def nodes(
    pg: PgCluster, toolchain_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Daemon, Daemon, dict[str, Any]]]:
    with running_nodes(
        toolchain_dir, pg.new_database(), approval_ttl_s="600", node_lease_s=LEASE_S
    ) as (a, b):
        yield a, b, a.ship(gov_app(tmp_path_factory.mktemp("gov")))


def at_once(*calls: Any) -> list[httpx.Response]:
    """Each call in a thread of its own, started together; their responses in order."""
    results: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def go(i: int) -> None:
        start.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_both_nodes_serve_what_one_deployed(
    nodes: tuple[Daemon, Daemon, dict[str, Any]],
) -> None:
    a, b, install = nodes
    iid = install["installId"]
    for node in (a, b):
        ran = node.run(iid, "echo", {"text": f"via {node.port}"})
        assert ran.status_code == 200, ran.text
        assert ran.json()["output"]["echo"] == f"via {node.port}"
    # A secret set through one node is injected into a run on the other (one shared key).
    put = b.call("PUT", f"/api/v2/apps/installs/{iid}/secrets/API_TOKEN", b.admin_key,
                 json={"value": "s3cret-across-nodes"})  # fmt: skip
    assert put.status_code in (200, 204), put.text
    assert a.run(iid, "echo", {}).json()["output"]["secret_len"] == len("s3cret-across-nodes")


def test_a_budget_for_one_run_admits_exactly_one_across_nodes(
    nodes: tuple[Daemon, Daemon, dict[str, Any]],
) -> None:
    a, b, install = nodes
    iid = install["installId"]
    used = a.call("GET", f"/api/v2/apps/installs/{iid}/budget", a.admin_key).json()["usedMs"]
    budget_url = f"/api/v2/apps/installs/{iid}/budget"
    b.call("PUT", budget_url, b.admin_key, json={"monthlyMs": used + 1000})
    results = at_once(*(lambda n=n: n.run(iid, "slow", {"ms": 600}) for n in (a, b, a, b)))
    codes = sorted(r.status_code for r in results)
    assert codes == [200, 403, 403, 403], codes  # the first reserved its 20 s timeout
    for refused in (r for r in results if r.status_code == 403):
        envelope(refused, 403, "budget_exhausted")
    budget = a.call("GET", budget_url, a.admin_key).json()
    assert budget["reservedMs"] == 0 and 600 <= budget["usedMs"] - used < 1000
    a.call("PUT", budget_url, a.admin_key, json={"monthlyMs": None})


def test_one_idempotency_key_sent_to_both_nodes_gives_one_run(
    nodes: tuple[Daemon, Daemon, dict[str, Any]],
) -> None:
    a, b, install = nodes
    iid = install["installId"]

    def call(node: Daemon) -> httpx.Response:
        path = f"/api/v2/apps/installs/{iid}/tools/slow/run"
        return node.call("POST", path, node.admin_key, json={"input": {"ms": 300}},
                         headers={"Idempotency-Key": "order-77"})  # fmt: skip

    results = at_once(lambda: call(a), lambda: call(b), lambda: call(a), lambda: call(b))
    assert all(r.status_code == 200 for r in results), [r.text for r in results]
    run_ids = {r.json()["runId"] for r in results}
    assert len(run_ids) == 1
    ledger = b.call("GET", "/api/v2/ledger", b.admin_key,
                    params={"workspaceId": b.workspace_id}).json()["data"]  # fmt: skip
    assert [row["runId"] for row in ledger].count(run_ids.pop()) == 1


def test_asked_on_one_node_approved_on_the_other_runs_once(
    nodes: tuple[Daemon, Daemon, dict[str, Any]],
) -> None:
    a, b, install = nodes
    iid = install["installId"]
    asker = a.person("cluster-asker@example.com")
    # Asked on one node, decided on the other alone: the input travels sealed in the store.
    first = a.run(iid, "send", {"to": "carol"}, key=asker, surface="chat").json()["approvalId"]
    decided = b.call("POST", f"/api/v2/approvals/{first}/approve", asker)
    assert decided.status_code == 200, decided.text
    assert b.ended_run(decided.json()["runId"], asker)["output"] == {"sent": "carol"}
    pending = a.run(iid, "send", {"to": "bob"}, key=asker, surface="chat")
    assert pending.status_code == 202, pending.text
    approval = pending.json()["approvalId"]
    decisions = at_once(
        lambda: b.call("POST", f"/api/v2/approvals/{approval}/approve", asker),
        lambda: a.call("POST", f"/api/v2/approvals/{approval}/approve", asker),
    )
    assert sorted(r.status_code for r in decisions) == [200, 409], [r.text for r in decisions]
    won, node = next((r, n) for r, n in zip(decisions, (b, a), strict=True) if r.status_code == 200)
    run_id = won.json()["runId"]
    detail = node.ended_run(run_id, asker)  # the output is kept by the node that ran it
    assert detail["run"]["status"] == "succeeded" and detail["output"] == {"sent": "bob"}
    store = a.store()
    try:
        assert [r.id for r in store.list_runs(iid, tool="send") if r.approval_id == approval] == [
            run_id
        ]
    finally:
        store.close()


def test_a_switch_on_one_node_is_what_the_other_runs_next(
    nodes: tuple[Daemon, Daemon, dict[str, Any]], tmp_path: Path
) -> None:
    a, b, _ = nodes
    one = write_app(tmp_path / "v1", "flip", {"which": "def run(i):\n    return {'v': 1}\n"})
    two = write_app(tmp_path / "v2", "flip", {"which": "def run(i):\n    return {'v': 2}\n"})
    iid = a.ship(one)["installId"]
    assert b.run(iid, "which", {}).json()["output"] == {"v": 1}
    version = a.deploy(two).json()["version"]["version"]
    a.call("POST", f"/api/v2/apps/flip/versions/{version}/publish", a.admin_key,
           params={"workspaceId": a.workspace_id})  # fmt: skip
    switched = a.call("POST", "/api/v2/apps/installs", a.admin_key,
                      params={"workspaceId": a.workspace_id},
                      json={"appSlug": "flip", "version": version})  # fmt: skip
    assert switched.status_code in (200, 201), switched.text
    assert b.run(iid, "which", {}).json()["output"] == {"v": 2}


def test_the_audit_chain_verifies_after_writes_from_both_nodes(
    nodes: tuple[Daemon, Daemon, dict[str, Any]],
) -> None:
    a, b, install = nodes
    iid = install["installId"]
    at_once(*(lambda n=n, i=i: n.run(iid, "echo", {"i": i}) for i, n in enumerate([a, b] * 6)))
    done = run_cli("audit", "verify", "--json", env=a.client_env())
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["firstBroken"] is None and report["entries"] > 12, report


def test_a_node_keeps_answering_while_its_writes_wait_for_the_database(
    nodes: tuple[Daemon, Daemon, dict[str, Any]],
) -> None:
    """On PostgreSQL, store work runs off the event loop: while another session holds
    the install's budget lock, two calls wait for it inside the database, and the node
    still answers health checks and reads. Once the lock is free, both calls run."""
    a, _, install = nodes
    iid = install["installId"]
    answers: list[httpx.Response] = []
    calls = [
        threading.Thread(target=lambda: answers.append(a.run(iid, "echo", {"text": "later"})))
        for _ in range(2)
    ]
    waiting_sql = (  # node A's connections waiting for the lock
        "SELECT count(*) FROM pg_locks JOIN pg_stat_activity USING (pid) "
        "WHERE locktype = 'advisory' AND NOT granted AND application_name LIKE %s"
    )
    node_a = [f"runnerd % {a.proc.pid}"]
    with psycopg.connect(a.env["RUNNERD_DATABASE_URL"], autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [lock_id(f"budget:{iid}")])
        for call in calls:
            call.start()
        waiting = 0
        for _ in range(200):  # both calls reach the lock: the loop took the second one
            waiting = holder.execute(waiting_sql, node_a).fetchone()[0]  # type: ignore[index]
            if waiting >= 2:
                break
            time.sleep(0.05)
        assert waiting >= 2, waiting
        quick = httpx.Client(base_url=a.url, timeout=5)
        assert quick.get("/healthz").status_code == 200
        tools = quick.get("/api/v2/apps/tools", headers={"X-API-Key": a.admin_key},
                          params={"workspaceId": a.workspace_id})  # fmt: skip
        assert tools.status_code == 200 and tools.json()["data"], tools.text
        assert answers == []  # still waiting for the lock
        holder.execute("SELECT pg_advisory_unlock(%s)", [lock_id(f"budget:{iid}")])
    for call in calls:
        call.join(timeout=30)
    assert [(r.status_code, r.json()["output"]["echo"]) for r in answers] == [(200, "later")] * 2


def test_runs_of_another_install_never_wait_for_an_install_s_lock(
    nodes: tuple[Daemon, Daemon, dict[str, Any]], tmp_path: Path
) -> None:
    """No lock is shared by every write: while a session holds one install's budget lock
    (as a node frozen in a run's admission would), runs of another install, in the same
    workspace and audit trail, go on at their usual pace on both nodes; the held install's
    runs wait for it."""
    a, b, install = nodes
    iid = install["installId"]
    other = a.ship(write_app(tmp_path, "gov-other", {"echo": "def run(i):\n    return i\n"}))
    oid = other["installId"]
    assert b.run(oid, "echo", {"text": "warm"}).status_code == 200
    held: list[httpx.Response] = []
    call = threading.Thread(target=lambda: held.append(a.run(iid, "echo", {"text": "held"})))
    with psycopg.connect(a.env["RUNNERD_DATABASE_URL"], autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [lock_id(f"budget:{iid}")])
        try:
            call.start()
            for node in (a, b, a, b):
                began = time.monotonic()
                ran = node.run(oid, "echo", {"text": "free"})
                assert ran.status_code == 200 and ran.json()["output"] == {"text": "free"}
                assert time.monotonic() - began < 2, "another install's run did not wait"
            assert held == []  # the held install's run still waits for its lock
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", [lock_id(f"budget:{iid}")])
    call.join(timeout=30)
    assert [r.status_code for r in held] == [200]
    done = run_cli("audit", "verify", "--json", env=a.client_env())
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_killed_node_s_runs_are_closed_by_the_survivor(
    pg: PgCluster, toolchain_dir: Path, nodes: tuple[Daemon, Daemon, dict[str, Any]]
) -> None:
    a, _, install = nodes
    iid = install["installId"]
    with running_daemon(toolchain_dir, join=a, node_lease_s=LEASE_S) as doomed:
        caught: list[Any] = []
        call = threading.Thread(
            target=lambda: caught.append(_swallow(lambda: doomed.run(iid, "slow", {"ms": 15000})))
        )
        call.start()
        run_id = _running_run(a, iid)
        os.kill(doomed.proc.pid, signal.SIGKILL)
        call.join(timeout=30)
    # Polled in the store: GETs would spend the key's rate limit (a node's share of it).
    _ended(a, run_id, within_s=4 * float(LEASE_S) + 5)
    detail = a.call("GET", f"/api/v2/runs/{run_id}", a.admin_key).json()
    assert detail["run"]["status"] == "failed", detail
    assert detail["run"]["errorKind"] == "interrupted", detail
    budget = a.call("GET", f"/api/v2/apps/installs/{iid}/budget", a.admin_key).json()
    assert budget["reservedMs"] == 0
    ledger = a.call("GET", "/api/v2/ledger", a.admin_key,
                    params={"workspaceId": a.workspace_id}).json()["data"]  # fmt: skip
    assert [row["runId"] for row in ledger].count(run_id) == 1
    audit = a.call("GET", "/api/v2/audit", a.admin_key,
                   params={"workspaceId": a.workspace_id, "action": "tool.run",
                           "limit": "1000"}).json()["data"]  # fmt: skip
    assert [e for e in audit if e.get("detail", {}).get("runId") == run_id
            or e.get("runId") == run_id], "the closed run has its audit entry"  # fmt: skip


def _swallow(call: Any) -> Any:
    try:
        return call()
    except httpx.TransportError as error:
        return error


def _ended(node: Daemon, run_id: str, within_s: float) -> None:
    """Wait until the run is no longer running, reading the store."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        store = node.store()
        try:
            row = store.get_run(run_id)
        finally:
            store.close()
        if row is not None and row.status != "running":
            return
        time.sleep(0.1)


def _running_run(node: Daemon, install_id: str) -> str:
    """The id of the install's run that is running now."""
    for _ in range(200):
        store = node.store()
        try:
            running = [r.id for r in store.list_runs(install_id, status="running")]
        finally:
            store.close()
        if running:
            return running[0]
        time.sleep(0.05)
    raise AssertionError("no run started")


def test_backup_says_to_use_pg_dump_and_a_bad_url_is_named(
    nodes: tuple[Daemon, Daemon, dict[str, Any]], tmp_path: Path
) -> None:
    a, _, _ = nodes
    done = run_cli("admin", "backup", "--to", str(tmp_path / "b.db"), env=a.client_env())
    assert done.returncode == 2 and "pg_dump" in done.stderr, done.stderr
    assert not (tmp_path / "b.db").exists()
    bad = run_cli("audit", "verify", env={**a.client_env(),
                  "RUNNERD_DATABASE_URL": "mysql://u:hunter2@db/x"})  # fmt: skip
    assert bad.returncode != 0
    assert "database_url" in bad.stderr and "hunter2" not in bad.stderr, bad.stderr


def _serve_fails(toolchain_dir: Path, tmp_path: Path, env: dict[str, str]) -> str:
    """`runnerd serve` with ``env``: it must exit at startup; its output."""
    data = tmp_path / "node"
    data.mkdir(parents=True)
    done = subprocess.run(
        [RUNNERD, "serve", "--port", str(free_port())],
        env={**os.environ, "RUNNERD_DATA_DIR": str(data),
             "RUNNERD_TOOLCHAIN_DIR": str(toolchain_dir), "RUNNERD_WARM_JAILS": "0", **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_nodes_serve_only_the_schema_they_know_and_migrate_is_the_step(
    pg: PgCluster, toolchain_dir: Path, tmp_path: Path
) -> None:
    url = pg.new_database()
    out = _serve_fails(toolchain_dir, tmp_path / "empty", {"RUNNERD_DATABASE_URL": url})
    assert "is at schema 0" in out and "runnerd admin migrate" in out, out
    migrated = run_cli("admin", "migrate", "--json", env={**os.environ,
                       "RUNNERD_DATABASE_URL": url})  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout) == {
        "database": url, "from": 0,
        "to": len(MIGRATIONS), "latest": len(MIGRATIONS),
    }  # fmt: skip
    again = run_cli("admin", "migrate", env={**os.environ, "RUNNERD_DATABASE_URL": url})
    assert "up to date" in again.stdout
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE runnerd_schema SET version = version + 1")
    out = _serve_fails(toolchain_dir, tmp_path / "newer", {"RUNNERD_DATABASE_URL": url})
    assert "newer than this runnerd knows" in out, out


def test_a_node_with_another_secrets_key_refuses_to_start(
    toolchain_dir: Path, tmp_path: Path, nodes: tuple[Daemon, Daemon, dict[str, Any]]
) -> None:
    a, _, install = nodes
    put = a.call("PUT", f"/api/v2/apps/installs/{install['installId']}/secrets/API_TOKEN",
                 a.admin_key, json={"value": "kept"})  # fmt: skip
    assert put.status_code in (200, 204), put.text
    other = base64.b64encode(os.urandom(32)).decode()
    out = _serve_fails(toolchain_dir, tmp_path, {
        "RUNNERD_DATABASE_URL": a.env["RUNNERD_DATABASE_URL"], "RUNNERD_SECRETS_KEY": other,
    })  # fmt: skip
    assert "sealed with key" in out and "give every node the same key" in out, out
    assert a.run(install["installId"], "echo", {}).json()["output"]["secret_len"] == len("kept")


def test_a_single_node_store_copied_into_postgresql_serves_on(
    pg: PgCluster, toolchain_dir: Path, tmp_path: Path
) -> None:
    """`runnerd admin copy` from a live single node's SQLite file into a new PostgreSQL
    database; a node started on it has the runs, ledger, audit chain, secrets, budget."""
    with running_daemon(toolchain_dir) as single:
        iid = single.ship(gov_app(tmp_path))["installId"]
        single.call("PUT", f"/api/v2/apps/installs/{iid}/secrets/API_TOKEN", single.admin_key,
                    json={"value": "moved-along"})  # fmt: skip
        single.call("PUT", f"/api/v2/apps/installs/{iid}/budget", single.admin_key,
                    json={"monthlyMs": 3_600_000})  # fmt: skip
        for i in range(5):
            assert single.run(iid, "echo", {"text": str(i)}).status_code == 200
        ledger = {"workspaceId": single.workspace_id}
        before = single.call("GET", "/api/v2/ledger", single.admin_key, params=ledger).json()
        url = pg.new_database()
        source = f"sqlite:///{single.data_dir / 'runnerd.db'}"
        # The target from the setting: a password stays off the command line.
        copied = run_cli("admin", "copy", "--from", source, "--json",
                         env={**single.client_env(), "RUNNERD_DATABASE_URL": url})  # fmt: skip
        assert copied.returncode == 0, copied.stderr
        report = json.loads(copied.stdout)
        assert report["rows"]["runs"] == 5 and report["rows"]["ledger"] == 5, report
        again = run_cli("admin", "copy", "--from", source, "--to", url, env=single.client_env())
        assert again.returncode != 0 and "is not empty" in again.stderr, again.stderr
        key = (single.data_dir / "secrets.key").read_text().strip()
        with running_daemon(toolchain_dir, database_url=url, secrets_key=key,
                            join=single) as node:  # fmt: skip
            after = node.call("GET", "/api/v2/ledger", node.admin_key, params=ledger).json()
            assert after == before and len(after["data"]) == 5
            ran = node.run(iid, "echo", {"text": "on postgres"}).json()["output"]
            assert ran == {"echo": "on postgres", "secret_len": len("moved-along"), "leak": None}
            budget = node.call("GET", f"/api/v2/apps/installs/{iid}/budget",
                               node.admin_key).json()  # fmt: skip
            assert budget["monthlyMs"] == 3_600_000 and budget["usedMs"] > 0
            verified = run_cli("audit", "verify", "--json", env=node.client_env())
            assert json.loads(verified.stdout)["firstBroken"] is None, verified.stdout


def test_postgresql_down_is_503_with_retry_after_and_the_node_comes_back(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    cluster = PgCluster()  # a database of its own, to stop and start
    try:
        with running_daemon(toolchain_dir, database_url=cluster.new_database(),
                            node_lease_s="6") as node:  # fmt: skip
            iid = node.ship(gov_app(tmp_path))["installId"]
            assert node.run(iid, "echo", {"text": "up"}).status_code == 200
            # A run that ends while the database is away: its caller gets its result, and
            # its row ends once the database is back.
            answers: list[httpx.Response] = []
            slow = threading.Thread(target=lambda: answers.append(
                node.run(iid, "slow", {"ms": 1500})))  # fmt: skip
            slow.start()
            slow_id = _running_run(node, iid)
            cluster.halt()
            slow.join(timeout=30)
            assert answers[0].status_code == 200, answers[0].text
            assert answers[0].json()["output"] == {"slept": 1500}
            down = node.run(iid, "echo", {"text": "down"})
            error = envelope(down, 503, "DATABASE_UNAVAILABLE")
            assert down.headers["Retry-After"] == "5" and "did not answer" in error["message"]
            assert node.http.get("/readyz").status_code == 503
            cluster.start()
            # Every worker thread's connection went stale with the restart: none may cost
            # a call a 503 once the database is back.
            backs = [node.run(iid, "echo", {"text": "back"}) for _ in range(10)]
            refused = [b.text for b in backs if b.status_code != 200]
            assert not refused, "\n".join(refused)
            statuses: dict[str, str] = {}
            for _ in range(100):
                store = node.store()
                statuses = {r.id: r.status for r in store.list_runs(iid)}
                store.close()
                if statuses.get(slow_id) != "running":
                    break
                time.sleep(0.1)
            assert statuses[slow_id] == "succeeded"
            # No row for the call refused while the database was away.
            assert sorted(statuses.values()) == ["succeeded"] * 12, statuses
    finally:
        cluster.stop()
