"""OAuth 2.1 for MCP clients (runnerd/api/oauth.py): clients, authorization requests
waiting for consent, one-time codes and refresh tokens. Only hashes are stored.

An access token is a row of ``api_keys``: a key of kind ``token``, limited to the
granted scopes, bound to the consented workspace (``workspace_id``) and expiring
(``expires_at``), so every surface that takes a key takes it unchanged, and checks the
person's membership afresh on every request. A refresh token names its access key and
its *family* (every token rotated from one consent): it works once; a rotated one used
again revokes the whole family. Refreshing needs the person still in the workspace and
the family's keys not revoked by anyone else.
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from runnerd.ids import new_id, stamp, utc_now
from runnerd.store.audit import AuditStore
from runnerd.store.records import hash_key

__all__ = ["IssuedTokens", "OAuthStore"]

ACCESS_PREFIX = "rk_o_"  # an OAuth access token: an API key
REFRESH_PREFIX = "rr_o_"


def _later(seconds: float) -> str:
    return stamp(datetime.now(UTC) + timedelta(seconds=seconds))


class IssuedTokens(msgspec.Struct, frozen=True):
    """What a code or a refresh token was exchanged for (the plaintexts, shown once)."""

    access_token: str
    refresh_token: str
    expires_in: int
    scopes: tuple[str, ...]
    key_id: str
    user_id: str
    workspace_id: str


class OAuthStore(AuditStore):
    # --- clients ------------------------------------------------------------------------------

    def oauth_client(self, client_id: str) -> dict[str, Any] | None:
        """The stored client: kind, its metadata (``info``, JSON without any secret), the
        hash of its secret, when its document was fetched."""
        rows = list(self.db.query("SELECT * FROM oauth_clients WHERE client_id = ?", [client_id]))
        return rows[0] if rows else None

    def save_oauth_client(
        self, client_id: str, *, kind: str, info: dict[str, Any], secret: str | None
    ) -> None:
        """Register a client, or refresh a fetched metadata document's cached copy."""
        now = utc_now()
        with self._write():
            self.db.execute(
                """INSERT INTO oauth_clients
                   (client_id, kind, info, secret_hash, created_at, fetched_at)
                   VALUES (?, ?, ?, ?, ?, ?)
                   ON CONFLICT (client_id) DO UPDATE SET info = excluded.info,
                   fetched_at = excluded.fetched_at""",
                [client_id, kind, json.dumps(info), hash_key(secret) if secret else None, now, now],
            )
            if kind == "registered":
                self._append_audit(
                    "oauth.client.register",
                    detail={"clientId": client_id, "clientName": info.get("client_name")},
                )

    # --- authorization requests and consent ---------------------------------------------------

    def create_oauth_request(self, client_id: str, params: dict[str, Any], *, ttl_s: int) -> str:
        """An authorization request waiting for the person's consent; returns its id (the
        plaintext, in the consent page's address; only its hash is kept)."""
        request_id = secrets.token_urlsafe(24)
        with self._write():
            # What no longer works is forgotten as new requests come: requests and refresh
            # tokens past their expiry, codes a day after theirs (a code used again within
            # that day still revokes what it gave).
            now = utc_now()
            self.db.execute("DELETE FROM oauth_requests WHERE expires_at <= ?", [now])
            self.db.execute("DELETE FROM oauth_refresh_tokens WHERE expires_at <= ?", [now])
            self.db.execute("DELETE FROM oauth_codes WHERE expires_at <= ?", [_later(-86_400)])
            self.db.execute(
                """INSERT INTO oauth_requests (id_hash, client_id, params, created_at, expires_at)
                   VALUES (?, ?, ?, ?, ?)""",
                [hash_key(request_id), client_id, json.dumps(params), utc_now(), _later(ttl_s)],
            )
        return request_id

    def oauth_request(self, request_id: str) -> tuple[str, dict[str, Any]] | None:
        """(client id, params) of a live authorization request."""
        row = self.db.execute(
            "SELECT client_id, params FROM oauth_requests WHERE id_hash = ? AND expires_at > ?",
            [hash_key(request_id), utc_now()],
        ).fetchone()
        return None if row is None else (str(row[0]), json.loads(row[1]))

    def decide_oauth_request(
        self,
        request_id: str,
        *,
        allow: bool,
        user_id: str,
        workspace_id: str | None,
        scopes: tuple[str, ...],
        actor_key_id: str | None,
        code_ttl_s: int,
    ) -> tuple[str, dict[str, Any], str | None] | None:
        """Consent given or refused, once: the request is spent either way. Returns
        (client id, params, the one-time code when allowed); None if the request is not
        live. Audited in the workspace, with the person and the session."""
        with self._write():
            row = self.db.execute(
                """DELETE FROM oauth_requests WHERE id_hash = ? AND expires_at > ?
                   RETURNING client_id, params""",
                [hash_key(request_id), utc_now()],
            ).fetchone()
            if row is None:
                return None
            client_id, params = str(row[0]), json.loads(row[1])
            code = None
            if allow:
                code = secrets.token_urlsafe(32)
                self.db.execute(
                    """INSERT INTO oauth_codes (code_hash, client_id, user_id, workspace_id,
                       scopes, params, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
                    [hash_key(code), client_id, user_id, workspace_id, json.dumps(list(scopes)),
                     json.dumps(params), utc_now(), _later(code_ttl_s)],
                )  # fmt: skip
            self._append_audit(
                "oauth.consent.grant" if allow else "oauth.consent.deny",
                workspace_id=workspace_id,
                actor_user_id=user_id,
                actor_key_id=actor_key_id,
                detail={"clientId": client_id, "scopes": list(scopes)},
            )
        return client_id, params, code

    def oauth_code(self, code: str) -> dict[str, Any] | None:
        """A code, with its request's params and the consent's person, workspace and
        scopes; expired and used ones too: the token endpoint says which, and redeeming
        a used one again revokes what it was exchanged for."""
        rows = list(
            self.db.query("SELECT * FROM oauth_codes WHERE code_hash = ?", [hash_key(code)])
        )
        if not rows:
            return None
        row = rows[0]
        return {**row, "scopes": json.loads(row["scopes"]), "params": json.loads(row["params"])}

    # --- tokens -------------------------------------------------------------------------------

    def _member(self, workspace_id: str, user_id: str) -> bool:
        return (
            self.db.execute(
                "SELECT 1 FROM memberships WHERE workspace_id = ? AND user_id = ?",
                [workspace_id, user_id],
            ).fetchone()
            is not None
        )

    def _issue(
        self,
        action: str,
        *,
        family: str,
        client_id: str,
        client_name: str,
        user_id: str,
        workspace_id: str,
        scopes: tuple[str, ...],
        resource: str | None,
        access_ttl_s: int,
        refresh_ttl_s: int,
    ) -> IssuedTokens:
        """A new access key and refresh token of ``family`` (in the caller's transaction),
        audited as ``action`` (``oauth.token.issue`` or ``.refresh``) for the person."""
        access = f"{ACCESS_PREFIX}{secrets.token_urlsafe(32)}"
        refresh = f"{REFRESH_PREFIX}{secrets.token_urlsafe(32)}"
        key_id = new_id("key")
        now = utc_now()
        self.db.insert(
            "api_keys",
            {
                "id": key_id,
                "kind": "token",
                "user_id": user_id,
                "workspace_id": workspace_id,
                "scopes": json.dumps(list(scopes)),
                "name": f"OAuth: {client_name}"[:200],
                "key_hash": hash_key(access),
                "prefix": access[:10],
                "created_at": now,
                "revoked_at": None,
                "expires_at": _later(access_ttl_s),
            },
        )
        self.db.execute(
            """INSERT INTO oauth_refresh_tokens (token_hash, id, family, client_id, user_id,
               workspace_id, scopes, resource, access_key_id, created_at, expires_at)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            [hash_key(refresh), new_id("ort"), family, client_id, user_id, workspace_id,
             json.dumps(list(scopes)), resource, key_id, now, _later(refresh_ttl_s)],
        )  # fmt: skip
        self._append_audit(
            action,
            workspace_id=workspace_id,
            actor_user_id=user_id,
            actor_key_id=key_id,
            detail={"clientId": client_id, "keyId": key_id, "scopes": list(scopes)},
        )
        return IssuedTokens(access, refresh, access_ttl_s, scopes, key_id, user_id, workspace_id)

    def redeem_oauth_code(
        self, code: str, *, client_id: str, client_name: str, access_ttl_s: int, refresh_ttl_s: int
    ) -> IssuedTokens | None:
        """Exchange a live, unused code of ``client_id`` for tokens, once. A code used a
        second time revokes what it was exchanged for (RFC 6749 §4.1.2). None when the
        code is spent, expired or its person has left the workspace."""
        with self._write():
            now = utc_now()
            family = new_id("ofa")
            row = self.db.execute(
                """UPDATE oauth_codes SET used_at = ?, family = ?
                   WHERE code_hash = ? AND client_id = ? AND used_at IS NULL AND expires_at > ?
                   RETURNING user_id, workspace_id, scopes, params""",
                [now, family, hash_key(code), client_id, now],
            ).fetchone()
            if row is None:
                spent = self.db.execute(
                    "SELECT family FROM oauth_codes WHERE code_hash = ? AND used_at IS NOT NULL",
                    [hash_key(code)],
                ).fetchone()
                if spent is not None and spent[0]:
                    self._revoke_family(str(spent[0]), reason="code_reused")
                return None
            user_id, workspace_id = str(row[0]), str(row[1])
            if not self._member(workspace_id, user_id):
                return None
            issued = self._issue(
                "oauth.token.issue",
                family=family,
                client_id=client_id,
                client_name=client_name,
                user_id=user_id,
                workspace_id=workspace_id,
                scopes=tuple(json.loads(row[2])),
                resource=json.loads(row[3]).get("resource"),
                access_ttl_s=access_ttl_s,
                refresh_ttl_s=refresh_ttl_s,
            )
        return issued

    def oauth_refresh_token(self, refresh: str) -> dict[str, Any] | None:
        """A refresh token that still works: not rotated, not revoked, not expired."""
        rows = list(
            self.db.query(
                """SELECT * FROM oauth_refresh_tokens WHERE token_hash = ? AND rotated_at IS NULL
                   AND revoked_at IS NULL AND expires_at > ?""",
                [hash_key(refresh), utc_now()],
            )
        )
        return {**rows[0], "scopes": json.loads(rows[0]["scopes"])} if rows else None

    def rotate_oauth_refresh(
        self,
        refresh: str,
        *,
        client_id: str,
        client_name: str,
        scopes: tuple[str, ...],
        access_ttl_s: int,
        refresh_ttl_s: int,
    ) -> IssuedTokens | None:
        """A new access token and refresh token for a working refresh token of
        ``client_id``, which is spent. None when it does not work: used already (then
        its whole family is revoked: someone replayed it), revoked, expired, its person
        out of the workspace, or an access key of its family revoked."""
        with self._write():
            now = utc_now()
            row = self.db.execute(
                """UPDATE oauth_refresh_tokens SET rotated_at = ?
                   WHERE token_hash = ? AND client_id = ? AND rotated_at IS NULL
                     AND revoked_at IS NULL AND expires_at > ?
                   RETURNING family, user_id, workspace_id, resource""",
                [now, hash_key(refresh), client_id, now],
            ).fetchone()
            if row is None:
                replayed = self.db.execute(
                    """SELECT family FROM oauth_refresh_tokens
                       WHERE token_hash = ? AND rotated_at IS NOT NULL AND revoked_at IS NULL""",
                    [hash_key(refresh)],
                ).fetchone()
                if replayed is not None:
                    self._revoke_family(str(replayed[0]), reason="refresh_reused")
                return None
            family, user_id, workspace_id = str(row[0]), str(row[1]), str(row[2])
            cut = self.db.execute(
                """SELECT 1 FROM oauth_refresh_tokens r JOIN api_keys k ON k.id = r.access_key_id
                   WHERE r.family = ? AND k.revoked_at IS NOT NULL LIMIT 1""",
                [family],
            ).fetchone()
            if cut is not None or not self._member(workspace_id, user_id):
                self._revoke_family(family, reason="access_ended")
                return None
            issued = self._issue(
                "oauth.token.refresh",
                family=family,
                client_id=client_id,
                client_name=client_name,
                user_id=user_id,
                workspace_id=workspace_id,
                scopes=scopes,
                resource=row[3],
                access_ttl_s=access_ttl_s,
                refresh_ttl_s=refresh_ttl_s,
            )
        return issued

    def oauth_access_token(self, access: str) -> dict[str, Any] | None:
        """The live OAuth access key of this plaintext, with its client (for revocation)."""
        rows = list(
            self.db.query(
                """SELECT k.id AS key_id, k.user_id, k.workspace_id, k.scopes, k.expires_at,
                          r.client_id, r.family
                   FROM api_keys k JOIN oauth_refresh_tokens r ON r.access_key_id = k.id
                   WHERE k.key_hash = ? AND k.revoked_at IS NULL""",
                [hash_key(access)],
            )
        )
        return {**rows[0], "scopes": json.loads(rows[0]["scopes"])} if rows else None

    def revoke_oauth_family(self, family: str, *, actor_user_id: str | None) -> None:
        """RFC 7009: the token, and every access and refresh token of its consent."""
        with self._write():
            self._revoke_family(family, reason="revoked", actor_user_id=actor_user_id)

    def _revoke_family(self, family: str, *, reason: str, actor_user_id: str | None = None) -> None:
        now = utc_now()
        rows = self.db.execute(
            """UPDATE oauth_refresh_tokens SET revoked_at = ?
               WHERE family = ? AND revoked_at IS NULL RETURNING access_key_id, workspace_id,
               user_id, client_id""",
            [now, family],
        ).fetchall()
        keys = sorted({str(r[0]) for r in rows})
        for key_id in keys:
            self.db.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                [now, key_id],
            )
        if rows:
            self._append_audit(
                "oauth.token.revoke",
                workspace_id=str(rows[0][1]),
                actor_user_id=actor_user_id or str(rows[0][2]),
                detail={"clientId": str(rows[0][3]), "keyIds": keys, "reason": reason},
            )
