"""The store's cost on each backend: SQLite (one node), and 1, 2 and 3 nodes on one
PostgreSQL, all on this machine.

    .venv/bin/python benchmarks/bench_store.py [--seconds S] [--clients N] [--nodes 3]
                                               [--statements]             (root)

Starts a throwaway PostgreSQL cluster (tests/pg_cluster.py: Debian's binaries, a Unix
socket) with pg_stat_statements loaded, and real `runnerd serve` nodes with the
deal-desk example installed. For each setup: one call's latency (sequential, on the
first node), a list-tools call's latency, and runs per second with N clients calling at
once for S seconds, spread round-robin over the nodes. Baselines from the same run:
bare nsjail + python spawned by N workers (the ceiling of any sandboxed runner here),
and one bare `python3 -I -S -c pass`.

For the PostgreSQL setups, per run of the loaded phase: the statements the server ran
(pg_stat_statements: calls, and their execution time), its transactions
(pg_stat_database), the wait in `pg_advisory_xact_lock` (the store's keyed locks: its
statements' execution time is the wait plus a few microseconds), and, sampled from
`pg_locks` every few milliseconds, how long advisory locks were held (in all, and the
busiest key) and how long anything waited on a row lock. The store's connections per
node (pg_stat_activity by application_name). For every setup, the CPU it used per run:
the machine's (/proc/stat), the nodes' (their processes and the jails they reaped),
PostgreSQL's and the load generator's.

Not a test: it asserts only that runs succeed.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.conninfo import conninfo_to_dict

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from daemon import Daemon, running_daemon  # noqa: E402
from pg_cluster import PgCluster  # noqa: E402
from runnerd.cli.bench import bare_jail  # noqa: E402
from runnerd.config import load_settings  # noqa: E402
from runnerd.run.machine import build_machine  # noqa: E402
from runnerd.run.runtimes import clean_env  # noqa: E402

TOOL, VALUE = "route_ticket", {"subject": "Invoice", "customer_tier": "free"}
# No rate limit in the way of the clients (one key); the default admission (8 at once).
SETTINGS: dict[str, Any] = {"rate_limit_per_second": "100000", "rate_limit_burst": "100000"}
TICK = os.sysconf("SC_CLK_TCK")
# Between two looks at pg_locks: while the clients call, and while one call at a time
# leaves the cores mostly idle (a lock is held for a millisecond or two).
SAMPLE_S, SAMPLE_SEQUENTIAL_S = 0.004, 0.001
BARE_UID = 690000


# --- load -----------------------------------------------------------------------------------


def _latency(call: Callable[[], httpx.Response], count: int) -> float:
    times = []
    for _ in range(count + 1):
        time.sleep(0.05)  # let the warm pool refill
        start = time.perf_counter()
        response = call()
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, response.text
    return statistics.median(times[1:])


def _rate(calls: list[Callable[[], object]], seconds: float) -> tuple[int, float]:
    """Calls completed and the seconds they took, each callable called in a loop by a
    thread of its own."""
    done = [0] * len(calls)
    failed: list[BaseException] = []
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        try:
            while time.monotonic() < stop and not failed:
                calls[i]()
                done[i] += 1
        except BaseException as error:  # the first failure ends the phase: raised below
            failed.append(error)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(calls))]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]
    return sum(done), time.monotonic() - began


def _runner(node: Daemon, install_id: str) -> Callable[[], object]:
    client = httpx.Client(base_url=node.url, timeout=60)
    path = f"/api/v2/apps/installs/{install_id}/tools/{TOOL}/run"

    def call() -> object:
        response = client.post(path, headers={"X-API-Key": node.admin_key}, json={"input": VALUE})
        assert response.status_code == 200 and response.json()["status"] == "succeeded", (
            response.text
        )
        return response

    return call


# --- CPU --------------------------------------------------------------------------------------


def _machine_jiffies() -> tuple[int, int]:
    """(busy, all) jiffies of every core since boot (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def _tree_jiffies(pid: int) -> int:
    """CPU jiffies of ``pid``, the children it reaped (a node's jails, PostgreSQL's ended
    backends) and every live descendant."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError, ValueError):
            stat = Path(f"/proc/{current}/stat").read_text()
            total += sum(int(v) for v in stat.rsplit(")", 1)[1].split()[11:15])
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return total


def _own_jiffies(pid: int | None) -> int:
    if pid is None:
        return 0
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return sum(int(v) for v in stat.rsplit(")", 1)[1].split()[11:13])
    return 0


@dataclass
class Cpu:
    """CPU used between ``start`` and ``stop``, in CPU seconds: the machine's, and the
    parts of it this benchmark started."""

    nodes: list[int]
    postgres: int | None
    sampler: int | None = None  # the backend of Locks: PostgreSQL's, but the benchmark's work
    began: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)

    def _now(self) -> dict[str, float]:
        busy, every = _machine_jiffies()
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {
            "machine": busy / TICK,
            "wall": every / TICK,
            "nodes": sum(_tree_jiffies(p) for p in self.nodes) / TICK,
            "postgres": (_tree_jiffies(self.postgres) - _own_jiffies(self.sampler)) / TICK
            if self.postgres
            else 0.0,
            "load": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
        }

    def start(self) -> None:
        self.began = self._now()

    def stop(self) -> None:
        now = self._now()
        self.used = {k: now[k] - self.began[k] for k in now}
        self.used["other"] = self.used["machine"] - sum(
            self.used[k] for k in ("nodes", "postgres", "load")
        )

    def busy(self) -> float:
        """The machine's busy share of all its cores."""
        return self.used["machine"] / self.used["wall"] if self.used["wall"] else 0.0


# --- PostgreSQL -------------------------------------------------------------------------------


def _signed64(classid: int, objid: int) -> int:
    value = (classid << 32) | objid
    return value - (1 << 64) if value >= 1 << 63 else value


class Locks(threading.Thread):
    """Samples pg_locks (and pg_stat_activity) while the clients call: each look adds
    the time since the last one to every lock it finds held or awaited, and counts each
    node's connections."""

    def __init__(self, admin_url: str, database: str, every_s: float) -> None:
        super().__init__(daemon=True)
        self.every_s = every_s
        self.conn = psycopg.connect(admin_url, autocommit=True)
        self.database = database
        self.held: Counter[int] = Counter()  # advisory key -> seconds held
        self.waited: Counter[str] = Counter()  # lock type -> seconds awaited
        self.connections: dict[str, int] = defaultdict(int)  # application_name -> most open
        self.active: dict[str, int] = defaultdict(int)  # application_name -> most at work
        self.looks = 0
        self._done = threading.Event()

    def run(self) -> None:
        last = time.perf_counter()
        while not self._done.wait(self.every_s):
            rows = self.conn.execute(
                "SELECT locktype, granted, classid::int8, objid::int8, count(*) FROM pg_locks "
                "WHERE pid <> pg_backend_pid() AND (locktype = 'advisory' OR NOT granted) "
                "GROUP BY 1, 2, 3, 4"
            ).fetchall()
            now = time.perf_counter()
            dt, last = now - last, now
            for locktype, granted, classid, objid, count in rows:
                if locktype == "advisory" and granted:
                    self.held[_signed64(classid, objid)] += dt * count
                elif not granted:
                    self.waited[locktype] += dt * count
            self.looks += 1
            if self.looks % 10 == 1:
                self._connections()

    def _connections(self) -> None:
        for name, count, active in self.conn.execute(
            "SELECT application_name, count(*), count(*) FILTER (WHERE state <> 'idle') "
            "FROM pg_stat_activity WHERE datname = %s GROUP BY 1",
            [self.database],
        ).fetchall():
            self.connections[name] = max(self.connections[name], count)
            self.active[name] = max(self.active[name], active)

    def finish(self) -> None:
        self._done.set()
        self.join()
        self._connections()
        self.conn.close()


@dataclass
class PgFigures:
    """What PostgreSQL did for the runs of one loaded phase."""

    statements: list[tuple[str, int, float]]  # query, calls, total ms
    transactions: int
    locks: Locks


class PgStats:
    """pg_stat_statements and pg_stat_database deltas for one database, around a phase."""

    def __init__(self, cluster: PgCluster, url: str) -> None:
        self.admin = cluster.url()
        self.database = str(conninfo_to_dict(url)["dbname"])
        self._xacts = 0
        self._locks: Locks | None = None

    def _transactions(self, conn: psycopg.Connection[Any]) -> int:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            [self.database],
        ).fetchone()
        assert row is not None
        return int(row[0])

    def start(self, every_s: float) -> int:
        """Reset the counters and start sampling; the sampler's backend pid."""
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
            self._xacts = self._transactions(conn)
        self._locks = Locks(self.admin, self.database, every_s)
        self._locks.start()
        return int(self._locks.conn.info.backend_pid)

    def stop(self) -> PgFigures:
        assert self._locks is not None
        self._locks.finish()
        time.sleep(0.6)  # pg_stat_database is sent by each backend at most every 0.5 s
        with psycopg.connect(self.admin, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT query, calls, total_exec_time FROM pg_stat_statements s "
                "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s",
                [self.database],
            ).fetchall()
            xacts = self._transactions(conn) - self._xacts
        return PgFigures([(q, int(c), float(t)) for q, c, t in rows], xacts, self._locks)


