"""Load limits: a token bucket per API key, and bounded run admission.

Past the run queue, calls are refused at once with 503: never an unbounded pile-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from runnerd.api.errors import ApiError

__all__ = ["RateLimiter", "RunGate"]


class RateLimiter:
    """One token bucket per key: ``burst`` tokens, refilled at ``per_second``."""

    def __init__(self, per_second: float, burst: int) -> None:
        self.per_second = per_second
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, updated)

    def take(self, key: str) -> None:
        """Spend one token, or raise 429 RATE_LIMITED saying when one will be there."""
        now = time.monotonic()
        tokens, updated = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - updated) * self.per_second)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            raise ApiError.rate_limited((1 - tokens) / self.per_second)
        self._buckets[key] = (tokens - 1, now)
        if len(self._buckets) > 100_000:  # forget idle keys; they refill to full anyway
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 60}


class RunGate:
    """At most ``concurrent`` runs at once and ``queued`` waiting; the rest get 503."""

    def __init__(self, concurrent: int, queued: int) -> None:
        self._slots = asyncio.Semaphore(concurrent)
        self.queued = queued
        self.waiting = 0

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        if self._slots.locked() and self.waiting >= self.queued:
            raise ApiError(
                "SERVICE_UNAVAILABLE",
                "Too many runs are waiting; try again shortly",
                details={"code": "RUN_QUEUE_FULL"},
                headers={"Retry-After": "1"},
            )
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self._slots.release()
