"""The people and keys of a workspace: its admins add people, change their role and Apps
access, and create and revoke keys (a new key's plaintext is in the answer once, never
again).
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import workspace_admin
from runnerd.api.bodies import (
    KeyInfo,
    KeyList,
    MemberBody,
    MemberInfo,
    MemberList,
    NewKey,
    NewKeyBody,
    Revoked,
)
from runnerd.api.ops import Op, Param, json_response
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.errors import KeyNotFound, MemberNotFound
from runnerd.govern.people import (
    add_member,
    key_holder,
    key_surface,
    may_hold_keys_of,
    token_scopes,
)
from runnerd.limits import MAX_ID_CHARS, MAX_SMALL_BODY_BYTES

__all__ = ["OPS"]


def _member_info(row: dict[str, object]) -> MemberInfo:
    return MemberInfo(
        user_id=str(row["user_id"]),
        email=str(row["email"]),
        role=row["role"],  # type: ignore[arg-type]
        apps_access=bool(row["apps_access"]),
        approver=bool(row["approver"]),
    )


async def list_members(request: Request, state: AppState) -> Response:
    _, workspace_id = await workspace_admin(request, state, "api:read")
    return json_response(
        MemberList(
            data=[_member_info(r) for r in await state.store.io(state.store.members, workspace_id)]
        )
    )


async def put_member(request: Request, state: AppState) -> Response:
    caller, workspace_id = await workspace_admin(request, state, "apps:write")
    body = await read_body(request, MemberBody, MAX_SMALL_BODY_BYTES)
    row = await state.store.io(
        add_member,
        state.store,
        workspace_id,
        body.email,
        role=body.role,
        apps_access=body.apps_access,
        approver=body.approver,
        actor_user_id=caller.user_id,
        actor_key_id=caller.key.id,
    )
    return json_response(_member_info(row))


async def remove_member(request: Request, state: AppState) -> Response:
    caller, workspace_id = await workspace_admin(request, state, "apps:write")
    user_id = str(request.path_params["userId"])
    store = state.store
    removed = await store.io(
        store.remove_member,
        workspace_id,
        user_id,
        actor_user_id=caller.user_id,
        actor_key_id=caller.key.id,
    )
    if not removed:
        raise MemberNotFound
    return await list_members(request, state)


def _key_info(row: dict[str, object]) -> KeyInfo:
    scopes = row["scopes"]
    return KeyInfo(
        key_id=str(row["id"]),
        kind=row["kind"],  # type: ignore[arg-type]
        name=str(row["name"]),
        prefix=str(row["prefix"]),
        created_at=str(row["created_at"]),
        user_id=row["user_id"],  # type: ignore[arg-type]
        email=row.get("email"),  # type: ignore[arg-type]
        scopes=list(msgspec.json.decode(scopes) if isinstance(scopes, str) else scopes or []),  # type: ignore[arg-type]
        surface=row.get("surface"),  # type: ignore[arg-type]
    )


async def list_keys(request: Request, state: AppState) -> Response:
    _, workspace_id = await workspace_admin(request, state, "api:read")
    rows = await state.store.io(state.store.keys_of_workspace, workspace_id)
    return json_response(KeyList(data=[_key_info(r) for r in rows]))


async def create_key(request: Request, state: AppState) -> Response:
    caller, workspace_id = await workspace_admin(request, state, "apps:write")
    body = await read_body(request, NewKeyBody, MAX_SMALL_BODY_BYTES)
    store = state.store
    user_id = None
    if body.kind != "workspace":
        user = await store.io(store.get_user, caller.need_person())
        email = body.email or user.email  # type: ignore[union-attr]
        user_id = await store.io(key_holder, store, workspace_id, email)
        await store.io(may_hold_keys_of, store, caller.need_person(), user_id)
    scopes = token_scopes(body.scopes) if body.kind == "token" else ()
    surface = key_surface(body.kind, body.surface)
    record, plaintext = await store.io(
        store.create_key,
        kind=body.kind,
        user_id=user_id,
        workspace_id=workspace_id if body.kind == "workspace" else None,
        scopes=scopes,
        name=body.name,
        surface=surface,
        audit_workspace_id=workspace_id,
        actor_user_id=caller.user_id,
        actor_key_id=caller.key.id,
    )
    row = next(
        r for r in await store.io(store.keys_of_workspace, workspace_id) if r["id"] == record.id
    )
    return json_response(NewKey(key=_key_info(row), api_key=plaintext), status=201)


async def revoke_key(request: Request, state: AppState) -> Response:
    """Revoke a key: from this request on it authenticates nothing, and the Manage-page
    sessions signed in with it end with it (store); MCP sessions it opened are ended
    by MCP's session guard (mcp/sessions.py)."""
    caller, workspace_id = await workspace_admin(request, state, "apps:write")
    key_id = str(request.path_params["keyId"])
    store = state.store
    key = next(
        (r for r in await store.io(store.keys_of_workspace, workspace_id) if r["id"] == key_id),
        None,
    )
    if key is None:
        raise KeyNotFound
    if key["kind"] != "workspace":
        await store.io(may_hold_keys_of, store, caller.need_person(), key["user_id"])
    await store.io(
        store.revoke_key,
        key_id,
        actor_user_id=caller.user_id,
        actor_key_id=caller.key.id,
        workspace_id=workspace_id,
    )
    return json_response(Revoked(key_id=key_id, revoked=True))


