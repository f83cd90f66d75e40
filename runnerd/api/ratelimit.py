"""Load limits of the API: a token bucket per API key. (Run admission, the bounded
concurrency and queue of runs, is in runnerd/govern/governor.py: approved runs pass it too.)"""

from __future__ import annotations

import time

from runnerd.api.errors import ApiError

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
            raise ApiError.rate_limited((1 - tokens) / self.per_second)
        self._buckets[key] = (tokens - 1, now)
        if len(self._buckets) > 100_000:  # forget idle keys; they refill to full anyway
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 60}
