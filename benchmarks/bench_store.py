"""The store's cost on each backend: SQLite (one node) and PostgreSQL (one node, two).

    .venv/bin/python benchmarks/bench_store.py [--seconds S] [--clients N]   (root)

Starts a throwaway PostgreSQL cluster (tests/pg_cluster.py: Debian's binaries, a Unix
socket) and real `runnerd serve` nodes with the deal-desk example installed. For each
setup: one call's latency (sequential), a list-tools call's latency, and runs per second
with N clients calling at once for S seconds. Baselines from the same run: bare nsjail +
python spawned by N workers (the ceiling of any sandboxed runner here), and one bare
`python3 -I -S -c pass`. Then the PostgreSQL statements of one run, from the server's
own statement log. Not a test; asserts only that runs succeed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

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
SETTINGS = {"rate_limit_per_second": "100000", "rate_limit_burst": "100000"}


def _latency(call: Callable[[], httpx.Response], count: int) -> float:
    times = []
    for _ in range(count + 1):
        time.sleep(0.05)  # let the warm pool refill
        start = time.perf_counter()
        response = call()
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, response.text
    return statistics.median(times[1:])


def _rate(calls: list[Callable[[], object]], seconds: float) -> float:
    """Completed calls per second, each callable called in a loop by a thread of its own."""
    done = [0] * len(calls)
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            calls[i]()
            done[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(calls))]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - began)


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


def _measure(label: str, nodes: list[Daemon], install_id: str, args: argparse.Namespace) -> None:
    first = nodes[0]
    run = _latency(lambda: first.run(install_id, TOOL, VALUE), 30)
    tools = _latency(
        lambda: first.call("GET", "/api/v2/apps/tools", first.admin_key,
                           params={"workspaceId": first.workspace_id}),
        30,
    )  # fmt: skip
    calls = [_runner(nodes[i % len(nodes)], install_id) for i in range(args.clients)]
    rate = _rate(calls, args.seconds)
    print(f"{label:34} {run:9.1f} {tools:12.1f} {rate:10.0f}")


def _statements_per_run(cluster: PgCluster, node: Daemon, install_id: str) -> float:
    """Statements PostgreSQL received per run (its own log, log_statement = all)."""
    admin = cluster.url()
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        conn.execute("SELECT pg_reload_conf()")
    time.sleep(0.5)
    log = cluster.base / "log"
    start = log.stat().st_size
    runs = 20
    for _ in range(runs):
        time.sleep(0.05)
        assert node.run(install_id, TOOL, VALUE).status_code == 200
    with log.open("rb") as handle:
        handle.seek(start)
        text = handle.read().decode(errors="replace")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM RESET log_statement")
        conn.execute("SELECT pg_reload_conf()")
    # Only the node's own statements: the lease upkeep runs every node_lease_s / 3.
    lines = [line for line in text.splitlines() if "LOG:  statement:" in line
             or "LOG:  execute" in line]  # fmt: skip
    return len(lines) / runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    toolchain = REPO / ".cache" / "toolchain"
    example = REPO / "examples" / "deal-desk"

    data = Path(tempfile.mkdtemp(prefix="runnerd-bench-", dir="/tmp"))
    data.chmod(0o711)
    machine = build_machine(load_settings(flags={"data_dir": data}))
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
    spawn_rate = _rate([spawn(bare) for _ in range(args.clients)], args.seconds)
    print(f"bare python3 -I -S -c pass: {statistics.median(times):.1f} ms")
    print(f"bare nsjail + python, {args.clients} workers: {spawn_rate:.0f} spawns/s\n")

    print(f"{'':34} {'run ms':>9} {'list ms':>12} {'runs/s':>10}")
    cluster = PgCluster()
    try:
        with running_daemon(toolchain, **SETTINGS) as node:
            install = node.ship(example)["installId"]
            _measure("SQLite, one node", [node], install, args)
        url = cluster.new_database()
        with running_daemon(toolchain, database_url=url, **SETTINGS) as a:
            install = a.ship(example)["installId"]
            _measure("PostgreSQL, one node", [a], install, args)
            with running_daemon(toolchain, join=a, **SETTINGS) as b:
                _measure("PostgreSQL, two nodes (one host)", [a, b], install, args)
            per_run = _statements_per_run(cluster, a, install)
            print(f"\nPostgreSQL statements per run (server log): {per_run:.1f}")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
