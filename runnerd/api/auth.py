"""Who is asking, and may they: API keys, roles, the Apps module, scopes.

Kinds of key:
- personal: acts as its person, in every workspace the person belongs to;
- token: a personal key limited to its scopes (``api:read``, ``tools:run``,
  ``apps:write``); an OAuth access token (api/oauth.py) is one bound to one workspace,
  that expires;
- workspace: acts for a workspace, not a person. Seed 000: tool endpoints refuse it,
  "because a tool always runs for a person whose access can be checked". It may list,
  deploy and publish apps (a CI pipeline's key), nothing else.

The Manage page signs in with a session cookie instead (runnerd/web): a session acts
as its person's personal key, under exactly the same rules, and every request that
changes state must also carry the session's CSRF token in ``X-CSRF-Token``.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from starlette.requests import Request

from runnerd.api.sessions import CookieSigner
from runnerd.errors import (
    CsrfTokenInvalid,
    InstallNotFound,
    InsufficientRole,
    InsufficientScope,
    InvalidApiKey,
    RunnerdError,
    Unauthenticated,
    WorkspaceKeyNotAllowed,
    WorkspaceNotFound,
)
from runnerd.govern.admission import Principal, at_least, has_role
from runnerd.model import Role
from runnerd.store import InstallRecord, KeyRecord, MembershipRecord, SessionRecord, Store

if TYPE_CHECKING:
    from runnerd.api.state import AppState
    from runnerd.config import Settings

__all__ = [
    "OAUTH_SCOPES",
    "RESOURCE_METADATA_PATH",
    "Caller",
    "authenticate",
    "bearer_or_key",
    "caller_of",
    "install_for",
    "install_of",
    "oauth_challenge",
    "session_key",
    "workspace_admin",
]


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# OAuth (runnerd/oauth, api/oauth.py): the scopes a client may be granted, and where the
# protected resource's metadata is; here, for /mcp's 401 too (runnerd/mcp/sessions.py).
OAUTH_SCOPES = ("api:read", "tools:run")
RESOURCE_METADATA_PATH = "/.well-known/oauth-protected-resource"


def oauth_challenge(settings: Settings, *, scope_missing: bool = False) -> str:
    """The WWW-Authenticate of a 401 from /mcp: where an OAuth client finds how to get a
    token (RFC 9728 §5.1); of a 403 for a token without ``tools:run``, that it needs it."""
    error = 'error="insufficient_scope", ' if scope_missing else ""
    return (
        f'Bearer {error}resource_metadata="{settings.public_base}{RESOURCE_METADATA_PATH}/mcp", '
        f'scope="{" ".join(OAUTH_SCOPES)}"'
    )


class _InWorkspace(Protocol):
    """A row of one workspace (an install, a run, an approval)."""

    @property
    def workspace_id(self) -> str: ...


Row = TypeVar("Row", bound=_InWorkspace)


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

    def principal(self) -> Principal:
        """Who the governor acts for: the person, and the key (for the audit); a workspace
        key is refused (``need_person``)."""
        return Principal(self.need_person(), self.key.id)

    async def member(
        self, store: Store, workspace_id: str, *, role: Role, apps: bool = True
    ) -> MembershipRecord | None:
        """Check the caller may act in ``workspace_id`` with at least ``role`` (and the
        Apps module); 403 INSUFFICIENT_WORKSPACE_ROLE otherwise, 404 WORKSPACE_NOT_FOUND
        to a person when there is no such workspace. A workspace key acts as a builder of
        its own workspace."""
        if self.key.kind == "workspace":
            if self.key.workspace_id == workspace_id and at_least("builder", role):
                return None
            raise InsufficientRole
        assert self.key.user_id is not None
        if self.key.workspace_id is not None and self.key.workspace_id != workspace_id:
            raise InsufficientRole  # a token bound to one workspace (OAuth) acts there only
        found = await store.io(store.membership, workspace_id, self.key.user_id)
        if found is None and await store.io(store.get_workspace, workspace_id) is None:
            # No such workspace (404), not a role the caller lacks: no more than the
            # workspace-admin routes answer any caller already (workspace_admin).
            raise WorkspaceNotFound
        if not has_role(found, role, apps=apps):
            if found is not None and apps and not found.apps_access and at_least(found.role, role):
                raise InsufficientRole(
                    "this person has no Apps access in the workspace: an admin grants it "
                    "(the People page, or runnerd admin set-role --apps-access)"
                )
            raise InsufficientRole
        return found

    def sees(self, store: Store, workspace_id: str) -> bool:
        """Whether the caller sees what ``workspace_id`` holds at all: it is a member (a
        workspace key: it is that workspace's key), whatever its role."""
        if self.key.kind == "workspace":
            return self.key.workspace_id == workspace_id
        if self.key.workspace_id is not None and self.key.workspace_id != workspace_id:
            return False  # a token bound to one workspace (OAuth) sees that one only
        return self.key.user_id is not None and (
            store.membership(workspace_id, self.key.user_id) is not None
        )

    async def visible(
        self,
        store: Store,
        lookup: Callable[[str], Row | None],
        row_id: str,
        missing: type[RunnerdError],
    ) -> Row:
        """The row ``lookup`` finds for ``row_id``, if it is in a workspace the caller
        sees (``sees``); ``missing`` (a not-found error) otherwise: rows of the
        workspaces of others are not found, never forbidden. One store hop."""

        def find() -> Row | None:
            row = lookup(row_id)
            return row if row is not None and self.sees(store, row.workspace_id) else None

        found = await store.io(find)
        if found is None:
            raise missing
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
    caller = await authenticate(request, state.store, state.signer)
    caller.need_scope(scope)
    state.limiter.take(caller.key.rate_bucket)
    return caller


async def workspace_admin(request: Request, state: AppState, scope: str) -> tuple[Caller, str]:
    """The caller (``caller_of``), a person who is an admin of the workspace in the path
    (``{workspaceId}``; WorkspaceNotFound when there is none; the Apps module not needed),
    and that workspace's id."""
    caller = await caller_of(request, state, scope)
    caller.need_person()
    workspace_id = str(request.path_params["workspaceId"])
    if await state.store.io(state.store.get_workspace, workspace_id) is None:
        raise WorkspaceNotFound
    await caller.member(state.store, workspace_id, role="admin", apps=False)
    return caller, workspace_id


async def authenticate(
    request: Request, store: Store, cookies: CookieSigner | None = None
) -> Caller:
    """The caller of ``request``: its key (``Authorization: Bearer …`` or X-API-Key),
    else its session cookie (with the
    session's CSRF token on any request that changes state); 401 if neither is valid.
    Nothing is cached: the key, or the session and the key it was signed in with, are
    looked up on every request, and roles are checked afresh by ``Caller.member``."""
    plaintext = bearer_or_key(request)  # an OAuth client sends its token as Bearer
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


async def install_of(
    request: Request, state: AppState, caller: Caller, role: Role
) -> InstallRecord:
    """The install of the path, if ``caller`` may act on it with ``role`` (403
    INSUFFICIENT_WORKSPACE_ROLE otherwise); installs of workspaces the caller does not
    see are not found (404)."""
    store = state.store
    install = await caller.visible(
        store, store.get_install, request.path_params["installId"], InstallNotFound
    )
    await caller.member(store, install.workspace_id, role=role)
    return install


async def install_for(
    request: Request, state: AppState, *, scope: str = "apps:write", role: Role = "admin"
) -> tuple[InstallRecord, Caller]:
    """The install of the path, for a person of at least ``role`` in its workspace (a
    token needs ``scope``); installs of other workspaces are not found."""
    caller = await caller_of(request, state, scope)
    caller.need_person()
    return await install_of(request, state, caller, role), caller
