"""Prometheus metrics of one runnerd process (prometheus-client, its own registry).

Counters and histograms are updated where things happen (a run's end, a jail's start, a
refusal, an env build, egress); gauges are read when scraped (running and queued runs,
waiting jails, pending approvals). Labels are app slugs, tool names, surfaces, statuses
and reasons: never an input, an output, a secret or a person.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

__all__ = ["METRICS", "Metrics"]

_RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_START_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.runs = Counter(
            "runnerd_runs", "Runs that ended, by app, tool, surface and status",
            ["app", "tool", "surface", "status"], registry=r,
        )  # fmt: skip
        self.run_seconds = Histogram(
            "runnerd_run_duration_seconds", "What callers waited for a run (checks, jail, tool)",
            ["app", "tool"], buckets=_RUN_BUCKETS, registry=r,
        )  # fmt: skip
        self.jail_start_seconds = Histogram(
            "runnerd_sandbox_start_seconds", "Starting one nsjail sandbox (warm or on demand)",
            ["language"], buckets=_START_BUCKETS, registry=r,
        )  # fmt: skip
        self.refusals = Counter(
            "runnerd_refusals", "Requests refused, by reason (budget_exhausted, RATE_LIMITED...)",
            ["reason"], registry=r,
        )  # fmt: skip
        self.env_builds = Counter(
            "runnerd_env_builds", "Package environment builds, by ecosystem and result",
            ["ecosystem", "result"], registry=r,
        )  # fmt: skip
        self.egress_bytes = Counter(
            "runnerd_egress_bytes", "Bytes through the egress proxy, by direction",
            ["direction"], registry=r,
        )  # fmt: skip
        self.running = Gauge("runnerd_runs_running", "Runs in their jails now", registry=r)
        self.queued = Gauge("runnerd_runs_queued", "Runs waiting for a slot", registry=r)
        self.warm = Gauge("runnerd_warm_jails", "Jails started and waiting for a call", registry=r)
        self.approvals = Gauge(
            "runnerd_approvals_pending", "Write calls waiting for approval", registry=r
        )

    def read(self, gauge: Gauge, source: Callable[[], float]) -> None:
        """Read ``gauge`` from ``source`` at each scrape."""
        gauge.set_function(source)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


METRICS = Metrics()  # one daemon per process
