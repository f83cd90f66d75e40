"""A call of an installed tool, with everything an organisation needs around the run:
budget admission, approvals for writes, idempotency, secrets, metering and audit.

HTTP-agnostic: it raises domain errors and returns results; the API maps both.
Inputs, outputs and secret values stay in memory: the store gets hashes, names, ids,
statuses and durations only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runnerd.config import Settings
from runnerd.errors import BudgetExhausted, DatabaseUnavailable, RunnerdError
from runnerd.metrics import METRICS
from runnerd.roles import ROLE_RANK
from runnerd.run.jail import JailEnd, SandboxUnavailable
from runnerd.run.pipeline import CheckedInput, Pipeline, RunResult, tool_key
from runnerd.store import ApprovalRow, InstallRecord, Store, ToolRecord, new_id
from runnerd.vault import Vault

log = logging.getLogger("runnerd")

__all__ = [
    "ApprovalUnavailable",
    "CallResult",
    "Governor",
    "IdempotencyConflict",
    "Pending",
    "RunGate",
    "RunQueueFull",
    "Stopping",
    "ToolNotFound",
]

# Surfaces whose write calls wait for a person's approval: chat asks the person, a relay
# waits under its rules.
APPROVAL_SURFACES = ("chat", "relay")


class ToolNotFound(RunnerdError):
    """The installed version has no tool of that name."""

    reason, status = "TOOL_NOT_FOUND", 404


class IdempotencyConflict(RunnerdError):
    """The Idempotency-Key was first used with another request."""

    reason, status = "IDEMPOTENCY_KEY_REUSED", 409


class RunQueueFull(RunnerdError):
    """More runs are waiting than the queue holds; try again shortly."""

    reason, status, retry_after_s = "RUN_QUEUE_FULL", 503, 1


class Stopping(RunnerdError):
    """The daemon is stopping: it admits no new run; another node (or this one, once
    restarted) will."""

    reason, status, retry_after_s = "RUNNERD_STOPPING", 503, 5


def _count_run(
    install: InstallRecord,
    tool: str,
    surface: str,
    status: str,
    duration_ms: int,
    egress: list[dict[str, Any]] | None,
) -> None:
    METRICS.runs.labels(install.app_slug, tool, surface, status).inc()
    METRICS.run_seconds.labels(install.app_slug, tool).observe(duration_ms / 1000)
    for use in egress or []:
        METRICS.egress_bytes.labels("sent").inc(use.get("bytesSent", 0))
        METRICS.egress_bytes.labels("received").inc(use.get("bytesReceived", 0))


class Interrupted(Exception):
    """A run ended by the daemon's stop (its rows are ended already)."""


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


_APPROVAL_STATUS = {"APPROVAL_NOT_FOUND": 404, "NOT_AN_APPROVER": 403}


