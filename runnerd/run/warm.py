"""The warm pool: jails started ahead of calls, each waiting on stdin with its
interpreter loaded.

A jail does not know its tool until the request arrives, so the jails of one kind
(language and package environment) are interchangeable and can be started before a call
comes: ``size`` per kind, for the WARM_MAX_KINDS kinds used last. A call takes one
(``take``); every jail still serves exactly one call and is gone after it. A waiting jail
older than WARM_MAX_IDLE_S, or one that died, leaves the pool, and a fresh one takes its
place. The pool knows nothing of what a jail is: it starts them through the ``start`` it
is given (Sandbox's), and stops them through spawn.RunningJail: a fresh nsjail, or a child
forked from a Python template (run/templates.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

from runnerd.limits import MAX_TIMEOUT_S, WARM_MAX_IDLE_S, WARM_MAX_KINDS, WARM_MIN_LIFE_S
from runnerd.run.spawn import RunningJail

__all__ = ["WAITING_WALL_S", "WarmPool"]

# A waiting jail may get any tool, the slowest too, late in its wait: its backstop leaves
# a full timeout to a call that takes it at WARM_MAX_IDLE_S.
WAITING_WALL_S = MAX_TIMEOUT_S + WARM_MAX_IDLE_S

Kind = TypeVar("Kind", bound=Hashable)


class WarmPool(Generic[Kind]):
    """Waiting jails by kind. ``start(kind, wall_s)`` starts one (its backstop ``wall_s``);
    ``background`` runs a coroutine in a task the owner awaits when it closes."""

    def __init__(
        self,
        size: int,
        *,
        start: Callable[[Kind, int], Awaitable[RunningJail]],
        background: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.size = size  # jails kept waiting per kind; 0 = start each jail on demand
        self._start = start
        self._background = background
        self._ready: dict[Kind, deque[RunningJail]] = {}
        self._filling: set[Kind] = set()
        self._recent: OrderedDict[Kind, None] = OrderedDict()
        self._closed = False

    def take(self, kind: Kind) -> RunningJail | None:
        """A waiting jail of ``kind``, if one is alive and fresh; stale ones are dropped."""
        ready = self._ready.get(kind)
        while ready:
            jail = ready.popleft()
            if jail.alive and time.monotonic() - jail.started < WARM_MAX_IDLE_S:
                jail.taken = True
                return jail
            self._background(self._discard(jail))
        return None

    def refill(self, kind: Kind) -> None:
        """Keep ``size`` jails of ``kind`` waiting (started in the background)."""
        if self.size <= 0 or self._closed:
            return
        # Keep waiting jails for the kinds in use lately only (each package env is a kind).
        self._recent[kind] = None
        self._recent.move_to_end(kind)
        while len(self._recent) > WARM_MAX_KINDS:
            old, _ = self._recent.popitem(last=False)
            for jail in self._ready.pop(old, deque()):
                self._background(self._discard(jail))
        if kind not in self._filling:
            self._filling.add(kind)
            self._background(self._fill(kind))

    async def _fill(self, kind: Kind) -> None:
        try:
            ready = self._ready.setdefault(kind, deque())
            while len(ready) < self.size and kind in self._recent:
                jail = await self._start(kind, WAITING_WALL_S)
                ready.append(jail)
                self._background(self._reap(kind, jail))
        except Exception:
            pass
        finally:
            self._filling.discard(kind)

    async def _reap(self, kind: Kind, jail: RunningJail) -> None:
        """A waiting jail leaves the pool when it dies, or when it has waited
        WARM_MAX_IDLE_S; a fresh one takes its place, so the pool stays warm."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(jail.proc.wait()), timeout=WARM_MAX_IDLE_S)
        if jail.taken:
            return
        ready = self._ready.get(kind)
        if ready and jail in ready:
            ready.remove(jail)
        await self._discard(jail)
        # An evicted kind stays out (refilling it would evict another, and so on); a jail
        # that died young is not replaced at once (a broken kind would restart in a loop):
        # the next call of its kind starts one, and refills.
        if kind in self._recent and time.monotonic() - jail.started >= WARM_MIN_LIFE_S:
            self.refill(kind)

    async def _discard(self, jail: RunningJail) -> None:
        if jail.alive:
            await jail.stop()
        jail.uid_lock.close()

    async def warm_up(self, kinds: list[Kind]) -> None:
        """Start the waiting jails of these kinds now (at daemon start)."""
        for kind in kinds:
            self.refill(kind)

    async def wait_warm(self, timeout_s: float) -> None:
        """Until the waiting jails asked for are started (at daemon start), or timeout."""
        deadline = time.monotonic() + timeout_s
        while self._filling and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    @property
    def waiting(self) -> int:
        """Jails started and waiting for a call."""
        return sum(len(ready) for ready in self._ready.values())

    async def close(self) -> None:
        """Start no more jails, and stop every waiting one (at shutdown)."""
        self._closed = True
        for ready in self._ready.values():
            while ready:
                await self._discard(ready.popleft())
