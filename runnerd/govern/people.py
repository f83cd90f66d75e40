"""The rules of people and keys, on every surface: a person is known by their email
address, added at first mention; a personal key or token of a workspace is made for a
person of that workspace; a token carries known scopes, at least one."""

from __future__ import annotations

from runnerd.errors import InvalidScopes, NotAMember
from runnerd.model import Role
from runnerd.roles import SCOPES
from runnerd.store import Store

__all__ = ["add_member", "key_holder", "token_scopes"]


def add_member(
    store: Store, workspace_id: str, email: str, *, role: Role, apps_access: bool, approver: bool
) -> dict[str, object]:
    """Put the person of ``email`` (known from now on, if new) in the workspace with this
    role, Apps access and approver flag; their row among the workspace's ``members``."""
    user = store.ensure_user(email.strip())
    store.set_membership(
        workspace_id, user.id, role=role, apps_access=apps_access, approver=approver
    )
    return next(r for r in store.members(workspace_id) if r["user_id"] == user.id)


def key_holder(store: Store, workspace_id: str, email: str) -> str:
    """The person a personal key or token made in ``workspace_id`` is for: the member
    whose email is ``email`` (in any case); NotAMember if no member's is."""
    member = next(
        (m for m in store.members(workspace_id) if m["email"].lower() == email.lower()), None
    )
    if member is None:
        raise NotAMember(email)
    return str(member["user_id"])


def token_scopes(scopes: list[str]) -> tuple[str, ...]:
    """The scopes of a new token, if there is one at least and each is in SCOPES;
    InvalidScopes otherwise."""
    if not scopes or not set(scopes) <= set(SCOPES):
        raise InvalidScopes(SCOPES)
    return tuple(scopes)
