"""The rules of people and keys, on every surface (the API and the CLI's admin commands):
a person is known by their email address (spaces around it dropped), added at first
mention; a personal key or token is made for a person of the workspace it is made in, or
with no workspace named (the CLI, whose keys act in every workspace of their person), for
a person of one at least; a token carries known scopes, at least one. A workspace begins
with an admin who holds a personal key (bootstrap)."""

from __future__ import annotations

import re
from typing import NamedTuple

from runnerd.errors import (
    InvalidBody,
    InvalidEmail,
    InvalidScopes,
    KeysBeyondYourWorkspaces,
    NotAMember,
)
from runnerd.limits import MAX_EMAIL_CHARS
from runnerd.model import Role
from runnerd.roles import BOUND_SURFACES, SCOPES
from runnerd.store import Store

__all__ = [
    "EMAIL_PATTERN",
    "Bootstrapped",
    "add_member",
    "bootstrap",
    "key_holder",
    "key_surface",
    "may_hold_keys_of",
    "token_scopes",
]

# What the API's member body and the CLI take as an email address: name@domain, no space.
EMAIL_PATTERN = r"^[^@\s]+@[^@\s]+$"


def add_member(
    store: Store,
    workspace_id: str,
    email: str,
    *,
    role: Role | None = None,
    apps_access: bool | None = None,
    approver: bool | None = None,
    actor_user_id: str | None = None,
    actor_key_id: str | None = None,
    members_only: bool = False,
) -> dict[str, object]:
    """Put the person of ``email`` (known from now on, if new) in the workspace with this
    role, Apps access and approver flag; their row among the workspace's ``members``. A
    flag left None keeps what they have (a newcomer: member, no Apps access, no approver).
    ``members_only`` (``runnerd admin set-role``) changes a person of the workspace only:
    NotAMember naming them otherwise, and nobody is added."""
    email = email.strip()
    if len(email) > MAX_EMAIL_CHARS or not re.fullmatch(EMAIL_PATTERN, email):
        raise InvalidEmail(MAX_EMAIL_CHARS)
    if members_only and not any(
        m["email"].lower() == email.lower() for m in store.members(workspace_id)
    ):
        raise NotAMember(email, f"workspace {workspace_id}")
    user = store.ensure_user(email)
    store.set_membership(
        workspace_id,
        user.id,
        role=role,
        apps_access=apps_access,
        approver=approver,
        actor_user_id=actor_user_id,
        actor_key_id=actor_key_id,
    )
    return next(r for r in store.members(workspace_id) if r["user_id"] == user.id)


def key_holder(store: Store, workspace_id: str | None, email: str) -> str:
    """The person a personal key or token is for: the member of ``workspace_id`` whose
    email is ``email`` (in any case), or, with no workspace, a person of that email who
    is a member of one at least; NotAMember if there is none. Nobody is added."""
    if workspace_id is None:
        user = store.find_user(email)
        if user is None or not store.workspaces_of(user.id):
            raise NotAMember(email, "any workspace")
        return user.id
    member = next(
        (m for m in store.members(workspace_id) if m["email"].lower() == email.lower()), None
    )
    if member is None:
        raise NotAMember(email)
    return str(member["user_id"])


def may_hold_keys_of(store: Store, admin_user_id: str, holder_user_id: str | None) -> None:
    """Whether an admin may make or revoke the personal keys and tokens of a person: their
    own, or a person all of whose workspaces the admin is an admin of (a personal key acts
    in every workspace of its person, so an admin of one must not mint a key, or end one,
    that acts where they have no say). KeysBeyondYourWorkspaces otherwise."""
    if holder_user_id is None or holder_user_id == admin_user_id:
        return
    mine = {w["id"] for w in store.workspaces_of(admin_user_id) if w["role"] == "admin"}
    if not {w["id"] for w in store.workspaces_of(holder_user_id)} <= mine:
        raise KeysBeyondYourWorkspaces


def token_scopes(scopes: list[str]) -> tuple[str, ...]:
    """The scopes of a new token, if there is one at least and each is in SCOPES;
    InvalidScopes otherwise."""
    if not scopes or not set(scopes) <= set(SCOPES):
        raise InvalidScopes(SCOPES)
    return tuple(scopes)


def key_surface(kind: str, surface: str | None) -> str | None:
    """The surface a new key is bound to: only a token may be, to one of BOUND_SURFACES
    (its runs are recorded as it, api/surfaces.py); InvalidBody otherwise."""
    if surface is None:
        return None
    if kind != "token":
        raise InvalidBody("surface: only a token is bound to a surface (kind token)")
    if surface not in BOUND_SURFACES:
        raise InvalidBody(f"surface: one of {', '.join(BOUND_SURFACES)}")
    return surface


class Bootstrapped(NamedTuple):
    workspace_id: str
    user_id: str  # the workspace's admin
    api_key: str  # their personal key's plaintext, shown once


def bootstrap(
    store: Store, name: str, email: str, *, actor_user_id: str | None = None
) -> Bootstrapped:
    """A new workspace ``name`` with the person of ``email`` as its admin (Apps access
    on) and a personal key of theirs named bootstrap, filed under the workspace: what
    ``runnerd admin bootstrap`` and ``service install --bootstrap-email`` make, audited
    as done by ``actor_user_id`` (the CLI's ``cli:<user>``). The key's plaintext is only
    in the answer."""
    workspace = store.create_workspace(name, actor_user_id=actor_user_id)
    admin = add_member(
        store, workspace.id, email, role="admin", apps_access=True, actor_user_id=actor_user_id
    )
    user_id = str(admin["user_id"])
    _, key = store.create_key(
        kind="personal",
        user_id=user_id,
        name="bootstrap",
        audit_workspace_id=workspace.id,
        actor_user_id=actor_user_id,
    )
    return Bootstrapped(workspace.id, user_id, key)
