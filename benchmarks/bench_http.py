"""End-to-end latency of a tool call through the daemon's HTTP API.

    .venv/bin/python benchmarks/bench_http.py [--runs N]

Starts a real `runnerd serve` (default settings: warm jails, SQLite in WAL mode) on a
free port with the deal-desk example installed, and times sequential POST .../run calls
from an HTTP client in this process: authentication, the run's rows, the sandbox, the
ledger and audit rows, the response. Not a test; asserts only that runs succeed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from daemon import running_daemon  # noqa: E402

CALLS = {
    "route_ticket (Python)": ("route_ticket", {"subject": "Invoice", "customer_tier": "free"}),
    "score_offer (TypeScript)": (
        "score_offer",
        {
            "discountPct": 12,
            "marginPct": 30,
            "termMonths": 24,
            "dealSize": 120000,
            "tier": "enterprise",
        },
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    toolchain = REPO / ".cache" / "toolchain"
    with running_daemon(toolchain) as daemon:
        install = daemon.ship(REPO / "examples" / "deal-desk")
        print(f"{'':28} {'median ms':>10} {'p95 ms':>8}")
        for label, (tool, value) in CALLS.items():
            times = []
            for _ in range(args.runs + 1):
                time.sleep(0.15)  # let the pool refill, as under a steady load
                start = time.perf_counter()
                response = daemon.run(install["installId"], tool, value)
                times.append((time.perf_counter() - start) * 1000)
                assert response.json()["status"] == "succeeded", response.text
            times = sorted(times[1:])
            p95 = times[int(len(times) * 0.95) - 1]
            print(f"{label:28} {statistics.median(times):10.1f} {p95:8.1f}")


if __name__ == "__main__":
    main()
