"""Who approves an app's write calls from a relay (the Relay's rules), and the webhook a
workspace is told through when an approval waits.

A rule is per workspace and app: roles and people; when an app has one it replaces the
workspace default (the approver flag, or an admin) for that app's relay calls. The
webhook's signing secret is kept sealed by the vault (like a secret), never in the clear.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import msgspec

from runnerd.ids import utc_now
from runnerd.model import Role
from runnerd.store.audit import AuditStore

__all__ = ["ApprovalRule", "ApprovalRulesStore", "WebhookRow", "webhook_sealed_name"]


def webhook_sealed_name(workspace_id: str) -> str:
    """What a webhook's secret is sealed for (with the workspace as the vault's install):
    no ciphertext opens as a secret's or a held input's."""
    return f"webhook:{workspace_id}"


class ApprovalRule(msgspec.Struct, frozen=True):
    workspace_id: str
    app_id: str
    app_slug: str
    roles: tuple[Role, ...]
    user_ids: tuple[str, ...]
    updated_at: str
    updated_by: str | None = None

    def allows(self, user_id: str, role: Role) -> bool:
        """Whether a member of this role (and id) may decide under the rule."""
        return role in self.roles or user_id in self.user_ids


class WebhookRow(msgspec.Struct, frozen=True):
    workspace_id: str
    url: str
    # The signing secret, sealed by the vault (key id, nonce, ciphertext).
    secret_kid: str
    secret_nonce: bytes
    secret_sealed: bytes
    created_at: str
    updated_at: str
    updated_by: str | None = None


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _rule(row: dict[str, object]) -> ApprovalRule:
    return ApprovalRule(
        workspace_id=str(row["workspace_id"]),
        app_id=str(row["app_id"]),
        app_slug=str(row["app_slug"]),
        roles=tuple(json.loads(str(row["roles"]))),
        user_ids=tuple(json.loads(str(row["user_ids"]))),
        updated_at=str(row["updated_at"]),
        updated_by=row["updated_by"],  # type: ignore[arg-type]
    )


_RULES = """SELECT r.*, a.slug AS app_slug FROM approval_rules r
            JOIN apps a ON a.id = r.app_id"""


class ApprovalRulesStore(AuditStore):
    # --- rules ------------------------------------------------------------------------------

    def approval_rules(self, workspace_id: str) -> list[ApprovalRule]:
        """The rules of a workspace, by app slug."""
        rows = self.db.query(_RULES + " WHERE r.workspace_id = ? ORDER BY a.slug", [workspace_id])
        return [_rule(r) for r in rows]

    def approval_rule_of_install(self, install_id: str) -> ApprovalRule | None:
        """The rule of the app an install is of, in the install's workspace, if any."""
        rows = list(
            self.db.query(
                _RULES
                + """ JOIN installs i ON i.app_id = r.app_id
                             AND i.workspace_id = r.workspace_id WHERE i.id = ?""",
                [install_id],
            )
        )
        return _rule(rows[0]) if rows else None

    def set_approval_rule(
        self,
        workspace_id: str,
        app_id: str,
        *,
        roles: tuple[Role, ...],
        user_ids: tuple[str, ...],
        actor_user_id: str | None,
        actor_key_id: str | None,
    ) -> None:
        """Set (or replace) the rule of an app in a workspace; audited as
        ``approval_rule.set`` with its actor."""
        now = utc_now()
        with self._write():
            self.db.execute(
                """INSERT INTO approval_rules (workspace_id, app_id, roles, user_ids,
                   updated_at, updated_by) VALUES (?, ?, ?, ?, ?, ?)
                   ON CONFLICT (workspace_id, app_id) DO UPDATE SET roles = excluded.roles,
                   user_ids = excluded.user_ids, updated_at = excluded.updated_at,
                   updated_by = excluded.updated_by""",
                [workspace_id, app_id, json.dumps(list(roles)), json.dumps(list(user_ids)),
                 now, actor_user_id],
            )  # fmt: skip
            self._append_audit(
                "approval_rule.set",
                workspace_id=workspace_id,
                actor_user_id=actor_user_id,
                actor_key_id=actor_key_id,
                detail={"appId": app_id, "roles": list(roles), "userIds": list(user_ids)},
            )

    def delete_approval_rule(
        self,
        workspace_id: str,
        app_id: str,
        *,
        actor_user_id: str | None,
        actor_key_id: str | None,
    ) -> bool:
        """Drop an app's rule (its relay calls go back to the workspace default); audited
        as ``approval_rule.delete``. False when it had none."""
        with self._write():
            cur = self.db.execute(
                "DELETE FROM approval_rules WHERE workspace_id = ? AND app_id = ?",
                [workspace_id, app_id],
            )
            if cur.rowcount:
                self._append_audit(
                    "approval_rule.delete",
                    workspace_id=workspace_id,
                    actor_user_id=actor_user_id,
                    actor_key_id=actor_key_id,
                    detail={"appId": app_id},
                )
        return bool(cur.rowcount)

    # --- the webhook ------------------------------------------------------------------------

    def webhook(self, workspace_id: str) -> WebhookRow | None:
        rows = list(
            self.db.query("SELECT * FROM workspace_webhooks WHERE workspace_id = ?", [workspace_id])
        )
        return WebhookRow(**rows[0]) if rows else None

    def set_webhook(
        self,
        workspace_id: str,
        url: str,
        *,
        sealed: tuple[str, bytes, bytes] | None,
        actor_user_id: str | None,
        actor_key_id: str | None,
    ) -> WebhookRow:
        """Set the workspace's webhook: ``sealed`` is a new signing secret as the vault
        sealed it (None keeps the one it has; a new webhook must have one). Audited as
        ``webhook.set`` (the URL's origin and whether the secret is new; never the
        secret, nor the URL's path, which may carry a token)."""
        now = utc_now()
        new_secret = sealed is not None
        with self._write():
            current = self.webhook(workspace_id)
            if sealed is None:
                assert current is not None, "a new webhook needs a secret"
                sealed = (current.secret_kid, current.secret_nonce, current.secret_sealed)
            kid, nonce, ciphertext = sealed
            self.db.execute(
                """INSERT INTO workspace_webhooks (workspace_id, url, secret_kid, secret_nonce,
                   secret_sealed, created_at, updated_at, updated_by)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (workspace_id) DO UPDATE SET url = excluded.url,
                   secret_kid = excluded.secret_kid, secret_nonce = excluded.secret_nonce,
                   secret_sealed = excluded.secret_sealed, updated_at = excluded.updated_at,
                   updated_by = excluded.updated_by""",
                [workspace_id, url, kid, nonce, ciphertext,
                 current.created_at if current else now, now, actor_user_id],
            )  # fmt: skip
            self._append_audit(
                "webhook.set",
                workspace_id=workspace_id,
                actor_user_id=actor_user_id,
                actor_key_id=actor_key_id,
                # Its origin only: a webhook's path often carries a token of its own.
                detail={"origin": _origin(url), "newSecret": new_secret},
            )
        found = self.webhook(workspace_id)
        assert found is not None
        return found

    def delete_webhook(
        self, workspace_id: str, *, actor_user_id: str | None, actor_key_id: str | None
    ) -> bool:
        """Remove the workspace's webhook (audited as ``webhook.delete``); False if none."""
        with self._write():
            cur = self.db.execute(
                "DELETE FROM workspace_webhooks WHERE workspace_id = ?", [workspace_id]
            )
            if cur.rowcount:
                self._append_audit(
                    "webhook.delete",
                    workspace_id=workspace_id,
                    actor_user_id=actor_user_id,
                    actor_key_id=actor_key_id,
                )
        return bool(cur.rowcount)

    def sealed_webhooks(self) -> list[tuple[str, str, str, bytes, bytes]]:
        """Every webhook's secret, sealed: (workspace id, sealed name, key id, nonce,
        ciphertext), for a key rotation (SecretsStore.reseal_all stores them again)."""
        rows = self.db.execute(
            "SELECT workspace_id, secret_kid, secret_nonce, secret_sealed FROM workspace_webhooks"
        ).fetchall()
        return [(r[0], webhook_sealed_name(r[0]), r[1], bytes(r[2]), bytes(r[3])) for r in rows]
