"""Leases judged by the database's clock (docs/SCALING.md, *A node that dies*): real
`runnerd serve` nodes on a throwaway PostgreSQL of this module's own (stopped and started
again by the outage test), reached through HTTP. After an outage longer than the lease, a
node frozen past it, a node whose clock is a minute off or a node killed with a run in
flight, the rows, the ledger, the budget and the audit chain agree, and no run that
succeeded is recorded otherwise."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from conftest import AppDir, run_cli, upload_version, write_app
from daemon import Daemon, running_daemon, running_nodes, wait_until
from pg_cluster import PgCluster
from runnerd.govern.results import RUN_INTERRUPTED
from runnerd.ids import stamp
from runnerd.limits import NODE_ROW_RETENTION_S
from runnerd.run.toolchain import Toolchain
from runnerd.store import Store
from runnerd.upload.walk import read_app_dir
from test_governance import gov_app

pytestmark = pytest.mark.jail

LEASE_S = 3.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    own = PgCluster()  # of this module alone: the outage test stops it
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="module")
def nodes(
    cluster: PgCluster, toolchain_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Daemon, Daemon, str]]:
    with running_nodes(
        toolchain_dir, cluster.new_database(), node_lease_s=str(LEASE_S), warm_jails="0"
    ) as (a, b):
        yield a, b, a.ship(gov_app(tmp_path_factory.mktemp("gov")))["installId"]


def sql(node: Daemon, text: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(node.env["RUNNERD_DATABASE_URL"], autocommit=True) as conn:
        cur = conn.execute(text.encode(), args)
        return cur.fetchall() if cur.description is not None else []


def in_background(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[Any]]:
    """``call`` in a thread of its own; its answer (or transport error) lands in the list."""
    answers: list[Any] = []

    def go() -> None:
        try:
            answers.append(call())
        except httpx.TransportError as error:
            answers.append(error)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, answers


def running_on(node: Daemon, count: int) -> list[str]:
    """Ids of the ``count`` runs of ``node``'s process that are running now (waited for)."""
    for _ in range(400):
        found = sql(
            node,
            "SELECT r.id FROM runs r JOIN nodes n ON n.id = r.node_id "
            "WHERE r.status = 'running' AND n.pid = %s ORDER BY r.id",
            serve_pid(node),
        )
        if len(found) >= count:
            return [row[0] for row in found]
        time.sleep(0.05)
    raise AssertionError(f"{count} run(s) did not start on node {node.port}")


def serve_pid(node: Daemon) -> int:
    """The pid of ``node``'s `runnerd serve` (under faketime, a child of the wrapper)."""
    pid = node.proc.pid
    for _ in range(3):
        if b"serve" in Path(f"/proc/{pid}/cmdline").read_bytes() and b"faketime" not in (
            Path(f"/proc/{pid}/cmdline").read_bytes()
        ):
            return pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pid = int(children[0])
    return pid


def status_of(node: Daemon, run_id: str) -> tuple[str, str | None, int | None]:
    [row] = sql(node, "SELECT status, error_kind, duration_ms FROM runs WHERE id = %s", run_id)
    return row[0], row[1], row[2]


def books_agree(node: Daemon, install_id: str) -> None:
    """Every ended run of the install has one ledger row of its own duration, the month's
    budget use is their sum with nothing reserved, and the audit chain verifies."""
    store = node.store()
    try:
        runs = {r.id: r for r in store.list_runs(install_id, limit=500)}
        assert all(r.status != "running" for r in runs.values()), runs
        ledger = store.ledger(install_id=install_id)
        assert sorted(row["run_id"] for row in ledger) == sorted(runs)
        for row in ledger:
            assert row["sandbox_ms"] == runs[row["run_id"]].duration_ms, row
        budget = store.budget(install_id)
        assert budget.reserved_ms == 0
        assert budget.used_ms == sum(row["sandbox_ms"] for row in ledger)
        assert store.verify_audit()[1] is None
    finally:
        store.close()
    done = run_cli("audit", "verify", env=node.client_env())
    assert done.returncode == 0, done.stdout + done.stderr