def _lock_names(install_id: str, workspace_id: str) -> dict[int, str]:
    """The advisory lock ids of the keys a run can take, by name, as far as this tree's
    store names them (the lock ids are a hash: unknown ones show as numbers)."""
    names: dict[int, str] = {}
    with contextlib.suppress(ImportError):
        from runnerd.store import db

        lock_id = getattr(db, "lock_id", None)
        if lock_id is not None:
            for key in ("config", "nodes", f"budget:{install_id}", f"audit:{workspace_id}",
                        f"audit:{install_id}", "audit", "audit:"):  # fmt: skip
                names[lock_id(key)] = key
    names[0x72756E6E657264] = "the one write lock"  # before keyed locks
    return names


# --- report -----------------------------------------------------------------------------------


@dataclass
class Setup:
    label: str
    run_ms: float
    list_ms: float
    runs: int
    seconds: float
    cpu: Cpu
    nodes: list[Daemon]
    pg: PgFigures | None = None  # the loaded phase
    one_by_one: PgFigures | None = None  # as many sequential calls as for run_ms
    sequential_runs: int = 0

    @property
    def rate(self) -> float:
        return self.runs / self.seconds


def _measure(
    label: str, nodes: list[Daemon], install_id: str, args: argparse.Namespace,
    pg: PgStats | None, postgres: int | None,
) -> Setup:  # fmt: skip
    first = nodes[0]
    run = _latency(lambda: first.run(install_id, TOOL, VALUE), args.latency_runs)
    one_by_one = None
    if pg is not None:  # apart from run_ms: the sampler takes a share of the cores
        pg.start(SAMPLE_SEQUENTIAL_S)
        _latency(lambda: first.run(install_id, TOOL, VALUE), args.latency_runs - 1)
        one_by_one = pg.stop()
    tools = _latency(
        lambda: first.call("GET", "/api/v2/apps/tools", first.admin_key,
                           params={"workspaceId": first.workspace_id}),
        args.latency_runs,
    )  # fmt: skip
    calls = [_runner(nodes[i % len(nodes)], install_id) for i in range(args.clients)]
    sampler = pg.start(SAMPLE_S) if pg is not None else None
    cpu = Cpu([node.proc.pid for node in nodes], postgres, sampler)
    cpu.start()
    runs, seconds = _rate(calls, args.seconds)
    cpu.stop()
    figures = pg.stop() if pg is not None else None
    setup = Setup(label, run, tools, runs, seconds, cpu, nodes, figures, one_by_one,
                  args.latency_runs)  # fmt: skip
    print(f"{label:34} {run:8.1f} {tools:8.1f} {setup.rate:8.0f}   machine {cpu.busy():4.0%} busy")
    return setup


