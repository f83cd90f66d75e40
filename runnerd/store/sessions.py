"""Sign-in for the Manage page: one-time sign-in links and browser sessions.

Only hashes are stored: a link's token and a session's id are shown once (printed, or
set as a cookie) and looked up by their SHA-256. A link is good once, for a short time;
a session expires and can be ended (sign-out). A session signed in with a key records
that key, and dies with it: ``find_session`` never finds one whose key is revoked, and
revoking a key deletes its sessions (store/people.py).
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import msgspec

from runnerd.ids import stamp, utc_now
from runnerd.store.audit import AuditStore
from runnerd.store.records import hash_key

__all__ = ["SessionRecord", "SessionsStore"]


class SessionRecord(msgspec.Struct, frozen=True):
    id: str  # "ses_" and the first characters of the hash: a name for logs and audit
    user_id: str
    csrf: str  # the token every state-changing request of this session must carry
    expires_at: str
    key_id: str | None = None  # the key it was signed in with; None for a sign-in link


def _later(seconds: int) -> str:
    return stamp(datetime.now(UTC) + timedelta(seconds=seconds))


class SessionsStore(AuditStore):
    def create_login_link(
        self, user_id: str, *, ttl_s: int, actor_user_id: str | None = None
    ) -> str:
        """A one-time sign-in token for ``user_id`` (the plaintext; only its hash is kept),
        audited in each workspace of theirs as made by ``actor_user_id`` (the host's CLI)."""
        token = secrets.token_urlsafe(32)
        with self._write():
            self.db.execute(
                """INSERT INTO login_links (token_hash, user_id, created_at, expires_at)
                   VALUES (?, ?, ?, ?)""",
                [hash_key(token), user_id, utc_now(), _later(ttl_s)],
            )
            self._append_audit_for_person(
                user_id,
                "login_link.create",
                actor_user_id=actor_user_id,
                detail={"userId": user_id},
            )
        return token

    def use_login_link(self, token: str) -> str | None:
        """The person a live, unused link signs in; the link is spent. None otherwise."""
        with self._write():
            row = self.db.execute(
                """UPDATE login_links SET used_at = ?
                   WHERE token_hash = ? AND used_at IS NULL AND expires_at > ?
                   RETURNING user_id""",
                [utc_now(), hash_key(token), utc_now()],
            ).fetchone()
        return None if row is None else str(row[0])

    def create_session(
        self, user_id: str, *, ttl_s: int, via: str, key_id: str | None = None
    ) -> tuple[SessionRecord, str]:
        """A new session; returns it and its secret id (the cookie's value). ``key_id``
        names the key it was signed in with (``via="api_key"``): it lives no longer."""
        secret = secrets.token_urlsafe(32)
        digest = hash_key(secret)
        record = SessionRecord(
            id=f"ses_{digest[:16]}",
            user_id=user_id,
            csrf=secrets.token_urlsafe(24),
            expires_at=_later(ttl_s),
            key_id=key_id,
        )
        with self._write():
            self.db.execute("DELETE FROM web_sessions WHERE expires_at <= ?", [utc_now()])
            self.db.execute(
                """INSERT INTO web_sessions
                   (id_hash, id, user_id, csrf, created_at, expires_at, key_id)
                   VALUES (?, ?, ?, ?, ?, ?, ?)""",
                [digest, record.id, user_id, record.csrf, utc_now(), record.expires_at, key_id],
            )
            # One entry in each workspace of the person: a session acts in all of them.
            self._append_audit_for_person(
                user_id,
                "session.create",
                actor_user_id=user_id,
                actor_key_id=key_id,
                detail={"sessionId": record.id, "via": via},
            )
        return record, secret

    def find_session(self, secret: str) -> SessionRecord | None:
        """The live session of this secret: not expired, and its key (if it was signed in
        with one) not revoked. None otherwise."""
        row = self.db.execute(
            """SELECT s.id, s.user_id, s.csrf, s.expires_at, s.key_id FROM web_sessions s
               LEFT JOIN api_keys k ON k.id = s.key_id
               WHERE s.id_hash = ? AND s.expires_at > ?
                 AND (s.key_id IS NULL OR (k.id IS NOT NULL AND k.revoked_at IS NULL))""",
            [hash_key(secret), utc_now()],
        ).fetchone()
        return None if row is None else SessionRecord(*row)

    def end_session(self, secret: str) -> bool:
        """End the session of ``secret`` (sign-out), audited as ``session.end`` in each
        workspace of its person, by the session itself (its id is its key's in the trail);
        False if there was none."""
        with self._write():
            row = self.db.execute(
                "DELETE FROM web_sessions WHERE id_hash = ? RETURNING id, user_id",
                [hash_key(secret)],
            ).fetchone()
            if row is not None:
                self._append_audit_for_person(
                    str(row[1]),
                    "session.end",
                    actor_user_id=str(row[1]),
                    actor_key_id=str(row[0]),
                    detail={"sessionId": str(row[0])},
                )
        return row is not None