def corrections(node: Daemon, run_id: str) -> list[Any]:
    store = node.store()
    try:
        entries = store.audit_entries(action="run.corrected", limit=1000)
    finally:
        store.close()
    return [e for e in entries if e.detail.get("runId") == run_id]


def test_the_lease_rules_between_two_stores_on_one_database(
    cluster: PgCluster, make_app: Callable[..., AppDir], toolchain: Toolchain
) -> None:
    """Two stores as two nodes, without daemons: a lease is the database's now plus its
    length; no node closes another's runs before a whole lease of its own renewals; the
    closed run is billed to its node's last renewal; its node corrects it as it ends."""
    url = cluster.new_database()
    key = os.urandom(32)  # one audit key, as nodes share one
    a, b = Store(url, audit_key=key), Store(url, audit_key=key)
    try:
        ws = a.create_workspace("Acme")
        alice = a.ensure_user("alice@example.com")
        app = make_app()
        app.tool("t")
        version, _ = upload_version(a, read_app_dir(app.root), toolchain=toolchain)
        a.publish(version.id, alice.id, workspace_id=ws.id)
        install = a.create_install(ws.id, version.app_id, version.id, alice.id)
        lease = 1.0
        a.join("a", 1, "test", lease)
        b.join("b", 2, "test", lease)
        [(ahead,)] = sql_url(url, "SELECT lease_until::timestamptz - now() FROM nodes "
                             "WHERE id = %s", b.node_id)  # fmt: skip
        assert timedelta(seconds=0.5) < ahead <= timedelta(seconds=lease), ahead
        run_id = b.start_run(install=install, tool="t", user_id=alice.id, surface="api",
                             timeout_ms=20_000)  # fmt: skip
        time.sleep(lease * 1.2)  # b's lease has run out; a has not renewed since it joined
        assert a.recover_lost_nodes() == []  # a's own contact is not a lease long yet
        for _ in range(4):
            assert a.renew_lease(lease)
            time.sleep(lease / 3)
        assert a.recover_lost_nodes() == [run_id]
        closed = a.get_run(run_id)
        assert closed is not None and (closed.status, closed.error_kind) == (
            "failed",
            "interrupted",
        )
        assert closed.duration_ms == 0  # it started after b's last renewal
        b.finish_run(run_id, status="succeeded", duration_ms=1500)
        b.finish_run(run_id, status="failed", duration_ms=9)  # a second end changes nothing
        row = a.get_run(run_id)
        assert row is not None and (row.status, row.error_kind, row.duration_ms) == (
            "succeeded", None, 1500,
        )  # fmt: skip
        assert [r["sandbox_ms"] for r in a.ledger(install_id=install.id)] == [1500]
        usage = a.budget(install.id)
        assert (usage.used_ms, usage.reserved_ms) == (1500, 0)
        [entry] = a.audit_entries(action="run.corrected")
        assert entry.detail["before"]["status"] == "failed" and entry.detail["runId"] == run_id
        assert a.verify_audit()[1] is None
        assert not b.renew_lease(lease)  # its lease was closed: it serves on, same id
        node = b.node_id
        b.rejoin(lease)
        assert b.node_id == node and b.renew_lease(lease)
    finally:
        a.close()
        b.close()


