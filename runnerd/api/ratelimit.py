"""Load limits of the API: a token bucket per API key. (Run admission, the bounded
concurrency and queue of runs, is RunGate in runnerd/govern/admission.py: approved runs
pass it too.)

A key's limit is the configured one across a cluster (docs/SCALING.md, *Rate limits*):
each node enforces its share of it, ``rate / N`` and ``burst / N`` with N the live nodes
of the nodes table, counted again every RATE_SHARE_EVERY_S. A call spends its token in
this process, with no round trip: the bucket costs a call about a microsecond, as it did
on one node."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from runnerd.errors import RateLimited
from runnerd.limits import RATE_LIMIT_IDLE_S, RATE_LIMIT_MAX_KEYS, RATE_SHARE_EVERY_S

if TYPE_CHECKING:
    from runnerd.config import Settings
    from runnerd.store import Store

__all__ = ["RateLimiter"]

log = logging.getLogger("runnerd")


class RateLimiter:
    """One token bucket per key: ``burst`` tokens, refilled at ``per_second``, of which
    this node enforces its share (``share``): with N nodes serving, ``per_second / N``
    and ``burst / N`` (never less than one token, so a key is never shut out)."""

    def __init__(self, per_second: float, burst: int) -> None:
        self.per_second = per_second
        self.burst = burst
        self.nodes = 1
        self._rate = per_second
        self._capacity = float(burst)
        # key -> (how full, 0..1 of this node's share, when): a bucket kept as a fraction
        # keeps its level when the share changes (a full bucket stays full).
        self._buckets: dict[str, tuple[float, float]] = {}

    @classmethod
    def from_settings(cls, settings: Settings, store: Store) -> RateLimiter:
        """The limiter of a node that has joined ``store``: its share for the nodes
        serving it now (one on a SQLite file)."""
        limiter = cls(settings.rate_limit_per_second, settings.rate_limit_burst)
        if store.db.dialect != "sqlite":
            limiter.share(len(store.live_nodes()))
        return limiter

    def share(self, nodes: int) -> None:
        """Enforce this node's share of the limit when ``nodes`` nodes serve it (at least
        this one). Buckets keep how full they are: a key that had spent half its share
        has spent half of the new one."""
        self.nodes = max(1, nodes)
        self._rate = self.per_second / self.nodes
        self._capacity = max(1.0, self.burst / self.nodes)

    def take(self, key: str) -> None:
        """Spend one token, or raise 429 RATE_LIMITED saying when one will be there."""
        now = time.monotonic()
        capacity, rate = self._capacity, self._rate
        fill, updated = self._buckets.get(key, (1.0, now))
        tokens = min(capacity, fill * capacity + (now - updated) * rate)
        if tokens < 1:
            self._buckets[key] = (tokens / capacity, now)
            raise RateLimited((1 - tokens) / rate)
        self._buckets[key] = ((tokens - 1) / capacity, now)
        if len(self._buckets) > RATE_LIMIT_MAX_KEYS:  # forget idle keys; they refill anyway
            idle = RATE_LIMIT_IDLE_S
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < idle}

    async def follow(self, store: Store) -> None:
        """Keep this node's share to the live nodes of ``store``, until cancelled. On a
        SQLite file (one node) there is nothing to follow. While the database does not
        answer, the last count holds."""
        if store.db.dialect == "sqlite":
            return
        while True:
            await asyncio.sleep(RATE_SHARE_EVERY_S)
            try:
                nodes = len(await store.io(store.live_nodes))
            except Exception as exc:
                log.debug("rate limit share: nodes not counted (%s)", type(exc).__name__)
                continue
            if nodes != self.nodes:
                log.info("rate limits: this node's share is now 1/%d (live nodes)", max(1, nodes))
            self.share(nodes)
