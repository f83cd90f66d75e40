"""Who is asking, and may they: API keys, roles, the Apps module, scopes.

Kinds of key:
- personal: acts as its person, in every workspace the person belongs to;
- token: a personal key limited to its scopes (``api:read``, ``tools:run``,
  ``apps:write``);
- workspace: acts for a workspace, not a person. Seed 000: tool endpoints refuse it,
  "because a tool always runs for a person whose access can be checked". It may list,
  deploy and publish apps (a CI pipeline's key), nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request

from runnerd.access import ROLE_RANK
from runnerd.api.errors import ApiError
from runnerd.store import KeyRecord, MembershipRecord, Store

if TYPE_CHECKING:
    from runnerd.api.state import AppState

__all__ = ["Caller", "authenticate", "caller_of"]


@dataclass(frozen=True)
class Caller:
    key: KeyRecord

    @property
    def user_id(self) -> str | None:
        return self.key.user_id

    def need_scope(self, scope: str) -> None:
        if self.key.kind == "token" and scope not in self.key.scopes:
            raise ApiError.forbidden("INSUFFICIENT_SCOPE", f"this token lacks the {scope} scope")

    def need_person(self) -> str:
        """The person behind the key; a workspace key is refused."""
        if self.key.kind == "workspace" or self.key.user_id is None:
            raise ApiError.forbidden(
                "WORKSPACE_KEY_NOT_ALLOWED",
                "Workspace API keys cannot call this endpoint: a tool always runs for a "
                "person whose access can be checked; use a personal API key or token",
            )
        return self.key.user_id

    def member(
        self, store: Store, workspace_id: str, *, role: str, apps: bool = True
    ) -> MembershipRecord | None:
        """Check the caller may act in ``workspace_id`` with at least ``role`` (and the
        Apps module); 403 INSUFFICIENT_WORKSPACE_ROLE otherwise. A workspace key acts
        as a builder of its own workspace."""
        if self.key.kind == "workspace":
            if self.key.workspace_id == workspace_id and ROLE_RANK[role] <= ROLE_RANK["builder"]:
                return None
            raise ApiError.forbidden("INSUFFICIENT_WORKSPACE_ROLE")
        assert self.key.user_id is not None
        found = store.membership(workspace_id, self.key.user_id)
        if (
            found is None
            or ROLE_RANK[found.role] < ROLE_RANK[role]
            or (apps and not found.apps_access)
        ):
            raise ApiError.forbidden("INSUFFICIENT_WORKSPACE_ROLE")
        return found


def caller_of(request: Request, state: AppState, scope: str) -> Caller:
    """Authenticate, check the token scope, and spend one rate-limit token: the first
    step of every authenticated route, always in this order (401, 403, 429)."""
    caller = authenticate(request, state.store)
    caller.need_scope(scope)
    state.limiter.take(caller.key.id)
    return caller


def authenticate(request: Request, store: Store) -> Caller:
    """The caller of ``request`` from its X-API-Key header; 401 if missing or unknown."""
    plaintext = request.headers.get("x-api-key", "").strip()
    if not plaintext:
        raise ApiError("UNAUTHORIZED")
    key = store.find_key(plaintext)
    if key is None:
        raise ApiError("UNAUTHORIZED", "Invalid or revoked API key")
    return Caller(key)