class ApprovalUnavailable(RunnerdError):
    """An approval that cannot be decided or run (not pending, expired, not yours...)."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        # A reason not listed is a conflict with the approval's state.
        self.status = _APPROVAL_STATUS.get(reason, 409)
        super().__init__(message)


@dataclass(frozen=True)
class CallResult:
    run_id: str
    status: str
    output: Any
    error: str | None
    duration_ms: int


@dataclass(frozen=True)
class Pending:
    approval_id: str
    expires_at: str


@dataclass(frozen=True)
class Principal:
    """The person a call is for, and the key they used (for the audit)."""

    user_id: str
    key_id: str | None = None


def request_hash(install_id: str, version_id: str, tool: str, value: Any) -> str:
    """What approvals and idempotency keys are bound to: never the input itself."""
    digest = hashlib.sha256()
    digest.update(f"{install_id}\0{version_id}\0{tool}\0".encode())
    digest.update(msgspec.json.encode(value, order="sorted"))
    return digest.hexdigest()


class ResultCache:
    """Finished results in memory for a while (GET /runs/{id}, idempotent replays),
    bounded in bytes; never written anywhere."""

    def __init__(self, max_bytes: int, ttl_s: float) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._items: OrderedDict[str, tuple[float, int, CallResult]] = OrderedDict()
        self._bytes = 0

    def put(self, result: CallResult) -> None:
        size = len(msgspec.json.encode(result.output)) + len(result.error or "") + 256
        if size > self.max_bytes:
            return
        self._items[result.run_id] = (time.monotonic(), size, result)
        self._bytes += size
        while self._bytes > self.max_bytes or (
            self._items and time.monotonic() - next(iter(self._items.values()))[0] > self.ttl_s
        ):
            _, (_, old_size, _) = self._items.popitem(last=False)
            self._bytes -= old_size

    def get(self, run_id: str) -> CallResult | None:
        found = self._items.get(run_id)
        if found is None or time.monotonic() - found[0] > self.ttl_s:
            return None
        return found[2]


@dataclass
class _Held:
    """A write call waiting for approval: its input lives only here, in memory."""

    value: Any
    checked: CheckedInput  # checked once, when the call was made
    who: Principal
    workflow_run_id: str | None


@dataclass
class Governor:
    store: Store
    pipeline: Pipeline
    vault: Vault
    gate: RunGate
    approval_ttl_s: int
    idempotency_ttl_s: int
    results: ResultCache
    _held: dict[str, _Held] = field(default_factory=dict)
    _running: dict[str, asyncio.Future[CallResult]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)  # runs still going end
    # Ends of runs the database did not take (PostgreSQL away): written when it is back.
    _unfinished: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_settings(
        cls, settings: Settings, *, store: Store, pipeline: Pipeline, vault: Vault
    ) -> Governor:
        return cls(
            store=store,
            pipeline=pipeline,
            vault=vault,
            gate=RunGate(settings.max_concurrent_runs, settings.max_queued_runs),
            approval_ttl_s=settings.approval_ttl_s,
            idempotency_ttl_s=settings.idempotency_ttl_s,
            results=ResultCache(
                settings.result_cache_mb << 20,
                max(settings.approval_ttl_s, settings.idempotency_ttl_s),
            ),
        )

    # --- the call ---------------------------------------------------------------------------

    async def tool(
        self, install: InstallRecord, name: str, version_id: str | None = None
    ) -> ToolRecord:
        tool = await self.store.io(self.store.get_tool, version_id or install.version_id, name)
        if tool is None:
            raise ToolNotFound(f"the installed version has no tool {name!r}")
        return tool

    async def secrets_of(self, install_id: str) -> dict[str, str]:
        return {
            name: self.vault.open(iid, name, kid, nonce, ct)
            for iid, name, kid, nonce, ct in await self.store.io(
                self.store.sealed_secrets, install_id
            )
        }

    async def call(
        self,
        install: InstallRecord,
        tool_name: str,
        value: Any,
        *,
        who: Principal,
        surface: str,
        workflow_run_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> CallResult | Pending:
        """Check, then run (or hold for approval). Raises ToolNotFound, InputRejected,
        BudgetExhausted or IdempotencyConflict before any sandbox starts."""
        version_id = install.version_id  # resolved once: a later switch does not touch it
        tool = await self.tool(install, tool_name, version_id)
        checked = await self.pipeline.check_input(tool, value, key=tool_key(tool, version_id))
        fingerprint = request_hash(install.id, version_id, tool.name, value)
        if idempotency_key is not None:
            replay = await self._replay(who, idempotency_key, fingerprint)
            if replay is not None:
                return replay
        try:
            if tool.effect == "write" and surface in APPROVAL_SURFACES:
                await self._require_budget(install.id)  # no one should approve what cannot run
                approval = await self.store.io(
                    self.store.create_approval,
                    workspace_id=install.workspace_id,
                    install_id=install.id,
                    version_id=version_id,
                    tool=tool.name,
                    input_hash=fingerprint,
                    surface=surface,
                    requested_by=who.user_id,
                    ttl_s=self.approval_ttl_s,
                )
                self._held[approval.id] = _Held(value, checked, who, workflow_run_id)
                if idempotency_key is not None:
                    await self._release(who, idempotency_key)
                return Pending(approval.id, approval.expires_at)
            result = await self._run(
                install,
                tool,
                value,
                who=who,
                surface=surface,
                version_id=version_id,
                workflow_run_id=workflow_run_id,
                idempotency_key=idempotency_key,
                checked=checked,
            )
        except BaseException:
            if idempotency_key is not None:
                await self._release(who, idempotency_key)
            raise
        return result

    async def _run(
        self,
        install: InstallRecord,
        tool: ToolRecord,
        value: Any,
        *,
        who: Principal,
        surface: str,
        version_id: str,
        workflow_run_id: str | None,
        checked: CheckedInput,
        idempotency_key: str | None = None,
    ) -> CallResult:
        """Wait for a run slot (or RunQueueFull), admit the run against the budget (its
        row and reservation), then execute it."""
        async with self.gate.admit() as slot:
            run_id = await self._start_run(
                install, tool, who, surface, version_id, workflow_run_id, key=idempotency_key
            )
            return await self._execute(
                run_id, install, tool, value, version_id, who.key_id, checked, surface, slot
            )

    async def _release(self, who: Principal, key: str) -> None:
        await self.store.io(self.store.release_idempotency_key, who.user_id, key)

    async def _start_run(
        self,
        install: InstallRecord,
        tool: ToolRecord,
        who: Principal,
        surface: str,
        version_id: str,
        workflow_run_id: str | None,
        approval_id: str | None = None,
        key: str | None = None,
    ) -> str:
        """The one place a run starts: its row, its reservation against the budget
        (BudgetExhausted when the month is spent), and the approval or idempotency key
        that released it, in one transaction. From then on the run always ends: a caller
        cancelled while the row was written leaves it ended as interrupted."""
        run_id = new_id("run")
        try:
            await self.store.io(
                self.store.start_run,
                install=install,
                tool=tool.name,
                user_id=who.user_id,
                surface=surface,
                timeout_ms=tool.timeout_ms,
                version_id=version_id,
                workflow_run_id=workflow_run_id,
                approval_id=approval_id,
                run_id=run_id,
                idempotency=(who.user_id, key) if key is not None else None,
            )
        except asyncio.CancelledError:
            await self.store.io(self.store.interrupt_runs, [run_id])
            raise
        return run_id

    async def _execute(
        self,
        run_id: str,
        install: InstallRecord,
        tool: ToolRecord,
        value: Any,
        version_id: str,
        key_id: str | None,
        checked: CheckedInput,
        surface: str,
        slot: JailEnd | None = None,
    ) -> CallResult:
        """Run an admitted run in its jail and end it (row, ledger, audit, budget in one
        transaction); the result stays in memory only. Its row ends even if no jail
        could start. ``slot`` (its run slot) goes back when its jail is gone."""
        done: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()
        self._running[run_id] = done
        try:
            outcome: RunResult = await self._unless_stopped(
                self.pipeline.run(
                    tool,
                    value,
                    checked=checked,
                    secrets=await self.secrets_of(install.id),
                    version_id=version_id,
                    egress=install.egress,
                    install_id=install.id,
                    logs=False,
                    on_end=slot,
                )
            )
        except Interrupted:
            result = CallResult(
                run_id, "failed", None, "interrupted: runnerd stopped before the run ended", 0
            )
            done.set_result(result)
            self._running.pop(run_id, None)
            return result
        except BaseException as exc:
            await self._finish_run(
                run_id,
                status="failed",
                duration_ms=0,
                error_kind="sandbox_unavailable"
                if isinstance(exc, SandboxUnavailable)
                else "internal_error",
                key_id=key_id,
            )
            done.cancel()
            self._running.pop(run_id, None)
            raise
        await self._finish_run(
            run_id,
            status=outcome.status,
            duration_ms=outcome.duration_ms,
            error_kind=None if outcome.status == "succeeded" else outcome.status,
            key_id=key_id,
            egress=outcome.egress,
            egress_audit=outcome.egress_audit,
        )
        _count_run(install, tool.name, surface, outcome.status, outcome.duration_ms, outcome.egress)
        result = CallResult(
            run_id, outcome.status, outcome.output, outcome.error, outcome.duration_ms
        )
        self.results.put(result)
        done.set_result(result)
        self._running.pop(run_id, None)
        return result

    async def _finish_run(self, run_id: str, **end: Any) -> None:
        """End the run's row (store.finish_run). When the database is away, keep the end
        and write it once the database is back (retry_unfinished): the run happened, its
        caller gets its result, and its row, ledger and audit entry follow."""
        try:
            await self.store.io(self.store.finish_run, run_id, **end)
        except DatabaseUnavailable:
            log.warning("run %s ended while the database was away; its end is kept", run_id)
            self._unfinished[run_id] = end

    async def retry_unfinished(self) -> int:
        """Write the ends kept while the database was away; how many are still kept."""
        for run_id, end in list(self._unfinished.items()):
            try:
                await self.store.io(self.store.finish_run, run_id, **end)
            except DatabaseUnavailable:
                break
            del self._unfinished[run_id]
        return len(self._unfinished)

    async def _replay(self, who: Principal, key: str, fingerprint: str) -> CallResult | None:
        """The first run's result for a repeated key, or None (the key is now claimed)."""
        claim = self.store.claim_idempotency_key
        found = await self.store.io(claim, who.user_id, key, fingerprint, self.idempotency_ttl_s)
        if found is None:
            return None
        first_hash, run_id = found
        if first_hash != fingerprint:
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different request"
            )
        deadline = time.monotonic() + 330
        while run_id is None and time.monotonic() < deadline:  # the first call is starting
            await asyncio.sleep(0.02)
            again = await self.store.io(
                claim, who.user_id, key, fingerprint, self.idempotency_ttl_s
            )
            run_id = again[1] if again else None
            if again is None:  # the first call was refused and released the key
                return None
        assert run_id is not None
        return await self.outcome(run_id)

    @property
    def running(self) -> list[str]:
        """The runs in their jails now."""
        return list(self._running)

    async def interrupt(self, run_ids: list[str]) -> list[str]:
        """End runs that cannot finish (the daemon is stopping): failed, interrupted,
        with their rows, as a restart would end them; their callers are answered so."""
        ended = await self.store.io(self.store.interrupt_runs, run_ids)
        self._stopped.set()
        return ended

    async def _unless_stopped(self, work: Awaitable[RunResult]) -> RunResult:
        """``work``, unless the daemon ends the runs still going first (Interrupted;
        the jail is then stopped by the sandbox)."""
        task = asyncio.ensure_future(work)
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if task.done():
            return task.result()
        task.cancel()
        raise Interrupted

    async def outcome(self, run_id: str) -> CallResult:
        """A run's result: awaited while it runs, from memory or its record after. A run
        just admitted (an approved one starts in a task) is waited for too."""
        deadline = time.monotonic() + 330
        while True:
            running = self._running.get(run_id)
            if running is not None:
                return await asyncio.shield(running)
            found = await self.recorded(run_id)
            if found.status != "running" or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.01)

    async def recorded(self, run_id: str) -> CallResult:
        """A finished run's result: from memory when still there, else its record (the
        output and error are never stored, so they are null then)."""
        cached = self.results.get(run_id)
        if cached is not None:
            return cached
        row = await self.store.io(self.store.get_run, run_id)
        assert row is not None
        return CallResult(run_id, row.status, None, None, row.duration_ms or 0)

    # --- approvals --------------------------------------------------------------------------

    async def may_decide(self, approval: ApprovalRow, user_id: str) -> bool:
        """From chat, the person who asked decides; from a relay, an approver (or admin)."""
        if approval.surface == "chat":
            return approval.requested_by == user_id
        member = await self.store.io(self.store.membership, approval.workspace_id, user_id)
        return member is not None and (member.approver or member.role == "admin")

    async def _require_budget(self, install_id: str) -> None:
        """BudgetExhausted if the install's month is spent (counting reservations)."""
        budget = await self.store.io(self.store.budget, install_id)
        if budget.monthly_ms is not None and (
            budget.used_ms + budget.reserved_ms >= budget.monthly_ms
        ):
            raise BudgetExhausted(install_id, budget.resets_at)

    async def decide(self, approval_id: str, *, approve: bool, who: Principal) -> ApprovalRow:
        """Approve (which releases exactly one run, started now) or deny an approval."""
        approval = await self.store.io(self.store.get_approval, approval_id)
        if approval is None:
            raise ApprovalUnavailable("APPROVAL_NOT_FOUND", "no such approval")
        if not await self.may_decide(approval, who.user_id):
            raise ApprovalUnavailable(
                "NOT_AN_APPROVER",
                "from chat only the person who asked decides; from a relay, an approver",
            )
        if approve and approval.status == "pending":
            # Refuse before deciding, so the approval stays pending for a later try.
            if approval_id not in self._held:
                raise ApprovalUnavailable(
                    "APPROVAL_REQUEST_LOST",
                    "the daemon restarted since the call was made, and calls waiting for "
                    "approval are kept in memory only: make the call again",
                )
            await self._require_budget(approval.install_id)
            # The run is the asker's: it runs only while they may still run tools there (a
            # person demoted or removed while the call waited gets nothing run for them).
            asker = await self.store.io(
                self.store.membership, approval.workspace_id, approval.requested_by
            )
            if (
                asker is None
                or ROLE_RANK[asker.role] < ROLE_RANK["member"]
                or not asker.apps_access
            ):
                raise ApprovalUnavailable(
                    "ASKER_NO_LONGER_ALLOWED",
                    "the person who made this call may no longer run tools in this "
                    "workspace; deny it, or let it expire",
                )
        decided = await self.store.io(
            self.store.decide_approval,
            approval_id,
            approve=approve,
            user_id=who.user_id,
            key_id=who.key_id,
        )
        if decided is None:
            current = await self.store.io(self.store.get_approval, approval_id)
            status = current.status if current else "missing"
            raise ApprovalUnavailable("APPROVAL_NOT_PENDING", f"the approval is {status}")
        held = self._held.pop(approval_id, None)
        if not approve:
            return decided
        if held is None:  # only the winner of two racing approvals finds the input
            raise ApprovalUnavailable("APPROVAL_NOT_PENDING", "the approval was just decided")
        install = await self.store.io(self.store.get_install, decided.install_id)
        assert install is not None
        tool = await self.tool(install, decided.tool, decided.version_id)
        run_id = await self._start_run(
            install,
            tool,
            held.who,
            decided.surface,
            decided.version_id,
            held.workflow_run_id,
            approval_id=approval_id,
        )
        task = asyncio.ensure_future(self._approved_run(run_id, install, tool, held, decided))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        found = await self.store.io(self.store.get_approval, approval_id)
        assert found is not None
        return found

    async def _approved_run(
        self,
        run_id: str,
        install: InstallRecord,
        tool: ToolRecord,
        held: _Held,
        approval: ApprovalRow,
    ) -> None:
        # Nobody awaits this run: its failure to start is recorded on its row, not raised.
        with contextlib.suppress(Exception):
            async with self.gate.admit(must_wait=True) as slot:
                await self._execute(
                    run_id,
                    install,
                    tool,
                    held.value,
                    approval.version_id,
                    held.who.key_id,
                    held.checked,
                    approval.surface,
                    slot,
                )

    async def expire(self) -> list[str]:
        """Expire approvals past their time, and forget their held inputs."""
        expired = await self.store.io(self.store.expire_approvals)
        for approval_id in expired:
            self._held.pop(approval_id, None)
        return expired

    async def drain(self, timeout: float) -> None:
        """Wait for approved runs still going (at shutdown)."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)