def sql_url(url: str, text: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(text.encode(), args)
        return cur.fetchall() if cur.description is not None else []


def test_nodes_a_minute_ahead_and_behind_change_nothing_on_the_others(
    nodes: tuple[Daemon, Daemon, str], toolchain_dir: Path
) -> None:
    """A node 60 s ahead used to close every other node's runs at its start (their leases
    looked over on its clock); one 60 s behind wrote a lease already over on theirs. Now
    leases are the database's: both serve beside the others and nothing is closed."""
    if shutil.which("faketime") is None:
        pytest.fail("faketime is missing: scripts/setup installs it")
    a, b, iid = nodes

    def shifted(offset: str) -> Callable[[list[str]], list[str]]:
        # libfaketime shifts the monotonic clock too (left alone, its sleeps fail at -60 s)
        return lambda argv: ["faketime", "-f", offset, *argv]

    in_flight = [in_background(lambda: a.run(iid, "slow", {"ms": 4000}))]
    in_flight.append(in_background(lambda: b.run(iid, "slow", {"ms": 4000})))
    first = running_on(a, 1) + running_on(b, 1)
    with (
        running_daemon(
            toolchain_dir, wrap=shifted("+60s"), join=a, node_lease_s=str(LEASE_S), warm_jails="0"
        ) as ahead,
        running_daemon(
            toolchain_dir, wrap=shifted("-60s"), join=a, node_lease_s=str(LEASE_S), warm_jails="0"
        ) as behind,
    ):
        [(skew,)] = sql(ahead, "SELECT started_at FROM nodes WHERE pid = %s", serve_pid(ahead))
        for node in (ahead, behind):
            in_flight.append(in_background(functools.partial(node.run, iid, "slow", {"ms": 3000})))
        theirs = running_on(ahead, 1) + running_on(behind, 1)
        # Their clocks are shifted indeed: a run's start is stamped by its node.
        for run_id, sign in zip(theirs, (1, -1), strict=True):
            [(at,)] = sql(a, "SELECT started_at FROM runs WHERE id = %s", run_id)
            off = datetime.fromisoformat(at.replace("Z", "+00:00")) - datetime.now(UTC)
            assert 50 < sign * off.total_seconds() < 70, (run_id, at)
        time.sleep(2 * LEASE_S)  # every node has been in touch for a whole lease
        for thread, _ in in_flight:
            thread.join(timeout=30)
        answers = [answer for _, got in in_flight for answer in got]
        assert [r.status_code for r in answers] == [200] * 4, answers
        assert all(r.json()["status"] == "succeeded" for r in answers), [r.text for r in answers]
        for run_id in first + theirs:
            assert status_of(a, run_id)[0] == "succeeded", (run_id, status_of(a, run_id))
        # The leases, in the database's clock: all four nodes live, none closed.
        live = sql(a, "SELECT pid FROM nodes WHERE stopped_at IS NULL AND lease_until::timestamptz"
                   " > now()")  # fmt: skip
        pids = {serve_pid(node) for node in (a, b, ahead, behind)}
        assert pids <= {row[0] for row in live}, live
        # Each node's rows are stamped with the database's time, not its own.
        started = datetime.fromisoformat(skew.replace("Z", "+00:00"))
        assert abs((started - datetime.now(UTC)).total_seconds()) < 30, skew
        # So are the approvals they hold: every node expires one at the same moment.
        for node in (ahead, behind):
            held = node.run(iid, "send", {"to": "skewed"}, surface="chat")
            assert held.status_code == 202, held.text
            [(made,)] = sql(a, "SELECT created_at FROM approvals WHERE id = %s",
                            held.json()["approvalId"])  # fmt: skip
            off = datetime.fromisoformat(made.replace("Z", "+00:00")) - datetime.now(UTC)
            assert abs(off.total_seconds()) < 30, made
    books_agree(a, iid)


def test_a_frozen_node_s_runs_are_closed_then_corrected_by_it(
    nodes: tuple[Daemon, Daemon, str],
) -> None:
    """A node stopped (SIGSTOP) past its lease looks lost: another closes its run as
    interrupted. Resumed, the node still ends that run: it corrects the row, the ledger
    and the budget to the real end, and the audit says so (run.corrected)."""
    a, b, iid = nodes
    thread, answers = in_background(lambda: b.run(iid, "slow", {"ms": 2500}))
    [run_id] = running_on(b, 1)
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: status_of(a, run_id)[0] != "running", 6 * LEASE_S, "a closes b's run")
        closed = status_of(a, run_id)
        assert closed[:2] == ("failed", "interrupted"), closed
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    thread.join(timeout=30)
    assert answers[0].status_code == 200 and answers[0].json()["status"] == "succeeded", answers
    wait_until(lambda: status_of(a, run_id)[0] == "succeeded", 3 * LEASE_S, "b corrects its run")
    _, error_kind, duration_ms = status_of(a, run_id)
    assert error_kind is None and duration_ms is not None and duration_ms >= 2500
    [entry] = corrections(a, run_id)
    assert entry.detail["before"] == {
        "status": "failed", "errorKind": "interrupted", "durationMs": closed[2],
    }  # fmt: skip
    assert entry.detail["after"] == {
        "status": "succeeded", "errorKind": None, "durationMs": duration_ms,
    }  # fmt: skip
    assert (entry.status, entry.duration_ms, entry.install_id) == ("succeeded", duration_ms, iid)
    # b serves on under its own id: its lease is live again, and its runs carry it.
    wait_until(
        lambda: bool(
            sql(
                b,
                "SELECT 1 FROM nodes n JOIN runs r ON r.node_id = n.id "
                "WHERE r.id = %s AND n.stopped_at IS NULL",
                run_id,
            )
        ),
        3 * LEASE_S,
        "b's node row is live again",
    )
    assert b.run(iid, "echo", {"text": "after"}).json()["output"]["echo"] == "after"
    books_agree(a, iid)


