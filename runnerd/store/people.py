"""Workspaces, people, memberships and API keys."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from typing import Any

import msgspec

from runnerd.errors import LastAdmin
from runnerd.ids import new_id, utc_now
from runnerd.limits import IN_LIST_IDS
from runnerd.model import Role
from runnerd.store.audit import AuditStore
from runnerd.store.records import KeyRecord, MembershipRecord, UserRecord, WorkspaceRecord, hash_key


class PeopleStore(AuditStore):
    # --- People and keys --------------------------------------------------------------------

    def create_workspace(self, name: str, *, actor_user_id: str | None = None) -> WorkspaceRecord:
        record = WorkspaceRecord(id=new_id("ws"), name=name, created_at=utc_now())
        with self._write():
            self.db.insert("workspaces", msgspec.structs.asdict(record))
            self._append_audit(
                "workspace.create",
                workspace_id=record.id,
                actor_user_id=actor_user_id,
                detail={"name": name},
            )
        return record

    def get_workspace(self, workspace_id: str) -> WorkspaceRecord | None:
        rows = list(self.db.query("SELECT * FROM workspaces WHERE id = ?", [workspace_id]))
        return WorkspaceRecord(**rows[0]) if rows else None

    def has_workspace(self) -> bool:
        """Whether the store holds a workspace (one bootstrapped already)."""
        return self.db.execute("SELECT 1 FROM workspaces LIMIT 1").fetchone() is not None

    def find_user(self, email: str) -> UserRecord | None:
        """The user with this email (in any case), or None."""
        rows = list(self.db.query("SELECT * FROM users WHERE lower(email) = lower(?)", [email]))
        return UserRecord(**rows[0]) if rows else None

    def ensure_user(self, email: str, name: str | None = None) -> UserRecord:
        """The user with this email, created if new."""
        with self._write():
            found = self.find_user(email)
            if found is None:
                found = UserRecord(id=new_id("usr"), email=email, name=name, created_at=utc_now())
                self.db.insert("users", msgspec.structs.asdict(found))
        return found

    def get_user(self, user_id: str) -> UserRecord | None:
        rows = list(self.db.query("SELECT * FROM users WHERE id = ?", [user_id]))
        return UserRecord(**rows[0]) if rows else None

    def set_membership(
        self,
        workspace_id: str,
        user_id: str,
        *,
        role: Role | None = None,
        apps_access: bool | None = None,
        approver: bool | None = None,
        actor_user_id: str | None = None,
        actor_key_id: str | None = None,
    ) -> MembershipRecord:
        """Add a person to a workspace, or change their role, Apps-module access or
        approver flag (who may approve write calls from relays). LastAdmin when that
        would leave the workspace without an admin (checked inside the transaction)."""
        with self._write():
            current = self.membership(workspace_id, user_id)
            new_role = role or (current.role if current else "member")
            if current is not None and current.role == "admin" and new_role != "admin":
                self._keep_an_admin(workspace_id, user_id)
            access = (
                apps_access if apps_access is not None else bool(current and current.apps_access)
            )
            approves = approver if approver is not None else bool(current and current.approver)
            self.db.execute(
                """INSERT INTO memberships (workspace_id, user_id, role, apps_access,
                   created_at, approver) VALUES (?, ?, ?, ?, ?, ?)
                   ON CONFLICT (workspace_id, user_id)
                   DO UPDATE SET role = excluded.role, apps_access = excluded.apps_access,
                   approver = excluded.approver""",
                [workspace_id, user_id, new_role, int(access), utc_now(), int(approves)],
            )
            self._append_audit(
                "member.set",
                workspace_id=workspace_id,
                actor_user_id=actor_user_id,
                actor_key_id=actor_key_id,
                detail={
                    "userId": user_id,
                    "role": new_role,
                    "appsAccess": access,
                    "approver": approves,
                },
            )
        found = self.membership(workspace_id, user_id)
        assert found is not None
        return found

    def remove_member(
        self,
        workspace_id: str,
        user_id: str,
        *,
        actor_user_id: str | None = None,
        actor_key_id: str | None = None,
    ) -> bool:
        """Take a person out of a workspace (audited); False if they were not in it. Their
        keys stay (a personal key acts in each workspace of its person), but nothing of
        theirs acts here any more: every request checks the membership afresh. LastAdmin
        when they are the workspace's only admin."""
        with self._write():
            current = self.membership(workspace_id, user_id)
            if current is not None and current.role == "admin":
                self._keep_an_admin(workspace_id, user_id)
            cur = self.db.execute(
                "DELETE FROM memberships WHERE workspace_id = ? AND user_id = ?",
                [workspace_id, user_id],
            )
            if cur.rowcount:
                # Their dev pages of the workspace's installs: never served again, so gone.
                self.db.execute(
                    "DELETE FROM dev_pages WHERE user_id = ? AND install_id IN "
                    "(SELECT id FROM installs WHERE workspace_id = ?)",
                    [user_id, workspace_id],
                )
                self._append_audit(
                    "member.remove",
                    workspace_id=workspace_id,
                    actor_user_id=actor_user_id,
                    actor_key_id=actor_key_id,
                    detail={"userId": user_id},
                )
        return bool(cur.rowcount)

    def _keep_an_admin(self, workspace_id: str, leaving: str) -> None:
        """LastAdmin unless the workspace has an admin besides ``leaving`` (in the
        caller's write transaction, so two demotions at once cannot both pass)."""
        other = self.db.execute(
            """SELECT 1 FROM memberships
               WHERE workspace_id = ? AND role = 'admin' AND user_id <> ? LIMIT 1""",
            [workspace_id, leaving],
        ).fetchone()
        if other is None:
            raise LastAdmin

    def membership(self, workspace_id: str, user_id: str) -> MembershipRecord | None:
        row = self.db.execute(
            """SELECT role, apps_access, approver FROM memberships
               WHERE workspace_id = ? AND user_id = ?""",
            [workspace_id, user_id],
        ).fetchone()
        if row is None:
            return None
        return MembershipRecord(workspace_id, user_id, row[0], bool(row[1]), bool(row[2]))

    def create_key(
        self,
        *,
        kind: str,
        user_id: str | None = None,
        workspace_id: str | None = None,
        scopes: tuple[str, ...] = (),
        name: str = "",
        surface: str | None = None,
        audit_workspace_id: str | None = None,
        actor_user_id: str | None = None,
        actor_key_id: str | None = None,
    ) -> tuple[KeyRecord, str]:
        """A new API key; returns the record and the plaintext, which is never stored.
        ``surface`` binds a token to the surface its runs are recorded as (relay,
        workflow, chat; govern/people.py checks it).
        ``audit_workspace_id`` files the audit entry of a personal key under a workspace
        (with none, it is filed in each workspace of its holder: it acts in all of them);
        the entry's actor is ``actor_user_id`` (who made it; the holder when None)."""
        plaintext = f"rk_{kind[0]}_{secrets.token_urlsafe(30)}"
        record = KeyRecord(
            id=new_id("key"),
            kind=kind,
            user_id=user_id,
            workspace_id=workspace_id,
            scopes=scopes,
            name=name,
            prefix=plaintext[:10],
            created_at=utc_now(),
            surface=surface,
        )
        with self._write():
            self.db.insert(
                "api_keys",
                {
                    **msgspec.structs.asdict(record),
                    "scopes": json.dumps(list(scopes)),
                    "key_hash": hash_key(plaintext),
                    "revoked_at": None,
                },
            )
            self._append_audit_for_person(
                user_id,
                "key.create",
                workspace_id=workspace_id or audit_workspace_id,
                actor_user_id=actor_user_id or user_id,
                actor_key_id=actor_key_id,
                detail={
                    "keyId": record.id,
                    "userId": user_id,
                    "kind": kind,
                    "scopes": list(scopes),
                    "prefix": record.prefix,
                    **({"surface": surface} if surface else {}),
                },
            )
        return record, plaintext

    def find_key(self, plaintext: str) -> KeyRecord | None:
        """The live key whose hash matches, or None."""
        rows = list(
            self.db.query(
                """SELECT * FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL
                   AND (expires_at IS NULL OR expires_at > ?)""",
                [hash_key(plaintext), utc_now()],
            )
        )
        if not rows:
            return None
        row = rows[0]
        return KeyRecord(
            id=row["id"],
            kind=row["kind"],
            user_id=row["user_id"],
            workspace_id=row["workspace_id"],
            scopes=tuple(json.loads(row["scopes"])),
            name=row["name"],
            prefix=row["prefix"],
            created_at=row["created_at"],
            surface=row["surface"],
        )

    def members(self, workspace_id: str) -> list[dict[str, Any]]:
        """The people of a workspace: user id, email, role, Apps access, approver."""
        return list(
            self.db.query(
                """SELECT m.user_id, u.email, m.role, m.apps_access, m.approver, m.created_at
                   FROM memberships m JOIN users u ON u.id = m.user_id
                   WHERE m.workspace_id = ? ORDER BY u.email""",
                [workspace_id],
            )
        )

    def workspaces_of(self, user_id: str) -> list[dict[str, Any]]:
        """The workspaces a person belongs to, with their role there."""
        return list(
            self.db.query(
                """SELECT w.id, w.name, m.role, m.apps_access, m.approver
                   FROM memberships m JOIN workspaces w ON w.id = m.workspace_id
                   WHERE m.user_id = ? ORDER BY w.name""",
                [user_id],
            )
        )

    def keys_of_workspace(self, workspace_id: str) -> list[dict[str, Any]]:
        """The live keys that act in a workspace: its workspace keys, and the personal
        keys and tokens of its people. Never a hash."""
        return list(
            self.db.query(
                """SELECT k.id, k.kind, k.user_id, u.email, k.workspace_id, k.scopes, k.name,
                          k.prefix, k.created_at, k.surface
                   FROM api_keys k LEFT JOIN users u ON u.id = k.user_id
                   WHERE k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > ?)
                     AND (k.workspace_id = ? OR (k.workspace_id IS NULL AND k.user_id IN
                         (SELECT user_id FROM memberships WHERE workspace_id = ?)))
                   ORDER BY k.created_at""",
                [utc_now(), workspace_id, workspace_id],
            )
        )

    def is_admin_anywhere(self, user_id: str) -> bool:
        row = self.db.execute(
            "SELECT 1 FROM memberships WHERE user_id = ? AND role = 'admin' LIMIT 1", [user_id]
        ).fetchone()
        return row is not None

    def live_grants(self, grants: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of these (key id, workspace id) pairs still hold: the key is live and
        its person a member of the workspace (for open MCP sessions and streams)."""
        wanted = set(grants)
        keys = sorted({key_id for key_id, _ in wanted})
        found: set[tuple[str, str]] = set()
        for start in range(0, len(keys), IN_LIST_IDS):
            chunk = keys[start : start + IN_LIST_IDS]
            rows = self.db.execute(
                f"""SELECT k.id, m.workspace_id FROM api_keys k
                    JOIN memberships m ON m.user_id = k.user_id
                    WHERE k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > ?)
                      AND (k.workspace_id IS NULL OR k.workspace_id = m.workspace_id)
                      AND k.id IN ({", ".join("?" * len(chunk))})""",
                [utc_now(), *chunk],
            ).fetchall()
            found.update((str(r[0]), str(r[1])) for r in rows)
        return wanted & found

    def get_key(self, key_id: str) -> KeyRecord | None:
        row = self.db.execute(
            """SELECT id, kind, user_id, workspace_id, scopes, name, prefix, created_at,
                      surface
               FROM api_keys WHERE id = ? AND revoked_at IS NULL""",
            [key_id],
        ).fetchone()
        if row is None:
            return None
        return KeyRecord(row[0], row[1], row[2], row[3], tuple(json.loads(row[4])), *row[5:])

    def revoke_key(
        self,
        key_id: str,
        *,
        actor_user_id: str | None = None,
        actor_key_id: str | None = None,
        workspace_id: str | None = None,
    ) -> bool:
        """Revoke a live key, and in the same transaction end the Manage-page sessions
        signed in with it (both audited: in ``workspace_id``, or with none named, where
        the key acts: its workspace, or each workspace of its holder). False if there was
        no live key of that id."""
        with self._write():
            holder = self.db.execute(
                "SELECT user_id, workspace_id FROM api_keys WHERE id = ?", [key_id]
            ).fetchone()
            cur = self.db.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                [utc_now(), key_id],
            )
            if cur.rowcount:
                ended = sorted(
                    str(r[0])
                    for r in self.db.execute(
                        "DELETE FROM web_sessions WHERE key_id = ? RETURNING id", [key_id]
                    ).fetchall()
                )
                self._append_audit_for_person(
                    holder[0],
                    "key.revoke",
                    workspace_id=workspace_id or holder[1],
                    actor_user_id=actor_user_id,
                    actor_key_id=actor_key_id,
                    detail={"keyId": key_id, "sessionsEnded": ended},
                )
        return bool(cur.rowcount)