def _pg_row(label: str, figures: PgFigures, runs: int) -> str:
    """One line of per-run figures: statements, transactions, BEGINs, server execution
    ms, advisory lock calls, their wait (pg_stat_statements), advisory locks held and
    row locks awaited (sampled), all per run."""
    per = 1 / runs
    statements = figures.statements
    calls = sum(c for _, c, _ in statements) * per
    exec_ms = sum(t for _, _, t in statements) * per
    begins = sum(c for q, c, _ in statements if q.strip().upper() == "BEGIN") * per
    advisory = [(c, t) for q, c, t in statements if "pg_advisory_xact_lock" in q]
    lock_calls = sum(c for c, _ in advisory) * per
    lock_ms = sum(t for _, t in advisory) * per
    held = sum(figures.locks.held.values()) * 1000 * per
    rows = sum(v for k, v in figures.locks.waited.items() if k != "advisory") * 1000 * per
    return (f"{label:34} {calls:6.1f} {figures.transactions * per:6.1f} {begins:6.1f} "
            f"{exec_ms:8.2f} {lock_calls:6.1f} {lock_ms:8.2f} {held:8.2f} {rows:7.2f}")  # fmt: skip


def _held(figures: PgFigures, runs: int, names: dict[int, str]) -> str:
    top = figures.locks.held.most_common(3)
    return (
        ", ".join(f"{names.get(k, hex(k & (1 << 64) - 1))} {v * 1000 / runs:.2f}" for k, v in top)
        or "none"
    )


