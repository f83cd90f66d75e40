"""A node that freezes (SIGSTOP) or whose database connections stop answering cannot hold
the others beyond the bound of docs/SCALING.md (*A node that freezes*): the server ends
its transaction idle past POSTGRES_IDLE_IN_TRANSACTION_S, which frees its locks; a
waiter waits at most POSTGRES_LOCK_TIMEOUT_S, then 503 with Retry-After; its own
``/readyz`` says 503 within READY_STORE_TIMEOUT_S. Two real nodes on one PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from conftest import run_cli, write_app
from daemon import Daemon, envelope, running_nodes, wait_until
from pg_cluster import PgCluster
from runnerd.errors import DatabaseUnavailable
from runnerd.limits import (
    POSTGRES_IDLE_IN_TRANSACTION_S,
    POSTGRES_LOCK_TIMEOUT_S,
    POSTGRES_STATEMENT_TIMEOUT_S,
    READY_STORE_TIMEOUT_S,
)
from runnerd.store import Store
from runnerd.store.db import PostgresDatabase, lock_id
from test_governance import gov_app

pytestmark = pytest.mark.jail

# Long enough that no lease renewal (every lease / 3) queues for the lock in the test's
# window, and that a freeze of a few seconds closes nobody's runs.
LEASE_S = "60"

WAITING = (  # a node's connections waiting for, or holding, an advisory lock
    "SELECT count(*) FROM pg_locks JOIN pg_stat_activity USING (pid) WHERE "
    "locktype = 'advisory' AND granted = %s AND application_name LIKE %s"
)


def _lock_rows(conn: psycopg.Connection[Any], node: Daemon, granted: bool) -> int:
    row = conn.execute(WAITING, [granted, f"runnerd % {node.proc.pid}"]).fetchone()
    return int(row[0]) if row else 0


@pytest.fixture(scope="module")
def nodes(
    pg: PgCluster, toolchain_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Daemon, Daemon, str]]:
    with running_nodes(toolchain_dir, pg.new_database(), node_lease_s=LEASE_S) as (a, b):
        yield a, b, a.ship(gov_app(tmp_path_factory.mktemp("gov")))["installId"]


def test_every_connection_carries_the_bounds_unless_the_database_sets_its_own(
    pg: PgCluster,
) -> None:
    url = pg.new_database()
    Store(url, migrate=True).close()
    db = PostgresDatabase(url)
    try:
        shown = {
            name: db.execute(f"SHOW {name}").fetchone()[0]
            for name in ("idle_in_transaction_session_timeout", "lock_timeout",
                         "statement_timeout")
        }  # fmt: skip
        assert shown == {
            "idle_in_transaction_session_timeout": f"{POSTGRES_IDLE_IN_TRANSACTION_S}s",
            "lock_timeout": f"{POSTGRES_LOCK_TIMEOUT_S}s",
            "statement_timeout": f"{POSTGRES_STATEMENT_TIMEOUT_S}s",
        }
    finally:
        db.close()
    # An operator's own, for the database (or the role, or the URL's options), is kept;
    # `admin migrate` and `admin copy` (a store that migrates) bound no statement.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET lock_timeout = '7s'")  # type: ignore[arg-type]
    migrating = Store(url, migrate=True)
    try:
        assert migrating.db.execute("SHOW lock_timeout").fetchone()[0] == "7s"
        assert migrating.db.execute("SHOW statement_timeout").fetchone()[0] == "0"
    finally:
        migrating.close()


def test_a_holder_that_stops_is_cut_and_a_waiter_gets_503_not_500(pg: PgCluster) -> None:
    url = pg.new_database()
    db = PostgresDatabase(url)
    try:
        # Stopped inside its write transaction (a node frozen between two statements): the
        # server ends the transaction, and the next statement is DATABASE_UNAVAILABLE.
        with pytest.raises(DatabaseUnavailable, match="idle-in-transaction"), db.write():
            db.execute("SELECT 1")
            time.sleep(POSTGRES_IDLE_IN_TRANSACTION_S + 0.5)
            db.execute("SELECT 1")
        assert db.execute("SELECT 1").fetchone()[0] == 1  # a new connection, at once
        # The lock held elsewhere (a session of another kind) past the lock bound.
        with psycopg.connect(url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", [lock_id("budget:x")])
            began = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match="lock timeout"), db.write("budget:x"):
                pass
            waited = time.monotonic() - began
        assert POSTGRES_LOCK_TIMEOUT_S - 0.5 < waited < POSTGRES_LOCK_TIMEOUT_S + 2, waited
        with db.write("budget:x"):  # the lock is free again: the same connection serves on
            db.execute("SELECT 1")
    finally:
        db.close()


def test_a_node_frozen_holding_an_install_s_lock_stalls_the_other_only_within_the_bound(
    nodes: tuple[Daemon, Daemon, str],
) -> None:
    a, b, iid = nodes
    path = f"/api/v2/apps/installs/{iid}/tools/echo/run"
    assert a.run(iid, "echo", {"text": "warm"}).status_code == 200
    assert b.run(iid, "echo", {"text": "warm"}).status_code == 200
    url = a.env["RUNNERD_DATABASE_URL"]
    stuck: list[httpx.Response] = []
    call = threading.Thread(target=lambda: stuck.append(a.run(iid, "echo", {"text": "frozen"})))
    frozen = False
    with psycopg.connect(url, autocommit=True) as watch:
        try:
            # A's call queues for the install's budget lock behind the test's session; A is stopped;
            # the lock passes to A's waiting connection, which now holds it, frozen.
            watch.execute("SELECT pg_advisory_lock(%s)", [lock_id(f"budget:{iid}")])
            call.start()
            wait_until(lambda: _lock_rows(watch, a, granted=False) == 1, 10, "A waits for the lock")
            os.kill(a.proc.pid, signal.SIGSTOP)
            frozen = True
            time.sleep(0.2)
            assert _lock_rows(watch, a, granted=False) == 1  # its one statement in line
            watch.execute("SELECT pg_advisory_unlock(%s)", [lock_id(f"budget:{iid}")])
            wait_until(lambda: _lock_rows(watch, a, granted=True) == 1, 5, "frozen A holds it")
            held = time.monotonic()
            # B's calls: the first waits for the server to cut A's idle transaction, then
            # runs; the ones after it run as usual. Without the bound, they wait for A.
            first = httpx.post(f"{b.url}{path}", headers={"X-API-Key": b.admin_key},
                               json={"input": {"text": "b-0"}}, timeout=15)  # fmt: skip
            waited = time.monotonic() - held
            assert first.status_code == 200, first.text
            assert waited > POSTGRES_IDLE_IN_TRANSACTION_S - 0.5, waited  # it waited for A
            assert waited < POSTGRES_IDLE_IN_TRANSACTION_S + 2.5, waited
            assert _lock_rows(watch, a, granted=True) == 0  # the server ended A's session
            for i in range(1, 4):
                began = time.monotonic()
                ran = b.run(iid, "echo", {"text": f"b-{i}"})
                assert ran.status_code == 200 and ran.json()["output"]["echo"] == f"b-{i}"
                assert time.monotonic() - began < 2, "B runs at its usual pace"
            assert b.http.get("/readyz").status_code == 200
        finally:
            if frozen:
                os.kill(a.proc.pid, signal.SIGCONT)
            call.join(timeout=30)
    # A, woken: the call whose transaction the server ended is refused (503, Retry-After;
    # no run started), and the node serves on at once.
    assert len(stuck) == 1
    error = envelope(stuck[0], 503, "DATABASE_UNAVAILABLE")
    assert stuck[0].headers["Retry-After"] == "5" and "did not answer" in error["message"]
    assert a.http.get("/readyz").status_code == 200
    again = a.run(iid, "echo", {"text": "a-back"})
    assert again.status_code == 200 and again.json()["output"]["echo"] == "a-back"
    _agree(a, iid, runs=7)


def test_a_node_frozen_holding_its_workspace_s_audit_chain_stalls_the_other_only_within_the_bound(
    nodes: tuple[Daemon, Daemon, str], tmp_path: Path
) -> None:
    """The other lock a run takes: its workspace's audit chain, as its end is written. A
    frozen in that moment (its run done in the jail) holds every run's end in the
    workspace, on every node, only until the server cuts its idle transaction; then B
    runs at its pace. A, woken, answers its caller the run's result and writes the run's
    end once the database takes it: nothing lost, nothing billed twice."""
    a, b, _ = nodes
    iid = a.ship(write_app(tmp_path, "frozen-audit", {"echo": "def run(i):\n    return i\n"}))[
        "installId"
    ]
    assert a.run(iid, "echo", {"text": "warm"}).status_code == 200
    assert b.run(iid, "echo", {"text": "warm"}).status_code == 200
    chain = lock_id(f"audit:{a.workspace_id}")
    stuck: list[httpx.Response] = []
    call = threading.Thread(target=lambda: stuck.append(a.run(iid, "echo", {"text": "frozen"})))
    frozen = False
    with psycopg.connect(a.env["RUNNERD_DATABASE_URL"], autocommit=True) as watch:
        try:
            watch.execute("SELECT pg_advisory_lock(%s)", [chain])
            call.start()  # its run ends in the jail, then its end waits for the chain
            wait_until(lambda: _lock_rows(watch, a, granted=False) == 1, 10, "A waits")
            os.kill(a.proc.pid, signal.SIGSTOP)
            frozen = True
            time.sleep(0.2)
            watch.execute("SELECT pg_advisory_unlock(%s)", [chain])
            wait_until(lambda: _lock_rows(watch, a, granted=True) == 1, 5, "frozen A holds it")
            held = time.monotonic()
            first = b.run(iid, "echo", {"text": "b-0"})
            waited = time.monotonic() - held
            assert first.status_code == 200, first.text
            assert waited > POSTGRES_IDLE_IN_TRANSACTION_S - 0.5, waited  # it waited for A
            assert waited < POSTGRES_IDLE_IN_TRANSACTION_S + 2.5, waited
            for i in range(1, 4):
                began = time.monotonic()
                assert b.run(iid, "echo", {"text": f"b-{i}"}).status_code == 200
                assert time.monotonic() - began < 2, "B runs at its usual pace"
        finally:
            if frozen:
                os.kill(a.proc.pid, signal.SIGCONT)
            call.join(timeout=30)
    # A's run happened: its caller has the result, and its end is written once taken.
    assert [r.status_code for r in stuck] == [200], [r.text for r in stuck]
    assert stuck[0].json()["output"] == {"text": "frozen"}
    run_id = stuck[0].json()["runId"]

    def ended() -> bool:
        store = a.store()
        try:
            row = store.get_run(run_id)
            return row is not None and row.status == "succeeded"
        finally:
            store.close()

    wait_until(ended, 30, "A writes the end it kept", every_s=0.2)
    _agree(a, iid, runs=7)


def test_a_node_whose_database_stops_answering_is_not_ready_within_the_bound(
    nodes: tuple[Daemon, Daemon, str],
) -> None:
    """A's own connections stop answering (their server processes stopped: as a cut-off
    network looks from the node): its /readyz says 503 within READY_STORE_TIMEOUT_S, while
    B serves; once they answer again, A is ready and runs."""
    a, b, iid = nodes
    url = a.env["RUNNERD_DATABASE_URL"]
    assert a.http.get("/readyz").status_code == 200
    stopped: set[int] = set()
    cut = threading.Event()

    def stop_a_s_backends(watch: psycopg.Connection[Any]) -> None:
        while not cut.is_set():  # A's connections, and any it makes meanwhile
            for (pid,) in watch.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
                [f"runnerd % {a.proc.pid}"],
            ).fetchall():
                if pid not in stopped:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.add(pid)
            time.sleep(0.01)

    with psycopg.connect(url, autocommit=True) as watch:
        stopper = threading.Thread(target=stop_a_s_backends, args=(watch,))
        stopper.start()
        try:
            wait_until(lambda: len(stopped) > 0, 5, "A's connections stopped")
            began = time.monotonic()
            ready = a.http.get("/readyz")
            took = time.monotonic() - began
            assert ready.status_code == 503, ready.text
            assert "no answer within" in json.dumps(ready.json()), ready.text
            assert READY_STORE_TIMEOUT_S - 0.2 < took < READY_STORE_TIMEOUT_S + 1.5, took
            assert a.http.get("/healthz").status_code == 200  # alive, not ready
            assert b.http.get("/readyz").status_code == 200
            assert b.run(iid, "echo", {"text": "b-alone"}).status_code == 200
        finally:
            cut.set()
            stopper.join(timeout=10)
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
    wait_until(lambda: a.http.get("/readyz").status_code == 200, 10, "A ready again")
    assert a.run(iid, "echo", {"text": "a-again"}).status_code == 200
    _agree(a, iid, runs=9)


def _agree(node: Daemon, iid: str, runs: int) -> None:
    """Rows, ledger and audit agree: ``runs`` runs of the install, all ended, each with one
    ledger row and its audit entry, and `audit verify` passes."""
    store = node.store()
    try:
        rows = store.list_runs(iid)
    finally:
        store.close()
    assert len(rows) == runs and {r.status for r in rows} == {"succeeded"}, rows
    ledger = node.call("GET", "/api/v2/ledger", node.admin_key,
                       params={"workspaceId": node.workspace_id, "limit": "1000"}
                       ).json()["data"]  # fmt: skip
    billed = [row["runId"] for row in ledger]
    assert all(billed.count(r.id) == 1 for r in rows), billed
    audit = node.call("GET", "/api/v2/audit", node.admin_key,
                      params={"workspaceId": node.workspace_id, "action": "tool.run",
                              "limit": "1000"}).json()["data"]  # fmt: skip
    audited = {e.get("detail", {}).get("runId") or e.get("runId") for e in audit}
    assert {r.id for r in rows} <= audited
    done = run_cli("audit", "verify", "--json", env=node.client_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["firstBroken"] is None, done.stdout


def test_a_refused_login_says_so_not_that_the_database_did_not_answer(pg: PgCluster) -> None:
    """A server that answered and refused the login (an unknown role, a database that is
    not there) is told apart from one that did not answer, with what to check."""
    url = pg.new_database()
    name = url.split("@/", 1)[1].split("?", 1)[0]
    for bad in (url.replace(f"/{name}?", "/no_such_db?"), url.replace("//postgres@", "//nobody@")):
        with pytest.raises(ConnectionError, match="refused the login") as refused:
            PostgresDatabase(bad)
        assert "database_url" in str(refused.value) and "did not answer" not in str(refused.value)
