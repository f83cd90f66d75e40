"""Per-install secrets, sealed (runnerd/vault.py) before they reach this table."""

from __future__ import annotations

from collections.abc import Sequence

from runnerd.ids import utc_now
from runnerd.store.audit import AuditStore

SealedRow = tuple[str, str, str, bytes, bytes]  # install id, name, key id, nonce, ciphertext


class SecretsStore(AuditStore):
    def put_secret(
        self,
        install_id: str,
        name: str,
        sealed: tuple[str, bytes, bytes],
        *,
        workspace_id: str,
        user_id: str | None,
        key_id: str | None = None,
    ) -> str:
        """Set (or replace) a secret; audited by name, never by value."""
        kid, nonce, ciphertext = sealed
        now = utc_now()
        with self._write():
            self.db.execute(
                """INSERT INTO install_secrets VALUES (?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (install_id, name) DO UPDATE SET key_id = excluded.key_id,
                   nonce = excluded.nonce, ciphertext = excluded.ciphertext,
                   updated_at = excluded.updated_at, updated_by = excluded.updated_by""",
                [install_id, name, kid, nonce, ciphertext, now, user_id],
            )
            self._append_audit(
                "secret.set",
                workspace_id=workspace_id,
                install_id=install_id,
                actor_user_id=user_id,
                actor_key_id=key_id,
                detail={"name": name},
            )
        return now

    def delete_secret(
        self,
        install_id: str,
        name: str,
        *,
        workspace_id: str,
        user_id: str | None,
        key_id: str | None = None,
    ) -> bool:
        with self._write():
            cur = self.db.execute(
                "DELETE FROM install_secrets WHERE install_id = ? AND name = ?", [install_id, name]
            )
            if cur.rowcount:
                self._append_audit(
                    "secret.delete",
                    workspace_id=workspace_id,
                    install_id=install_id,
                    actor_user_id=user_id,
                    actor_key_id=key_id,
                    detail={"name": name},
                )
        return bool(cur.rowcount)

    def secret_key_ids(self) -> set[str]:
        """The ids of the keys the stored secrets are sealed with."""
        rows = self.db.execute("SELECT DISTINCT key_id FROM install_secrets").fetchall()
        return {str(row[0]) for row in rows}

    def secret_names(self, install_id: str) -> list[tuple[str, str]]:
        """(name, updated at) of each secret of the install; never a value."""
        rows = self.db.execute(
            "SELECT name, updated_at FROM install_secrets WHERE install_id = ? ORDER BY name",
            [install_id],
        ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def sealed_secrets(self, install_id: str | None = None) -> list[SealedRow]:
        sql = "SELECT install_id, name, key_id, nonce, ciphertext FROM install_secrets"
        rows = (
            self.db.execute(sql + " WHERE install_id = ?", [install_id]).fetchall()
            if install_id
            else self.db.execute(sql).fetchall()
        )
        return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    def sealed_approvals(self) -> list[SealedRow]:
        """The inputs of pending approvals, sealed: (approval id, install id, key id, nonce,
        ciphertext)."""
        rows = self.db.execute(
            """SELECT id, install_id, sealed_kid, sealed_nonce, sealed_input FROM approvals
               WHERE status = 'pending' AND sealed_input IS NOT NULL"""
        ).fetchall()
        return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    def reseal_all(
        self,
        rows: list[SealedRow],
        new_key_id: str,
        approvals: Sequence[SealedRow] = (),
        *,
        actor_user_id: str | None = None,
        webhooks: Sequence[tuple[str, str, bytes, bytes]] = (),
        git_deploys: Sequence[tuple[str, str, str, bytes, bytes]] = (),
    ) -> None:
        """Replace every sealed secret, the sealed inputs of pending approvals
        (``approvals``, as sealed_approvals gives them) and the webhooks' signing secrets
        (``webhooks``: workspace id, key id, nonce, ciphertext), in one transaction: a key
        rotation. ``git_deploys``: the Git deploys' signing secrets (workspace id, app
        slug, key id, nonce, ciphertext)."""
        with self._write():
            for workspace_id, slug, kid, nonce, ciphertext in git_deploys:
                self.db.execute(
                    """UPDATE git_deploys SET secret_kid = ?, secret_nonce = ?,
                       secret_sealed = ? WHERE workspace_id = ? AND app_slug = ?""",
                    [kid, nonce, ciphertext, workspace_id, slug],
                )
            for workspace_id, kid, nonce, ciphertext in webhooks:
                self.db.execute(
                    """UPDATE workspace_webhooks SET secret_kid = ?, secret_nonce = ?,
                       secret_sealed = ? WHERE workspace_id = ?""",
                    [kid, nonce, ciphertext, workspace_id],
                )
            for approval_id, _install, kid, nonce, ciphertext in approvals:
                self.db.execute(
                    """UPDATE approvals SET sealed_kid = ?, sealed_nonce = ?, sealed_input = ?
                       WHERE id = ? AND sealed_input IS NOT NULL""",
                    [kid, nonce, ciphertext, approval_id],
                )
            for install_id, name, kid, nonce, ciphertext in rows:
                self.db.execute(
                    """UPDATE install_secrets SET key_id = ?, nonce = ?, ciphertext = ?
                       WHERE install_id = ? AND name = ?""",
                    [kid, nonce, ciphertext, install_id, name],
                )
            self._append_audit(
                "secrets.rotate_key",
                actor_user_id=actor_user_id,
                detail={"keyId": new_key_id, "secrets": len(rows), "approvals": len(approvals)},
            )