def test_a_run_that_ended_while_its_node_was_frozen_is_not_timed_out_nor_billed_the_freeze(
    nodes: tuple[Daemon, Daemon, str], tmp_path: Path
) -> None:
    """A tool of a 2 s timeout ends in 0.3 s while its node is stopped (SIGSTOP) for longer
    than the lease and the timeout: resumed, the node finds the reply waiting in its pipe.
    The run succeeded (its deadline's timer ran late: the daemon was stalled, not the
    tool), its caller gets the output, and it is billed at most its timeout, never the
    freeze; the row another node closed meanwhile is corrected to that."""
    a, b, _ = nodes
    tools = {"quick": "import time\ndef run(i):\n    time.sleep(0.3)\n    return {'done': True}\n"}
    docs = {"quick": {"timeoutMs": 2000}}
    iid = a.ship(write_app(tmp_path, "frozen-quick", tools, docs=docs))["installId"]
    assert b.run(iid, "quick", {}).status_code == 200  # warm
    thread, answers = in_background(lambda: b.run(iid, "quick", {}))
    [run_id] = running_on(b, 1)
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: status_of(a, run_id)[0] != "running", 6 * LEASE_S, "a closes b's run")
        time.sleep(max(0.0, 2.5 - LEASE_S))  # frozen past the tool's timeout too
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    thread.join(timeout=30)
    body = answers[0].json()
    assert (body["status"], body["output"]) == ("succeeded", {"done": True}), body
    assert body["durationMs"] <= 2000 + 50, body  # the timeout, and the checks' moment
    wait_until(lambda: status_of(a, run_id)[0] == "succeeded", 3 * LEASE_S, "b corrects it")
    assert status_of(a, run_id) == ("succeeded", None, body["durationMs"])
    books_agree(a, iid)