def _report(setups: list[Setup], spawn_rate: float, install_id: str, workspace: str,
            statements: bool) -> None:  # fmt: skip
    print("\nruns/s against the baselines of this run")
    one = next((s for s in setups if s.pg is not None and len(s.nodes) == 1), None)
    print(f"{'':34} {'runs/s':>8} {'/spawn':>7} {'/1 node':>8}")
    for s in setups:
        versus = f"{s.rate / one.rate:7.2f}x" if one and s.pg is not None else ""
        print(f"{s.label:34} {s.rate:8.0f} {s.rate / spawn_rate:6.2f}x {versus:>8}")

    print("\nCPU per run, ms (machine: every process on it and the kernel's own threads; "
          "other: what is not nodes, pg or load)")  # fmt: skip
    print(f"{'':34} {'machine':>8} {'nodes':>7} {'pg':>7} {'load':>7} {'other':>7} {'busy':>6}")
    for s in setups:
        u = {k: v * 1000 / s.runs for k, v in s.cpu.used.items()}
        print(f"{s.label:34} {u['machine']:8.1f} {u['nodes']:7.1f} {u['postgres']:7.1f} "
              f"{u['load']:7.1f} {u['other']:7.1f} {s.cpu.busy():6.0%}")  # fmt: skip

    names = _lock_names(install_id, workspace)
    head = (f"{'stmts':>6} {'xacts':>6} {'BEGIN':>6} {'exec ms':>8} {'locks':>6} "
            f"{'wait ms':>8} {'held ms':>8} {'row ms':>7}")  # fmt: skip
    pg_setups = [s for s in setups if s.pg is not None and s.one_by_one is not None]
    for title, loaded in (("one call at a time", False),
                          ("loaded (the runs/s calls)", True)):  # fmt: skip
        print(f"\nPostgreSQL per run, {title}; ms are the server's")
        print(f"{'':34} {head}")
        for s in pg_setups:
            figures, runs = (s.pg, s.runs) if loaded else (s.one_by_one, s.sequential_runs)
            assert figures is not None
            print(_pg_row(s.label, figures, runs))
    print()
    for s in pg_setups:
        assert s.pg is not None and s.one_by_one is not None
        open_ = [s.pg.locks.connections.get(_application_name(n), 0) for n in s.nodes]
        active = [s.pg.locks.active.get(_application_name(n), 0) for n in s.nodes]
        sampled = s.pg.locks.waited.get("advisory", 0) * 1000 / s.runs
        print(f"{s.label}: advisory locks held, ms per run by key: one at a time "
              f"{_held(s.one_by_one, s.sequential_runs, names)}; loaded "
              f"{_held(s.pg, s.runs, names)}; advisory wait sampled {sampled:.2f} ms "
              f"({s.pg.locks.looks} looks); connections per node {open_} open, {active} "
              "at work at most")  # fmt: skip
    if statements:
        for s in pg_setups:
            assert s.pg is not None
            print(f"\n{s.label}: statements per run (calls, mean ms), loaded")
            for query, count, total in sorted(s.pg.statements, key=lambda r: -r[1])[:40]:
                text = " ".join(query.split())[:96]
                print(f"  {count / s.runs:5.2f} {total / count:7.3f}  {text}")


def _application_name(node: Daemon) -> str:
    """A node's connections' application_name (runnerd/store/db.py: host and pid)."""
    import socket

    return f"runnerd {socket.gethostname()} {node.proc.pid}"[:63]


@contextlib.contextmanager
def _postgres() -> Iterator[tuple[PgCluster, int]]:
    """A throwaway cluster with pg_stat_statements loaded; its postmaster's pid."""
    cluster = PgCluster()
    try:
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        cluster.halt()
        cluster.start()
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        yield cluster, int((cluster.data / "postmaster.pid").read_text().split()[0])
    finally:
        cluster.stop()


