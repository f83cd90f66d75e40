"""Load limits of the API: a token bucket per API key. (Run admission, the bounded
concurrency and queue of runs, is RunGate in runnerd/govern/admission.py: approved runs
pass it too.)"""

from __future__ import annotations

import time

from runnerd.errors import RateLimited
from runnerd.limits import RATE_LIMIT_IDLE_S, RATE_LIMIT_MAX_KEYS

__all__ = ["RateLimiter"]


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
            raise RateLimited((1 - tokens) / self.per_second)
        self._buckets[key] = (tokens - 1, now)
        if len(self._buckets) > RATE_LIMIT_MAX_KEYS:  # forget idle keys; they refill anyway
            idle = RATE_LIMIT_IDLE_S
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < idle}
