"""A call of an installed tool, with everything an organisation needs around the run:
who may run it, budget admission, approvals for writes, idempotency, secrets, metering,
and the audit of runs and of refusals. Every surface (the API, the Manage page through
it, MCP) calls ``Governor.call``, and decides approvals with ``Governor.decide``, and
adds nothing but translation.

HTTP-agnostic: it raises domain errors and returns results; the surfaces map both.
Inputs, outputs and secret values stay in memory: the store gets hashes, names, ids,
statuses and durations only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from runnerd.config import Settings
from runnerd.errors import (
    ApprovalNotFound,
    DatabaseUnavailable,
    RunnerdError,
    SandboxUnavailable,
    ToolNotFound,
)
from runnerd.govern.admission import Principal, RunGate, require_runner
from runnerd.govern.approvals import Approvals, CallOf, Held
from runnerd.govern.idempotency import IdempotencyKeys, check_key, request_hash
from runnerd.govern.notify import Notifier
from runnerd.govern.peers import Peers, PeerUnreachable
from runnerd.govern.results import RUN_INTERRUPTED, CallResult, Pending, ResultCache
from runnerd.ids import new_id
from runnerd.limits import MAX_CALL_WAIT_S
from runnerd.metrics import METRICS
from runnerd.model import RunEnd, Surface
from runnerd.run.jail import JailEnd
from runnerd.run.pipeline import CheckedInput, Pipeline, tool_key
from runnerd.run.verdict import RunResult
from runnerd.store import ApprovalRow, InstallRecord, Store, ToolRecord
from runnerd.vault import Vault

log = logging.getLogger("runnerd")

__all__ = ["Governor"]


def _count_run(
    install: InstallRecord,
    tool: str,
    surface: Surface,
    status: RunEnd,
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


@dataclass
class Governor:
    """The governed call of every surface, and what outlives one call: the run slots,
    the approvals pending, the idempotency keys, the results in memory, the runs going."""

    store: Store
    pipeline: Pipeline
    vault: Vault
    gate: RunGate
    approvals: Approvals
    idempotency: IdempotencyKeys
    results: ResultCache
    peers: Peers  # results other nodes hold (a replay or a read of a run they ran)
    _running: dict[str, asyncio.Future[CallResult]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)  # runs still going end
    # Ends of runs the database did not take (PostgreSQL away): written when it is back.
    _unfinished: dict[str, dict[str, Any]] = field(default_factory=dict)
    _tools_changed: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    @classmethod
    def from_settings(
        cls, settings: Settings, *, store: Store, pipeline: Pipeline, vault: Vault
    ) -> Governor:
        """A governor with the limits and times ``settings`` name."""
        results = ResultCache(
            settings.result_cache_mb << 20,
            max(settings.approval_ttl_s, settings.idempotency_ttl_s),
        )
        return cls(
            store=store,
            pipeline=pipeline,
            vault=vault,
            gate=RunGate(settings.max_concurrent_runs, settings.max_queued_runs),
            approvals=Approvals(
                store, settings.approval_ttl_s, vault, Notifier(store, vault, settings)
            ),
            idempotency=IdempotencyKeys(store, settings.idempotency_ttl_s),
            results=results,
            peers=Peers(vault.derive("node results"), results, lambda: store.node_id),
        )

    # --- what the surfaces hear -------------------------------------------------------------

    def on_tools_changed(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Have ``callback`` awaited whenever the tools an install offers change (an
        install, a switch, a rollback): how MCP tells its sessions, without the API
        knowing MCP."""
        self._tools_changed.append(callback)

    async def tools_changed(self) -> None:
        """Tell every surface that registered (``on_tools_changed``) that tools changed."""
        for callback in self._tools_changed:
            await callback()

    # --- the call ---------------------------------------------------------------------------

    async def tool(
        self, install: InstallRecord, name: str, version_id: str | None = None
    ) -> ToolRecord:
        """The tool ``name`` of the install's version (or of ``version_id``); ToolNotFound
        when that version has none."""
        tool = await self.store.io(self.store.get_tool, version_id or install.version_id, name)
        if tool is None:
            raise ToolNotFound(f"the installed version has no tool {name!r}")
        return tool

    async def tool_to_call(
        self, install: InstallRecord, name: str, *, who: Principal, surface: Surface
    ) -> ToolRecord:
        """The tool of the install's version that ``surface`` is about to call for
        ``who`` (what it needs of the tool before ``call``: MCP, the tool's output schema);
        ToolNotFound, audited as a refusal of that call, when that version has none."""
        try:
            return await self.tool(install, name)
        except RunnerdError as exc:
            await self._audit_refusal(exc, install, name, who=who, surface=surface)
            raise

    async def secrets_of(self, install_id: str) -> dict[str, str]:
        """The install's secrets, opened: for a run's jail only, never stored or logged."""
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
        surface: Surface,
        workflow_run_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> CallResult | Pending:
        """Check, then run (or hold for approval). Raises InsufficientRole (the person may
        not run tools in the install's workspace), InvalidIdempotencyKey, ToolNotFound,
        InputRejected, BudgetExhausted or IdempotencyConflict before any sandbox starts.
        Every refusal (an error with a wire reason) is audited as ``tool.refuse`` with
        its reason and ``surface``, whichever surface made the call."""
        try:
            await require_runner(self.store, install.workspace_id, who.user_id)
            if idempotency_key is not None:
                check_key(idempotency_key)
            return await self._call(
                install,
                tool_name,
                value,
                who=who,
                surface=surface,
                workflow_run_id=workflow_run_id,
                idempotency_key=idempotency_key,
            )
        except RunnerdError as exc:
            await self._audit_refusal(exc, install, tool_name, who=who, surface=surface)
            raise

    async def _audit_refusal(
        self,
        exc: RunnerdError,
        install: InstallRecord,
        tool_name: str,
        *,
        who: Principal,
        surface: Surface,
    ) -> None:
        """Audit a refusal of a call (an error with a wire reason) as ``tool.refuse``,
        with its reason and surface: the same entry whichever surface made the call."""
        await self._refusal_entry(
            exc,
            who.user_id,
            who.key_id,
            workspace_id=install.workspace_id,
            install_id=install.id,
            version_id=install.version_id,
            tool=tool_name,
            surface=surface,
        )

    async def refused_caller(
        self,
        exc: RunnerdError,
        install: InstallRecord,
        tool_name: str,
        *,
        user_id: str | None,
        key_id: str,
    ) -> None:
        """Audit a call of ``install``'s tool refused before it reached ``call``, for the
        key that made it (a token without the scope to run tools, a workspace key, which
        runs nothing), as the same ``tool.refuse`` entry as every refusal after the
        install is known; its body was not read, so the entry names no surface. The
        surface audits only a refusal on an install the caller sees."""
        await self._refusal_entry(
            exc,
            user_id,
            key_id,
            workspace_id=install.workspace_id,
            install_id=install.id,
            version_id=install.version_id,
            tool=tool_name,
        )

    async def _refusal_entry(
        self, exc: RunnerdError, user_id: str | None, key_id: str | None, **fields: Any
    ) -> None:
        """The one ``tool.refuse`` entry: the refusal's reason, who was refused (the
        person, the key), and ``fields`` (what was refused: workspace, install, version,
        tool, surface…)."""
        if exc.reason is not None:
            await self.store.io(
                self.store.audit,
                "tool.refuse",
                actor_user_id=user_id,
                actor_key_id=key_id,
                reason=exc.reason,
                **fields,
            )

    async def _call(
        self,
        install: InstallRecord,
        tool_name: str,
        value: Any,
        *,
        who: Principal,
        surface: Surface,
        workflow_run_id: str | None,
        idempotency_key: str | None,
    ) -> CallResult | Pending:
        version_id = install.version_id  # resolved once: a later switch does not touch it
        tool = await self.tool(install, tool_name, version_id)
        checked = await self.pipeline.check_input(tool, value, key=tool_key(tool, version_id))
        fingerprint = request_hash(install.id, version_id, tool.name, value)
        if idempotency_key is not None:
            replay = await self.idempotency.replay(
                who, idempotency_key, fingerprint, self.outcome, self._held_again
            )
            if replay is not None:
                return replay
        try:
            if self.approvals.needed(tool, surface):
                pending = await self.approvals.hold(
                    install,
                    tool,
                    version_id=version_id,
                    fingerprint=fingerprint,
                    surface=surface,
                    held=Held(value, who, workflow_run_id, idempotency_key),
                )
                return pending  # its key stays: a retry finds this approval
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
                await self.idempotency.release(who, idempotency_key)
            raise
        return result

    async def _run(
        self,
        install: InstallRecord,
        tool: ToolRecord,
        value: Any,
        *,
        who: Principal,
        surface: Surface,
        version_id: str,
        workflow_run_id: str | None,
        checked: CheckedInput,
        idempotency_key: str | None = None,
    ) -> CallResult:
        """Wait for a run slot (or RunQueueFull), admit the run against the budget (its
        row and reservation), then execute it. Its package env is ready first (or
        EnvNotReady): a build is waited for before the run starts, never billed."""
        envs = self.pipeline.envs
        if tool.packages and envs is not None:
            await envs.wait_ready(tool.language, tuple(tool.packages), tool.timeout_ms / 1000)
        async with self.gate.admit() as slot:
            run_id = await self._start_run(
                install, tool, who, surface, version_id, workflow_run_id, key=idempotency_key
            )
            return await self._execute(
                run_id, install, tool, value, version_id, who.key_id, checked, surface, slot
            )

    async def _start_run(
        self,
        install: InstallRecord,
        tool: ToolRecord,
        who: Principal,
        surface: Surface,
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
        surface: Surface,
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
            row = None  # the duration its history has (store.interrupt_runs wrote it)
            with contextlib.suppress(DatabaseUnavailable):
                row = await self.store.io(self.store.get_run, run_id)
            result = CallResult(
                run_id, "failed", None, "interrupted: runnerd stopped before the run ended",
                (row.duration_ms or 0) if row is not None else 0,
            )  # fmt: skip
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

    async def _held_again(self, approval_id: str) -> CallResult | Pending | None:
        """A call retried with the Idempotency-Key of one held for approval: the same
        approval while it waits, the run it released once approved; None once denied or
        expired (the retry asks again)."""
        await self.approvals.expire()
        approval = await self.store.io(self.store.get_approval, approval_id)
        if approval is None:
            return None
        if approval.status == "pending":
            return Pending(approval.id, approval.expires_at)
        if approval.status == "approved" and approval.run_id is not None:
            return await self.outcome(approval.run_id)
        return None

    async def outcome(self, run_id: str) -> CallResult:
        """A run's result: awaited while it runs, from memory or its record after. A run
        just admitted (an approved one starts in a task) is waited for too."""
        deadline = time.monotonic() + MAX_CALL_WAIT_S
        while True:
            running = self._running.get(run_id)
            if running is not None:
                return await asyncio.shield(running)
            found = await self.recorded(run_id)
            if found.status != "running" or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.01)

    async def recorded(self, run_id: str) -> CallResult:
        """A run's result: from memory when this node holds it; for a finished run
        another node ran, from that node (govern/peers.py); else its record, with no
        output and ``missing`` saying why (OUTPUT_MISSING: never a silent null)."""
        cached = self.results.get(run_id)
        if cached is not None:
            return cached
        row = await self.store.io(self.store.get_run, run_id)
        assert row is not None
        duration = row.duration_ms or 0
        if row.status == "running":
            return CallResult(run_id, row.status, None, None, duration)
        if row.error_kind == "interrupted":
            return CallResult(
                run_id, row.status, None, RUN_INTERRUPTED, duration, "RUN_INTERRUPTED"
            )
        missing = "OUTPUT_EXPIRED"
        owner = await self.store.io(self.store.run_node, run_id)
        if owner is not None and owner != self.store.node_id:
            asked = await self._ask_owner(owner, run_id)
            if isinstance(asked, CallResult):
                return asked
            missing = asked
        return CallResult(run_id, row.status, None, None, duration, missing)

    async def _ask_owner(self, node_id: str, run_id: str) -> CallResult | str:
        """The result node ``node_id`` holds for ``run_id``, or why there is none."""
        found = await self.store.io(self.store.node_url, node_id)
        if found is None or not found[1]:
            return "OUTPUT_NODE_STOPPED"
        if found[0] is None:  # a node of a version before node URLs: it cannot be asked
            return "OUTPUT_NODE_UNREACHABLE"
        try:
            held = await self.peers.fetch(found[0], node_id, run_id)
        except PeerUnreachable as error:
            log.warning("node %s did not answer for run %s: %s", node_id, run_id, error)
            return "OUTPUT_NODE_UNREACHABLE"
        return "OUTPUT_EXPIRED" if held is None else held

    # --- approvals --------------------------------------------------------------------------

    async def decide(
        self, approval_id: str, *, approve: bool, who: Principal, call: CallOf | None = None
    ) -> ApprovalRow:
        """Approve (which releases exactly one run, started now) or deny an approval, on
        every surface: expiry, who may see and decide it, and whether it is of ``call``
        (the call a surface confirms) are Approvals.decide's, as is when it cannot be."""
        try:
            decided, held = await self.approvals.decide(
                approval_id, approve=approve, who=who, call=call
            )
            if held is None:
                return decided
            install = await self.store.io(self.store.get_install, decided.install_id)
            assert install is not None
            tool = await self.tool(install, decided.tool, decided.version_id)
            # Checked again, against the version it was held for (the compiled check is
            # cached): the run gets its encoding and its check time, on any node.
            checked = await self.pipeline.check_input(
                tool, held.value, key=tool_key(tool, decided.version_id)
            )
            run_id = await self._start_run(
                install,
                tool,
                held.who,
                decided.surface,
                decided.version_id,
                held.workflow_run_id,
                approval_id=approval_id,
            )
        except RunnerdError as exc:
            if exc.reason is not None and not isinstance(exc, ApprovalNotFound):
                await self._audit_decision_refusal(exc, approval_id, who)
            raise
        task = asyncio.ensure_future(
            self._approved_run(run_id, install, tool, held, checked, decided)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        found = await self.store.io(self.store.get_approval, approval_id)
        assert found is not None
        return found

    async def _audit_decision_refusal(
        self, exc: RunnerdError, approval_id: str, who: Principal
    ) -> None:
        """Audit a decision refused on an approval the decider may see (the asker or its
        budget no longer allowed, not an approver, no longer pending…) as ``tool.refuse``
        of the held call, with the approval's id: every refusal after the install is known
        is in the trail, whichever surface decided. One the decider may not see (not
        found) is not: it would file a stranger's probe in another workspace's trail."""
        approval = await self.store.io(self.store.get_approval, approval_id)
        if approval is None:
            return
        await self._refusal_entry(
            exc,
            who.user_id,
            who.key_id,
            workspace_id=approval.workspace_id,
            install_id=approval.install_id,
            version_id=approval.version_id,
            tool=approval.tool,
            surface=approval.surface,
            detail={"approvalId": approval_id},
        )

    async def _approved_run(
        self,
        run_id: str,
        install: InstallRecord,
        tool: ToolRecord,
        held: Held,
        checked: CheckedInput,
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
                    checked,
                    approval.surface,
                    slot,
                )

    async def drain(self, timeout: float) -> None:
        """Wait for approved runs still going (at shutdown); webhook deliveries still
        waiting are dropped."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)
        if self.approvals.notifier is not None:
            await self.approvals.notifier.close()
