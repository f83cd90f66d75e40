"""Approvals of write calls from chat and relays.

An approval is bound to the SHA-256 of the request (install, version, tool and input).
While it is pending it also keeps the input, sealed by the vault (the secrets key, which
every node of a cluster has), so any node can release the call, after a restart too; the
sealed input is cleared in the same write that decides or expires the approval.
"""

from __future__ import annotations

from datetime import timedelta

import msgspec

from runnerd.ids import new_id, stamp
from runnerd.model import ApprovalStatus, Surface
from runnerd.store.audit import AuditStore


class ApprovalRow(msgspec.Struct, frozen=True):
    id: str
    workspace_id: str
    install_id: str
    version_id: str
    tool: str
    input_hash: str
    surface: Surface
    requested_by: str
    status: ApprovalStatus
    created_at: str
    expires_at: str
    decided_by: str | None = None
    decided_at: str | None = None
    run_id: str | None = None
    # While pending: the call's input sealed by the vault (key id, nonce, ciphertext), and
    # the key and workflow run it was made with. Never on the wire, never in the audit.
    sealed_kid: str | None = None
    sealed_nonce: bytes | None = None
    sealed_input: bytes | None = None
    key_id: str | None = None
    workflow_run_id: str | None = None
    # Read with list_approvals: the app and the version the call was made to.
    app_slug: str | None = None
    version: str | None = None


_WITH_APP = """SELECT a.*, p.slug AS app_slug, v.version AS version FROM approvals a
               LEFT JOIN app_versions v ON v.id = a.version_id
               LEFT JOIN apps p ON p.id = v.app_id"""


class ApprovalsStore(AuditStore):
    def create_approval(
        self,
        *,
        workspace_id: str,
        install_id: str,
        version_id: str,
        tool: str,
        input_hash: str,
        surface: Surface,
        requested_by: str,
        ttl_s: int,
        approval_id: str | None = None,
        sealed: tuple[str, bytes, bytes] | None = None,
        key_id: str | None = None,
        workflow_run_id: str | None = None,
        idempotency: tuple[str, str] | None = None,
    ) -> ApprovalRow:
        """Hold a call: ``sealed`` is its input as the vault sealed it (key id, nonce,
        ciphertext) for ``approval_id``; the idempotency key that claimed the call
        (``idempotency``: user id, key) is given the approval in the same write. Its
        times are the database's (db_now): every node expires it at the same moment."""
        now = self.db_now()
        kid, nonce, ciphertext = sealed or (None, None, None)
        row = ApprovalRow(
            id=approval_id or new_id("apr"),
            workspace_id=workspace_id,
            install_id=install_id,
            version_id=version_id,
            tool=tool,
            input_hash=input_hash,
            surface=surface,
            requested_by=requested_by,
            status="pending",
            created_at=stamp(now),
            expires_at=stamp(now + timedelta(seconds=ttl_s)),
            sealed_kid=kid,
            sealed_nonce=nonce,
            sealed_input=ciphertext,
            key_id=key_id,
            workflow_run_id=workflow_run_id,
        )
        with self._transaction():
            stored = msgspec.structs.asdict(row)
            del stored["app_slug"], stored["version"]  # read with the list, not kept
            self.db.insert("approvals", stored)
            if idempotency is not None:
                self.db.execute(
                    "UPDATE idempotency SET approval_id = ? WHERE user_id = ? AND key = ?",
                    [row.id, *idempotency],
                )
            self._append_audit(
                "approval.request",
                workspace_id=workspace_id,
                install_id=install_id,
                version_id=version_id,
                tool=tool,
                surface=surface,
                actor_user_id=requested_by,
                actor_key_id=key_id,
                detail={"approvalId": row.id},
            )
        return row

    def get_approval(self, approval_id: str) -> ApprovalRow | None:
        rows = list(self.db.query("SELECT * FROM approvals WHERE id = ?", [approval_id]))
        return ApprovalRow(**rows[0]) if rows else None

    def pending_approvals(self) -> int:
        """How many write calls wait for a decision now (all workspaces)."""
        row = self.db.execute("SELECT count(*) FROM approvals WHERE status = 'pending'").fetchone()
        return int(row[0])

    def find_approval(self, approval_id: str) -> ApprovalRow | None:
        """One approval with its app's slug and version, as list_approvals reads them."""
        rows = list(self.db.query(_WITH_APP + " WHERE a.id = ?", [approval_id]))
        return ApprovalRow(**rows[0]) if rows else None

    def list_approvals(self, workspace_id: str, status: str | None = None) -> list[ApprovalRow]:
        """Approvals of a workspace, newest first, with their app's slug and version
        (expire_approvals first to see expiries)."""
        sql = _WITH_APP + " WHERE a.workspace_id = ?"
        args: list[str] = [workspace_id]
        if status:
            sql, args = sql + " AND a.status = ?", [*args, status]
        return [ApprovalRow(**r) for r in self.db.query(sql + " ORDER BY a.id DESC", args)]

    def decide_approval(
        self, approval_id: str, *, approve: bool, user_id: str, key_id: str | None = None
    ) -> ApprovalRow | None:
        """Move a pending, unexpired approval to approved or denied, exactly once (a
        conditional update: of two racing decisions, one wins). None when it was not
        pending any more, or has expired."""
        status = "approved" if approve else "denied"
        now = stamp(self.db_now())
        with self._transaction():
            cur = self.db.execute(
                """UPDATE approvals SET status = ?, decided_by = ?, decided_at = ?,
                   sealed_kid = NULL, sealed_nonce = NULL, sealed_input = NULL
                   WHERE id = ? AND status = 'pending' AND expires_at > ?""",
                [status, user_id, now, approval_id, now],
            )
            if not cur.rowcount:
                return None
            row = self.get_approval(approval_id)
            assert row is not None
            self._append_audit(
                f"approval.{'approve' if approve else 'deny'}",
                workspace_id=row.workspace_id,
                install_id=row.install_id,
                version_id=row.version_id,
                tool=row.tool,
                surface=row.surface,
                actor_user_id=user_id,
                actor_key_id=key_id,
                detail={"approvalId": approval_id},
            )
        return row

    def expire_approvals(self) -> list[str]:
        """Mark every pending approval past its time (on the database's clock) as
        expired, and audit each."""
        now = stamp(self.db_now())
        expired = []
        with self._transaction():
            rows = self.db.execute(
                """SELECT id, workspace_id, install_id, version_id, tool, surface FROM approvals
                   WHERE status = 'pending' AND expires_at <= ? ORDER BY workspace_id, id""",
                [now],
            ).fetchall()
            for approval_id, ws, install_id, version_id, tool, surface in rows:
                cur = self.db.execute(  # conditional: a decision (or another node) may win
                    "UPDATE approvals SET status = 'expired', decided_at = ?, sealed_kid = NULL, "
                    "sealed_nonce = NULL, sealed_input = NULL WHERE id = ? AND status = 'pending'",
                    [now, approval_id],
                )
                if not cur.rowcount:
                    continue
                expired.append(approval_id)
                self._append_audit(
                    "approval.expire",
                    workspace_id=ws,
                    install_id=install_id,
                    version_id=version_id,
                    tool=tool,
                    surface=surface,
                    detail={"approvalId": approval_id},
                )
        return expired
