"""Write calls held for a person's decision: which calls wait, who may decide, deciding
and expiring. A held call's input lives in memory only (Held); the store keeps the
approval's row, bound to the request's hash.

Deciding is the same on every surface (``Approvals.decide``): expired approvals expire
first, then the decider must see the approval and may run tools where it was held, the
confirmation must be of the call held (``CallOf``, when a surface confirms a call), and
the decider must be the one who may decide it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runnerd.errors import (
    ApprovalNotFound,
    ApprovalNotPending,
    ApprovalOfAnotherCall,
    ApprovalRequestLost,
    AskerNoLongerAllowed,
    InsufficientRole,
    NotAnApprover,
)
from runnerd.govern.admission import Principal, may_run, require_budget
from runnerd.govern.idempotency import request_hash
from runnerd.govern.results import Pending
from runnerd.model import Surface
from runnerd.run.pipeline import CheckedInput
from runnerd.store import ApprovalRow, InstallRecord, Store, ToolRecord

__all__ = ["APPROVAL_SURFACES", "Approvals", "CallOf", "Held"]

# Surfaces whose write calls wait for a person's approval: chat asks the person, a relay
# waits under its rules.
APPROVAL_SURFACES = ("chat", "relay")


@dataclass
class Held:
    """A write call waiting for approval: its input lives only here, in memory."""

    value: Any
    checked: CheckedInput  # checked once, when the call was made
    who: Principal
    workflow_run_id: str | None


@dataclass(frozen=True)
class CallOf:
    """The call a confirmation says it decides: the install, the tool and the input it
    was made with. An approval holds exactly one call, bound to its request's hash."""

    install_id: str
    tool: str
    value: Any

    def held_by(self, approval: ApprovalRow) -> bool:
        """Whether ``approval`` was held for this call."""
        return (
            approval.install_id == self.install_id
            and approval.tool == self.tool
            and approval.input_hash
            == request_hash(self.install_id, approval.version_id, self.tool, self.value)
        )


@dataclass
class Approvals:
    """The approvals of write calls, and the inputs of those still pending (in memory:
    a restart loses them, and approving one then is refused)."""

    store: Store
    ttl_s: int
    _held: dict[str, Held] = field(default_factory=dict)

    @staticmethod
    def needed(tool: ToolRecord, surface: Surface) -> bool:
        """Whether a call of ``tool`` from ``surface`` waits for approval."""
        return tool.effect == "write" and surface in APPROVAL_SURFACES

    async def hold(
        self,
        install: InstallRecord,
        tool: ToolRecord,
        *,
        version_id: str,
        fingerprint: str,
        surface: Surface,
        held: Held,
    ) -> Pending:
        """Hold a write call for approval (BudgetExhausted first if the month is spent:
        no one should approve what cannot run); its approval expires after ``ttl_s``."""
        await require_budget(self.store, install.id)
        approval = await self.store.io(
            self.store.create_approval,
            workspace_id=install.workspace_id,
            install_id=install.id,
            version_id=version_id,
            tool=tool.name,
            input_hash=fingerprint,
            surface=surface,
            requested_by=held.who.user_id,
            ttl_s=self.ttl_s,
        )
        self._held[approval.id] = held
        return Pending(approval.id, approval.expires_at)

    async def may_decide(self, approval: ApprovalRow, user_id: str) -> bool:
        """From chat, the person who asked decides; from a relay, an approver (or admin)."""
        if approval.surface == "chat":
            return approval.requested_by == user_id
        member = await self.store.io(self.store.membership, approval.workspace_id, user_id)
        return member is not None and (member.approver or member.role == "admin")

    async def decide(
        self, approval_id: str, *, approve: bool, who: Principal, call: CallOf | None = None
    ) -> tuple[ApprovalRow, Held | None]:
        """Approve or deny a pending approval: the decided row, and when approved the held
        call it releases (exactly once: the winner of two racing approvals gets it).

        In this order: approvals past their time expire (one that did is refused as
        expired, ApprovalNotPending); ApprovalNotFound unless the decider is in the
        approval's workspace; InsufficientRole unless they may run tools there;
        ApprovalOfAnotherCall when ``call`` (the call a surface confirms) is not the one
        held; NotAnApprover unless they may decide it (``may_decide``). An approval is
        approved only while its call can run: its input still held, the month not spent
        (BudgetExhausted), the asker still allowed to run tools; else
        ApprovalUnavailable, and it stays pending."""
        await self.expire()
        approval = await self.store.io(self.store.get_approval, approval_id)
        member = (
            None
            if approval is None
            else await self.store.io(self.store.membership, approval.workspace_id, who.user_id)
        )
        if approval is None or member is None:
            raise ApprovalNotFound
        if not may_run(member):
            raise InsufficientRole
        if call is not None and not call.held_by(approval):
            raise ApprovalOfAnotherCall("the confirmation does not match this call")
        if not await self.may_decide(approval, who.user_id):
            raise NotAnApprover(
                "from chat only the person who asked decides; from a relay, an approver",
            )
        if approve and approval.status == "pending":
            # Refuse before deciding, so the approval stays pending for a later try.
            if approval_id not in self._held:
                raise ApprovalRequestLost(
                    "the daemon restarted since the call was made, and calls waiting for "
                    "approval are kept in memory only: make the call again",
                )
            await require_budget(self.store, approval.install_id)
            # The run is the asker's: it runs only while they may still run tools there (a
            # person demoted or removed while the call waited gets nothing run for them).
            asker = await self.store.io(
                self.store.membership, approval.workspace_id, approval.requested_by
            )
            if not may_run(asker):
                raise AskerNoLongerAllowed(
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
            raise ApprovalNotPending(f"the approval is {status}")
        held = self._held.pop(approval_id, None)
        if not approve:
            return decided, None
        if held is None:  # only the winner of two racing approvals finds the input
            raise ApprovalNotPending("the approval was just decided")
        return decided, held

    async def expire(self) -> list[str]:
        """Expire approvals past their time, and forget their held inputs."""
        expired = await self.store.io(self.store.expire_approvals)
        for approval_id in expired:
            self._held.pop(approval_id, None)
        return expired
