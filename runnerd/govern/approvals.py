"""Write calls held for a person's decision: which calls wait, who may decide, deciding
and expiring. The store keeps the approval's row, bound to the request's hash, and while
it waits the call's input sealed by the vault (AES-GCM with the secrets key, bound to the
approval's id): any node of the cluster may release it, after a restart too.

Deciding is the same on every surface (``Approvals.decide``): expired approvals expire
first, then the decider must see the approval and may run tools where it was held, the
confirmation must be of the call held (``CallOf``, when a surface confirms a call), and
the decider must be the one who may decide it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from runnerd.errors import (
    ApprovalNotFound,
    ApprovalNotPending,
    ApprovalOfAnotherCall,
    ApprovalRequestLost,
    AskerNoLongerAllowed,
    InsufficientRole,
    NotAnApprover,
    RunnerdError,
)
from runnerd.govern.admission import Principal, may_run, require_budget
from runnerd.govern.idempotency import request_hash
from runnerd.govern.notify import Notifier
from runnerd.govern.results import Pending
from runnerd.ids import new_id
from runnerd.model import Surface
from runnerd.store import (
    ApprovalRow,
    ApprovalRule,
    InstallRecord,
    MembershipRecord,
    Store,
    ToolRecord,
)
from runnerd.vault import Vault

__all__ = ["APPROVAL_SURFACES", "Approvals", "CallOf", "Held", "sealed_name"]

# Surfaces whose write calls wait for a person's approval: chat asks the person, a relay
# waits under its rules.
APPROVAL_SURFACES = ("chat", "relay")


@dataclass
class Held:
    """A write call waiting for approval: its input (checked when the call was made; it
    is checked again, against the same version, when released), who made it and with
    which key, the workflow run it belongs to, and the Idempotency-Key it came with (a
    retry with that key finds this approval instead of holding another)."""

    value: Any
    who: Principal
    workflow_run_id: str | None
    idempotency_key: str | None = None


def sealed_name(approval_id: str) -> str:
    """What a held input is sealed for, with its install: no ciphertext opens as another
    approval's, or as a secret."""
    return f"approval:{approval_id}"


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
    """The approvals of write calls; the inputs of those pending are sealed in the store."""

    store: Store
    ttl_s: int
    vault: Vault
    # Tells the workspace's webhook that an approval waits (off the call's path).
    notifier: Notifier | None = None

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
        approval_id = new_id("apr")
        sealed = self.vault.seal(
            install.id, sealed_name(approval_id), msgspec.json.encode(held.value).decode()
        )
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
            approval_id=approval_id,
            sealed=sealed,
            key_id=held.who.key_id,
            workflow_run_id=held.workflow_run_id,
            idempotency=None
            if held.idempotency_key is None
            else (held.who.user_id, held.idempotency_key),
        )
        # The webhook is for calls others decide: a chat call is its asker's alone, asked
        # in their client (or sent to the Manage page by the answer itself).
        if self.notifier is not None and surface != "chat":
            self.notifier.approval_waiting(approval, install.app_slug)
        return Pending(approval.id, approval.expires_at)

    @staticmethod
    def decides(
        approval: ApprovalRow,
        user_id: str,
        member: MembershipRecord | None,
        rule: ApprovalRule | None = None,
    ) -> bool:
        """From chat, the person who asked decides; from a relay, the roles and people of
        the app's approval rule (``rule``) when it has one, else an approver (or admin):
        ``member`` is the standing of ``user_id`` in the approval's workspace."""
        if approval.surface == "chat":
            return approval.requested_by == user_id
        if member is None:
            return False
        if rule is not None:
            return rule.allows(user_id, member.role)
        return member.approver or member.role == "admin"

    def _standing(
        self, approval: ApprovalRow, user_id: str
    ) -> tuple[MembershipRecord | None, ApprovalRule | None]:
        return (
            self.store.membership(approval.workspace_id, user_id),
            self.store.approval_rule_of_install(approval.install_id),
        )

    async def may_decide(self, approval: ApprovalRow, user_id: str) -> bool:
        """Whether ``user_id`` may decide ``approval`` (``decides``, their standing and
        the app's rule read)."""
        if approval.surface == "chat":
            return self.decides(approval, user_id, None)
        member, rule = await self.store.io(self._standing, approval, user_id)
        return self.decides(approval, user_id, member, rule)

    def held_input(self, approval: ApprovalRow) -> tuple[bool, Any]:
        """(True, the input) a pending approval holds, for the people who may decide it
        (the caller checks that); (False, None) when it holds none, or none that opens."""
        if approval.status != "pending":
            return False, None
        try:
            return True, self._unseal(approval).value
        except ApprovalRequestLost:
            return False, None

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
                "from chat only the person who asked decides; from a relay, the people the "
                "app's approval rule names, else an approver or an admin",
            )
        held: Held | None = None
        if approve and approval.status == "pending":
            # Refuse before deciding, so the approval stays pending for a later try.
            held = self._unseal(approval)
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
        if not approve:
            return decided, None
        # Only the winner of two racing decisions (on any node) got the row back.
        assert held is not None
        return decided, held

    def _unseal(self, approval: ApprovalRow) -> Held:
        """The call an approval holds, opened from its sealed input (ApprovalRequestLost
        when it cannot be: held before inputs were kept, or sealed with a key since
        rotated away)."""
        if approval.sealed_input is None or approval.sealed_nonce is None:
            raise ApprovalRequestLost(
                "the input of this call is not kept (it was held by a daemon older than "
                "this store's sealed approvals): deny it, and make the call again",
            )
        try:
            raw = self.vault.open(
                approval.install_id,
                sealed_name(approval.id),
                approval.sealed_kid or "",
                approval.sealed_nonce,
                approval.sealed_input,
            )
        except RunnerdError:
            raise ApprovalRequestLost(
                "the input of this call was sealed with a secrets key this daemon does not "
                "have (rotated since, or another key on this node): deny it, and make the "
                "call again",
            ) from None
        return Held(
            msgspec.json.decode(raw),
            Principal(approval.requested_by, approval.key_id),
            approval.workflow_run_id,
        )

    async def expire(self) -> list[str]:
        """Expire approvals past their time (their sealed inputs are cleared with them)."""
        return await self.store.io(self.store.expire_approvals)
