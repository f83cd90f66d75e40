"""Whether a call may start: the person may run tools in the workspace, the install's
month is not spent, and a run slot is free (RunGate). And the rule every role check of
every surface meets (``has_role``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from runnerd.errors import BudgetExhausted, InsufficientRole, RunQueueFull, Stopping
from runnerd.model import Role
from runnerd.roles import ROLE_RANK
from runnerd.run.jail import JailEnd
from runnerd.store import MembershipRecord, Store

__all__ = [
    "Principal",
    "RunGate",
    "at_least",
    "has_role",
    "may_run",
    "require_budget",
    "require_runner",
]


@dataclass(frozen=True)
class Principal:
    """The person a call is for, and the key they used (for the audit)."""

    user_id: str
    key_id: str | None = None


def at_least(role: Role, needed: Role) -> bool:
    """Whether ``role`` ranks as ``needed`` or above (roles.ROLES, in rank order)."""
    return ROLE_RANK[role] >= ROLE_RANK[needed]


def has_role(member: MembershipRecord | None, role: Role, *, apps: bool = True) -> bool:
    """Whether a person of this standing (None: not in the workspace) acts there with at
    least ``role``, and with the Apps module unless ``apps`` is False."""
    return member is not None and at_least(member.role, role) and (member.apps_access or not apps)


def may_run(member: MembershipRecord | None) -> bool:
    """Whether a person of this standing may run tools: a member or above, with the Apps
    module."""
    return has_role(member, "member")


async def require_runner(store: Store, workspace_id: str, user_id: str) -> None:
    """InsufficientRole unless the person may run tools in the workspace (``may_run``)."""
    if not may_run(await store.io(store.membership, workspace_id, user_id)):
        raise InsufficientRole


async def require_budget(store: Store, install_id: str) -> None:
    """BudgetExhausted if the install's month is spent (counting reservations)."""
    budget = await store.io(store.budget, install_id)
    if budget.spent:
        raise BudgetExhausted(install_id, budget.resets_at)


class RunGate:
    """At most ``concurrent`` runs at once and ``queued`` waiting; past that, calls are
    refused at once (RunQueueFull): never an unbounded pile-up. Once ``closing`` (the
    daemon is stopping), no new run is admitted (Stopping).

    A run holds its slot until its jail is gone, not until its answer: the live jails
    serving calls are what the bound counts (waiting warm jails serve none)."""

    def __init__(self, concurrent: int, queued: int) -> None:
        self._slots = asyncio.Semaphore(concurrent)
        self.queued = queued
        self.waiting = 0
        self.closing = False

    @contextlib.asynccontextmanager
    async def admit(self, *, must_wait: bool = False) -> AsyncIterator[JailEnd]:
        """A run slot, for ``Pipeline.run(on_end=...)``: the sandbox that takes it gives it
        back once the run's jail is gone; one no sandbox took is given back when the
        block ends. ``must_wait`` queues even past the bound (an approved run, whose
        row already exists, is never refused)."""
        if self.closing and not must_wait:
            raise Stopping("runnerd is stopping and admits no new run; try again shortly")
        if not must_wait and self._slots.locked() and self.waiting >= self.queued:
            raise RunQueueFull("too many runs are waiting; try again shortly")
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        slot = JailEnd(self._slots.release)
        try:
            yield slot
        finally:
            if not slot.taken:
                slot()