def _measured_tree(tree: Path | None) -> str:
    """What the nodes run: the checkout's commit and what the working tree changes in
    runnerd/ (or the other tree's path)."""
    if tree is not None:
        return f"runnerd from {tree}"

    def git(*argv: str) -> str:
        done = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(REPO), *argv], capture_output=True, text=True
        )
        return done.stdout.strip()

    changed = git("diff", "--stat", "HEAD", "--", "runnerd").splitlines()
    return f"runnerd at {git('rev-parse', '--short', 'HEAD')}" + (
        f" + working tree ({changed[-1].strip()})" if changed else ""
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=3, help="the most PostgreSQL nodes")
    parser.add_argument("--latency-runs", type=int, default=30)
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--statements", action="store_true", help="each statement per run")
    parser.add_argument("--tree", type=Path, help="run the nodes from this checkout's runnerd "
                        "(say, `git archive` of an older commit), on PYTHONPATH")  # fmt: skip
    args = parser.parse_args()
    if args.tree is not None:  # the nodes' and their admin commands'; this process keeps its own
        assert (args.tree / "runnerd" / "__init__.py").is_file(), args.tree
        os.environ["PYTHONPATH"] = str(args.tree.resolve())
    toolchain = REPO / ".cache" / "toolchain"
    example = REPO / "examples" / "deal-desk"
    if args.tree is not None and (args.tree / "examples" / "deal-desk").is_dir():
        example = args.tree / "examples" / "deal-desk"  # the app as that tree knew it
    print(f"nodes: {_measured_tree(args.tree)}; {os.cpu_count()} CPUs\n")

    data = Path(tempfile.mkdtemp(prefix="runnerd-bench-", dir="/tmp"))
    data.chmod(0o711)
    # The bare spawns' uid: outside the nodes' range (tests/daemon.py) and the default one,
    # whose node would kill it at its start (it holds no uid lock: an orphan to a node).
    machine = build_machine(load_settings(flags={"data_dir": data, "sandbox_uid_base": BARE_UID}))
    python = machine.runtimes.python
    assert python is not None
    env = clean_env()
    bare = bare_jail(machine, [python.executable, "-I", "-S", "-c", "pass"], python.mounts)

    def spawn(argv: list[str]) -> Callable[[], object]:
        return lambda: subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)

    one = spawn([python.executable, "-I", "-S", "-c", "pass"])
    times = []
    for _ in range(30):
        start = time.perf_counter()
        one()
        times.append((time.perf_counter() - start) * 1000)
    spawn_cpu = Cpu([], None)
    spawn_cpu.start()
    spawns, spawn_s = _rate([spawn(bare) for _ in range(args.clients)], args.seconds)
    spawn_cpu.stop()
    spawn_rate = spawns / spawn_s
    print(f"bare python3 -I -S -c pass: {statistics.median(times):.1f} ms")
    print(f"bare nsjail + python, {args.clients} workers: {spawn_rate:.0f} spawns/s, "
          f"{spawn_cpu.used['machine'] * 1000 / spawns:.1f} ms CPU each, machine "
          f"{spawn_cpu.busy():.0%} busy\n")  # fmt: skip

    print(f"{'':34} {'run ms':>8} {'list ms':>8} {'runs/s':>8}")
    setups: list[Setup] = []
    if not args.no_sqlite:
        with running_daemon(toolchain, **SETTINGS) as node:
            install = node.ship(example)["installId"]
            setups.append(_measure("SQLite, one node", [node], install, args, None, None))
    with _postgres() as (cluster, postmaster), contextlib.ExitStack() as nodes:
        url = cluster.new_database()
        stats = PgStats(cluster, url)
        key = base64.b64encode(os.urandom(32)).decode()  # one secrets key, as every cluster
        first = nodes.enter_context(
            running_daemon(toolchain, database_url=url, secrets_key=key, **SETTINGS)
        )
        install = first.ship(example)["installId"]
        joined = [first]
        for count in range(1, args.nodes + 1):
            if count > 1:
                joined.append(nodes.enter_context(running_daemon(toolchain, join=first,
                                                                 **SETTINGS)))  # fmt: skip
            label = f"PostgreSQL, {count} node{'s' if count > 1 else ''}"
            setups.append(_measure(label, list(joined), install, args, stats, postmaster))
        _report(setups, spawn_rate, install, first.workspace_id, args.statements)
    shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
