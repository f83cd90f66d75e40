"""Who is asking, and may they: API keys, roles, the Apps module, scopes.

Kinds of key:
- personal: acts as its person, in every workspace the person belongs to;
- token: a personal key limited to its scopes (``api:read``, ``tools:run``,
  ``apps:write``);
- workspace: acts for a workspace, not a person. Seed 000: tool endpoints refuse it,
  "because a tool always runs for a person whose access can be checked". It may list,
  deploy and publish apps (a CI pipeline's key), nothing else.

The Manage page signs in with a session cookie instead (runnerd/web): a session acts
as its person's personal key, under exactly the same rules, and every request that
changes state must also carry the session's CSRF token in ``X-CSRF-Token``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request

from runnerd.api.sessions import CookieSigner
from runnerd.errors import (
    CsrfTokenInvalid,
    InstallNotFound,
    InsufficientRole,
    InsufficientScope,
    InvalidApiKey,
    Unauthenticated,
    WorkspaceKeyNotAllowed,
)
from runnerd.model import Role
from runnerd.roles import ROLE_RANK
from runnerd.store import InstallRecord, KeyRecord, MembershipRecord, SessionRecord, Store

if TYPE_CHECKING:
    from runnerd.api.state import AppState

__all__ = ["Caller", "authenticate", "bearer_or_key", "caller_of", "install_for", "session_key"]


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Caller:
    key: KeyRecord
    session: SessionRecord | None = None  # signed in on the Manage page

    @property
    def user_id(self) -> str | None:
        return self.key.user_id

    def need_scope(self, scope: str) -> None:
        if self.key.kind == "token" and scope not in self.key.scopes:
            raise InsufficientScope(scope)

    def need_person(self) -> str:
        """The person behind the key; a workspace key is refused."""
        if self.key.kind == "workspace" or self.key.user_id is None:
            raise WorkspaceKeyNotAllowed
        return self.key.user_id

    async def member(
        self, store: Store, workspace_id: str, *, role: Role, apps: bool = True
    ) -> MembershipRecord | None:
        """Check the caller may act in ``workspace_id`` with at least ``role`` (and the
        Apps module); 403 INSUFFICIENT_WORKSPACE_ROLE otherwise. A workspace key acts
        as a builder of its own workspace."""
        if self.key.kind == "workspace":
            if self.key.workspace_id == workspace_id and ROLE_RANK[role] <= ROLE_RANK["builder"]:
                return None
            raise InsufficientRole
        assert self.key.user_id is not None
        found = await store.io(store.membership, workspace_id, self.key.user_id)
        if (
            found is None
            or ROLE_RANK[found.role] < ROLE_RANK[role]
            or (apps and not found.apps_access)
        ):
            raise InsufficientRole
        return found


def bearer_or_key(request: Request) -> str:
    """The key of a request that may carry it either way: ``Authorization: Bearer …``
    (MCP clients, Prometheus) or ``X-API-Key``; empty when there is none."""
    bearer = request.headers.get("authorization", "")
    if bearer[:7].lower() == "bearer ":
        return bearer[7:].strip()
    return request.headers.get("x-api-key", "").strip()


async def caller_of(request: Request, state: AppState, scope: str) -> Caller:
    """Authenticate, check the token scope, and spend one rate-limit token: the first
    step of every authenticated route, always in this order (401, 403, 429)."""
    caller = await authenticate(request, state.store, state.cookies)
    caller.need_scope(scope)
    state.limiter.take(caller.key.id)
    return caller


async def authenticate(
    request: Request, store: Store, cookies: CookieSigner | None = None
) -> Caller:
    """The caller of ``request``: its X-API-Key header, else its session cookie (with the
    session's CSRF token on any request that changes state); 401 if neither is valid.
    Nothing is cached: the key, or the session and the key it was signed in with, are
    looked up on every request, and roles are checked afresh by ``Caller.member``."""
    plaintext = request.headers.get("x-api-key", "").strip()
    if plaintext:
        key = await store.io(store.find_key, plaintext)
        if key is None:
            raise InvalidApiKey
        return Caller(key)
    secret = cookies.secret_of(request) if cookies is not None else None
    if secret is None:
        raise Unauthenticated
    session = await store.io(store.find_session, secret)
    if session is None:
        raise Unauthenticated("The session has ended: sign in again")
    if request.method not in SAFE_METHODS:
        tokens = request.headers.getlist("x-csrf-token")  # two of them: no one token
        sent = tokens[0] if len(tokens) == 1 else ""
        if not hmac.compare_digest(sent.encode(), session.csrf.encode()):
            raise CsrfTokenInvalid
    return Caller(session_key(session), session)


def session_key(session: SessionRecord) -> KeyRecord:
    """The personal key a session acts as (its id names the session in the audit)."""
    return KeyRecord(
        id=session.id,
        kind="personal",
        user_id=session.user_id,
        workspace_id=None,
        scopes=(),
        name="Manage page session",
        prefix="",
        created_at="",
    )


async def install_for(
    request: Request, state: AppState, *, scope: str = "apps:write", role: Role = "admin"
) -> tuple[InstallRecord, Caller]:
    """The install of the path, for a person of at least ``role`` in its workspace (a
    token needs ``scope``); installs of other workspaces are not found."""
    caller = await caller_of(request, state, scope)
    user_id = caller.need_person()
    install = await state.store.io(state.store.get_install, request.path_params["installId"])
    if (
        install is None
        or await state.store.io(state.store.membership, install.workspace_id, user_id) is None
    ):
        raise InstallNotFound
    await caller.member(state.store, install.workspace_id, role=role)
    return install, caller