_WORKSPACE_PATH = Param(
    "workspaceId", "The workspace.", required=True, max_length=MAX_ID_CHARS, where="path"
)


OPS = [
    Op(
        "GET",
        "/api/v2/workspaces/{workspaceId}/members",
        "listMembers",
        "The people of a workspace (admins)",
        list_members,
        MemberList,
        params=(_WORKSPACE_PATH,),
    ),
    Op(
        "PUT",
        "/api/v2/workspaces/{workspaceId}/members",
        "putMember",
        "Add a person, or change their role, Apps access or approver flag (admins)",
        put_member,
        MemberInfo,
        body=MemberBody,
        params=(_WORKSPACE_PATH,),
        errors=(400, 401, 403, 404, 409, 429, 500),
        description="409 LAST_ADMIN when it would leave the workspace without an admin.",
    ),
    Op(
        "DELETE",
        "/api/v2/workspaces/{workspaceId}/members/{userId}",
        "removeMember",
        "Take a person out of a workspace (admins); the people who remain",
        remove_member,
        MemberList,
        params=(
            _WORKSPACE_PATH,
            Param("userId", "The person.", required=True, max_length=MAX_ID_CHARS, where="path"),
        ),
        description="From this request on, nothing of theirs acts in the workspace: their "
        "Manage-page sessions and MCP sessions lose it at once. Their keys stay, for the "
        "other workspaces they belong to. 409 LAST_ADMIN for the workspace's only admin.",
        errors=(400, 401, 403, 404, 409, 429, 500),
    ),
    Op(
        "GET",
        "/api/v2/workspaces/{workspaceId}/keys",
        "listKeys",
        "The live keys acting in a workspace (admins); never a secret",
        list_keys,
        KeyList,
        params=(_WORKSPACE_PATH,),
    ),
    Op(
        "POST",
        "/api/v2/workspaces/{workspaceId}/keys",
        "createKey",
        "Create a key (admins); its plaintext is in this answer only",
        create_key,
        NewKey,
        status=201,
        body=NewKeyBody,
        params=(_WORKSPACE_PATH,),
        description="A token may be bound to a surface (surface: relay, workflow or chat): "
        "its runs are recorded as that surface whatever a run's body says, and a relay's "
        "or chat's write calls wait for approval (docs/GOVERNANCE.md).",
    ),
    Op(
        "DELETE",
        "/api/v2/workspaces/{workspaceId}/keys/{keyId}",
        "revokeKey",
        "Revoke a key (admins)",
        revoke_key,
        Revoked,
        params=(
            _WORKSPACE_PATH,
            Param("keyId", "The key.", required=True, max_length=MAX_ID_CHARS, where="path"),
        ),
    ),
]
