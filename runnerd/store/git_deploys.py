"""Each workspace's Git deploys: per app, the repository its push webhook fetches, the
refs it deploys, the app's folder in the repository, and the webhook's signing secret,
kept sealed by the vault (as the approvals webhook's secret), never in the clear."""

from __future__ import annotations

from typing import Any

import msgspec

from runnerd.ids import utc_now
from runnerd.store.audit import AuditStore

__all__ = ["GitDeployRow", "GitDeploysStore", "git_deploy_sealed_name"]


def git_deploy_sealed_name(workspace_id: str, app_slug: str) -> str:
    """What a Git deploy's secret is sealed for (the workspace as the vault's install):
    no other ciphertext opens as it."""
    return f"git-deploy:{workspace_id}:{app_slug}"


class GitDeployRow(msgspec.Struct, frozen=True):
    workspace_id: str
    app_slug: str
    repository: str
    ref_pattern: str
    path: str
    secret_kid: str
    secret_nonce: bytes
    secret_sealed: bytes
    created_at: str
    updated_at: str
    updated_by: str | None = None


def _row(row: dict[str, Any]) -> GitDeployRow:
    return GitDeployRow(
        **{**row, "secret_nonce": bytes(row["secret_nonce"]),
           "secret_sealed": bytes(row["secret_sealed"])}
    )  # fmt: skip


class GitDeploysStore(AuditStore):
    def git_deploy(self, workspace_id: str, app_slug: str) -> GitDeployRow | None:
        rows = list(
            self.db.query(
                "SELECT * FROM git_deploys WHERE workspace_id = ? AND app_slug = ?",
                [workspace_id, app_slug],
            )
        )
        return _row(rows[0]) if rows else None

    def git_deploys(self, workspace_id: str) -> list[GitDeployRow]:
        rows = self.db.query(
            "SELECT * FROM git_deploys WHERE workspace_id = ? ORDER BY app_slug", [workspace_id]
        )
        return [_row(r) for r in rows]

    def set_git_deploy(
        self,
        workspace_id: str,
        app_slug: str,
        *,
        repository: str,
        ref_pattern: str,
        path: str,
        sealed: tuple[str, bytes, bytes] | None,
        actor_user_id: str | None,
        actor_key_id: str | None,
    ) -> GitDeployRow:
        """Set (or replace) an app's Git deploy: ``sealed`` is a new signing secret as the
        vault sealed it (None keeps the one it has; a new one must have one). Audited as
        ``git_deploy.set`` (the repository, refs and folder; never the secret)."""
        now, new_secret = utc_now(), sealed is not None
        with self._write():
            current = self.git_deploy(workspace_id, app_slug)
            if sealed is None:
                assert current is not None, "a new Git deploy needs a secret"
                sealed = (current.secret_kid, current.secret_nonce, current.secret_sealed)
            kid, nonce, ciphertext = sealed
            self.db.execute(
                """INSERT INTO git_deploys (workspace_id, app_slug, repository, ref_pattern,
                   path, secret_kid, secret_nonce, secret_sealed, created_at, updated_at,
                   updated_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (workspace_id, app_slug) DO UPDATE SET
                   repository = excluded.repository, ref_pattern = excluded.ref_pattern,
                   path = excluded.path, secret_kid = excluded.secret_kid,
                   secret_nonce = excluded.secret_nonce, secret_sealed = excluded.secret_sealed,
                   updated_at = excluded.updated_at, updated_by = excluded.updated_by""",
                [workspace_id, app_slug, repository, ref_pattern, path, kid, nonce, ciphertext,
                 current.created_at if current else now, now, actor_user_id],
            )  # fmt: skip
            self._append_audit(
                "git_deploy.set",
                workspace_id=workspace_id,
                actor_user_id=actor_user_id,
                actor_key_id=actor_key_id,
                detail={"appSlug": app_slug, "repository": repository, "ref": ref_pattern,
                        "path": path, "newSecret": new_secret},
            )  # fmt: skip
        found = self.git_deploy(workspace_id, app_slug)
        assert found is not None
        return found

    def delete_git_deploy(
        self,
        workspace_id: str,
        app_slug: str,
        *,
        actor_user_id: str | None,
        actor_key_id: str | None,
    ) -> bool:
        """Remove an app's Git deploy (audited as ``git_deploy.delete``); False if none."""
        with self._write():
            cur = self.db.execute(
                "DELETE FROM git_deploys WHERE workspace_id = ? AND app_slug = ?",
                [workspace_id, app_slug],
            )
            if cur.rowcount:
                self._append_audit(
                    "git_deploy.delete",
                    workspace_id=workspace_id,
                    actor_user_id=actor_user_id,
                    actor_key_id=actor_key_id,
                    detail={"appSlug": app_slug},
                )
        return bool(cur.rowcount)

    def sealed_git_deploys(self) -> list[tuple[str, str, str, str, bytes, bytes]]:
        """Every Git deploy's secret, sealed: (workspace id, app slug, sealed name, key id,
        nonce, ciphertext), for a key rotation (SecretsStore.reseal_all stores them again)."""
        rows = self.db.execute(
            "SELECT workspace_id, app_slug, secret_kid, secret_nonce, secret_sealed "
            "FROM git_deploys"
        ).fetchall()
        return [
            (r[0], r[1], git_deploy_sealed_name(r[0], r[1]), r[2], bytes(r[3]), bytes(r[4]))
            for r in rows
        ]