def test_a_killed_node_s_run_is_billed_to_its_last_renewal(
    nodes: tuple[Daemon, Daemon, str], toolchain_dir: Path
) -> None:
    """kill -9 with a run in flight: a survivor closes it, billed from its start to the
    dead node's last renewal (not until the survivor noticed), its answer says why; a
    node that joins removes rows of nodes stopped past the retention (every restart adds
    one), and keeps the newer ones."""
    a, _, iid = nodes
    long_ago = stamp(datetime.now(UTC) - timedelta(seconds=NODE_ROW_RETENTION_S + 3600))
    recent = stamp(datetime.now(UTC) - timedelta(seconds=3600))
    for node_id, stopped in (("node_old_gone", long_ago), ("node_recent", recent)):
        sql(a, "INSERT INTO nodes (id, host, pid, version, started_at, lease_until, stopped_at) "
            "VALUES (%s, 'h', 1, '0', %s, %s, %s)", node_id, stopped, stopped, stopped)  # fmt: skip
    with running_daemon(toolchain_dir, join=a, node_lease_s=str(LEASE_S), warm_jails="0") as doomed:
        kept = {row[0] for row in sql(a, "SELECT id FROM nodes")}
        assert "node_old_gone" not in kept and "node_recent" in kept, kept
        thread, _ = in_background(lambda: doomed.run(iid, "slow", {"ms": 15000}))
        [run_id] = running_on(doomed, 1)
        time.sleep(1.5 * LEASE_S)  # a few renewals while it runs
        [(started_at,)] = sql(a, "SELECT started_at FROM runs WHERE id = %s", run_id)
        os.kill(doomed.proc.pid, signal.SIGKILL)
        killed = datetime.now(UTC)
        thread.join(timeout=30)
    wait_until(lambda: status_of(a, run_id)[0] != "running", 4 * LEASE_S + 5, "a closes it")
    answer = a.call("GET", f"/api/v2/runs/{run_id}", a.admin_key)
    assert answer.status_code == 200, answer.text
    detail = answer.json()
    assert (detail["run"]["status"], detail["run"]["errorKind"]) == ("failed", "interrupted")
    assert detail["error"] == RUN_INTERRUPTED and detail["outputAvailable"] is False, detail
    ran_ms = (killed - datetime.fromisoformat(started_at.replace("Z", "+00:00"))) / timedelta(
        milliseconds=1
    )
    billed = detail["run"]["durationMs"]
    # At most what it ran; less by at most a renewal's period (a third of the lease, plus
    # how late a renewal may come on a loaded machine).
    assert ran_ms - LEASE_S * 1000 / 3 - 1500 <= billed <= ran_ms + 50, (billed, ran_ms)
    ended = datetime.fromisoformat(detail["run"]["endedAt"].replace("Z", "+00:00"))
    assert (ended - killed).total_seconds() >= LEASE_S - 1  # noticed a lease later
    books_agree(a, iid)


def test_an_outage_longer_than_the_lease_rewrites_no_run(
    cluster: PgCluster, nodes: tuple[Daemon, Daemon, str]
) -> None:
    """PostgreSQL away for twice the lease while runs go on both nodes: once it is back,
    the first node to renew does not close the other's runs (it waits for a lease of
    contact, in which the other renews). Runs that ended in the outage and runs that end
    after it are recorded as they ended, with their real durations."""
    a, b, iid = nodes
    before = {r[0] for r in sql(a, "SELECT id FROM runs")}
    calls = [in_background(functools.partial(n.run, iid, "slow", {"ms": ms}))
             for n in (a, b) for ms in (1500, int(2 * LEASE_S * 1000) + 5000)]  # fmt: skip
    running_on(a, 2)
    running_on(b, 2)
    cluster.halt()
    time.sleep(2 * LEASE_S)
    cluster.start()
    for thread, _ in calls:
        thread.join(timeout=60)
    answers = [answer for _, got in calls for answer in got]
    assert [r.status_code for r in answers] == [200] * 4, answers
    assert [r.json()["status"] for r in answers] == ["succeeded"] * 4, [r.text for r in answers]
    after = [b.run(iid, "slow", {"ms": 1000}), a.run(iid, "slow", {"ms": 1000})]
    assert all(r.status_code == 200 for r in after), [r.text for r in after]
    ids = {r.json()["runId"] for r in answers + after}

    def all_ended() -> bool:
        found = sql(a, "SELECT status FROM runs WHERE id = ANY(%s)", list(ids))
        return len(found) == 6 and all(row[0] != "running" for row in found)

    wait_until(all_ended, 3 * LEASE_S, "the ends kept in the outage are written")
    time.sleep(LEASE_S)  # a whole lease of contact: nothing more is closed
    rows = sql(a, "SELECT id, status, error_kind, duration_ms FROM runs WHERE id = ANY(%s)",
               list(ids))  # fmt: skip
    assert {row[0] for row in rows} == ids and not ids & before
    assert [(row[1], row[2]) for row in rows] == [("succeeded", None)] * 6, rows
    slept = {r.json()["runId"]: r.json()["output"]["slept"] for r in answers + after}
    for run_id, _, _, duration_ms in rows:
        assert duration_ms >= slept[run_id], (run_id, duration_ms, slept[run_id])
    assert not any(corrections(a, run_id) for run_id in ids)  # nothing had to be put right
    books_agree(a, iid)
