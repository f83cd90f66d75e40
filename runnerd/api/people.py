"""Sign-in for the Manage page, and the people and keys of a workspace.

Sessions: ``POST /api/v2/session`` signs in with a personal API key or a one-time
sign-in link (``runnerd admin login-link``) and sets the session cookie; the session
acts as its person under the API's own rules (api/auth.py). People and keys: admins of
a workspace add people, change their role and Apps access, and create and revoke keys
(a new key's plaintext is in the answer once, never again).
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import Caller, caller_of
from runnerd.api.bodies import (
    AuditVerdict,
    KeyInfo,
    KeyList,
    MemberBody,
    MemberInfo,
    MemberList,
    NewKey,
    NewKeyBody,
    Revoked,
    SessionInfo,
    SignedOut,
    SignInBody,
    WorkspaceRole,
)
from runnerd.api.ops import Op, Param, json_response
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.errors import (
    InvalidApiKey,
    InvalidSignIn,
    KeyNotFound,
    MemberNotFound,
    PersonalKeyRequired,
    Unauthenticated,
    WorkspaceKeyNotAllowed,
    WorkspaceNotFound,
)
from runnerd.govern.people import add_member, key_holder, token_scopes
from runnerd.limits import MAX_ID_CHARS, MAX_SMALL_BODY_BYTES
from runnerd.store import Store

__all__ = ["OPS"]


async def _session_info(
    store: Store, user_id: str, csrf: str | None, expires_at: str | None
) -> Response:
    user = await store.io(store.get_user, user_id)
    assert user is not None
    workspaces = [
        WorkspaceRole(
            workspace_id=w["id"],
            name=w["name"],
            role=w["role"],
            apps_access=bool(w["apps_access"]),
            approver=bool(w["approver"]),
        )
        for w in await store.io(store.workspaces_of, user_id)
    ]
    return json_response(
        SessionInfo(
            user_id=user_id,
            email=user.email,
            csrf_token=csrf,
            expires_at=expires_at,
            workspaces=workspaces,
        )
    )


async def sign_in(request: Request, state: AppState) -> Response:
    body = await read_body(request, SignInBody, MAX_SMALL_BODY_BYTES)
    store = state.store
    if (body.api_key is None) == (body.login_token is None):
        raise InvalidSignIn
    if body.api_key is not None:
        key = await store.io(store.find_key, body.api_key.strip())
        if key is None:
            raise InvalidApiKey
        if key.kind != "personal" or key.user_id is None:
            refused = WorkspaceKeyNotAllowed if key.kind == "workspace" else PersonalKeyRequired
            raise refused(
                "sign in with a personal API key: a workspace key acts for no person, and a "
                "scoped token must not become a session with more rights than its scopes"
            )
        user_id, via, key_id = key.user_id, "api_key", key.id
    else:
        assert body.login_token is not None
        found = await store.io(store.use_login_link, body.login_token)
        if found is None:
            raise Unauthenticated(
                "This sign-in link was used already or has expired; ask for a new one"
            )
        user_id, via, key_id = found, "login_link", None
    ttl_s = state.settings.session_hours * 3600
    session, secret = await store.io(
        store.create_session, user_id, ttl_s=ttl_s, via=via, key_id=key_id
    )
    response = await _session_info(store, user_id, session.csrf, session.expires_at)
    state.signer.set(response, request, secret, ttl_s)
    return response


async def get_session(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    user_id = caller.need_person()
    session = caller.session
    return await _session_info(
        state.store,
        user_id,
        session.csrf if session else None,
        session.expires_at if session else None,
    )


async def sign_out(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    secret = state.signer.secret_of(request)
    if caller.session is not None and secret is not None:
        await state.store.io(state.store.end_session, secret)
    response = json_response(SignedOut(signed_out=True))
    state.signer.clear(response, request)
    return response


# --- people -----------------------------------------------------------------------------------


async def _admin(request: Request, state: AppState, scope: str) -> tuple[Caller, str]:
    """The caller, an admin of the workspace in the path (the Apps module not needed)."""
    caller = await caller_of(request, state, scope)
    caller.need_person()
    workspace_id = str(request.path_params["workspaceId"])
    if await state.store.io(state.store.get_workspace, workspace_id) is None:
        raise WorkspaceNotFound
    await caller.member(state.store, workspace_id, role="admin", apps=False)
    return caller, workspace_id


def _member_info(row: dict[str, object]) -> MemberInfo:
    return MemberInfo(
        user_id=str(row["user_id"]),
        email=str(row["email"]),
        role=row["role"],  # type: ignore[arg-type]
        apps_access=bool(row["apps_access"]),
        approver=bool(row["approver"]),
    )


async def list_members(request: Request, state: AppState) -> Response:
    _, workspace_id = await _admin(request, state, "api:read")
    return json_response(
        MemberList(
            data=[_member_info(r) for r in await state.store.io(state.store.members, workspace_id)]
        )
    )


async def put_member(request: Request, state: AppState) -> Response:
    _, workspace_id = await _admin(request, state, "apps:write")
    body = await read_body(request, MemberBody, MAX_SMALL_BODY_BYTES)
    row = await state.store.io(
        add_member,
        state.store,
        workspace_id,
        body.email,
        role=body.role,
        apps_access=body.apps_access,
        approver=body.approver,
    )
    return json_response(_member_info(row))


async def remove_member(request: Request, state: AppState) -> Response:
    caller, workspace_id = await _admin(request, state, "apps:write")
    user_id = str(request.path_params["userId"])
    store = state.store
    removed = await store.io(
        store.remove_member, workspace_id, user_id, actor_user_id=caller.user_id
    )
    if not removed:
        raise MemberNotFound
    return await list_members(request, state)


# --- keys -------------------------------------------------------------------------------------


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
    )


async def list_keys(request: Request, state: AppState) -> Response:
    _, workspace_id = await _admin(request, state, "api:read")
    rows = await state.store.io(state.store.keys_of_workspace, workspace_id)
    return json_response(KeyList(data=[_key_info(r) for r in rows]))


async def create_key(request: Request, state: AppState) -> Response:
    caller, workspace_id = await _admin(request, state, "apps:write")
    body = await read_body(request, NewKeyBody, MAX_SMALL_BODY_BYTES)
    store = state.store
    user_id = None
    if body.kind != "workspace":
        user = await store.io(store.get_user, caller.need_person())
        email = body.email or user.email  # type: ignore[union-attr]
        user_id = await store.io(key_holder, store, workspace_id, email)
    scopes = token_scopes(body.scopes) if body.kind == "token" else ()
    record, plaintext = await store.io(
        store.create_key,
        kind=body.kind,
        user_id=user_id,
        workspace_id=workspace_id if body.kind == "workspace" else None,
        scopes=scopes,
        name=body.name,
        audit_workspace_id=workspace_id,
    )
    row = next(
        r for r in await store.io(store.keys_of_workspace, workspace_id) if r["id"] == record.id
    )
    return json_response(NewKey(key=_key_info(row), api_key=plaintext), status=201)


async def revoke_key(request: Request, state: AppState) -> Response:
    """Revoke a key: from this request on it authenticates nothing, and the Manage-page
    sessions signed in with it end with it (store); MCP sessions it opened are ended
    by MCP's session guard (mcp/sessions.py)."""
    caller, workspace_id = await _admin(request, state, "apps:write")
    key_id = str(request.path_params["keyId"])
    store = state.store
    if not any(r["id"] == key_id for r in await store.io(store.keys_of_workspace, workspace_id)):
        raise KeyNotFound
    await store.io(
        store.revoke_key,
        key_id,
        actor_user_id=caller.user_id,
        actor_key_id=caller.key.id,
        workspace_id=workspace_id,
    )
    return json_response(Revoked(key_id=key_id, revoked=True))


async def verify_audit(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    caller.need_person()
    workspace_id = request.query_params.get("workspaceId", "")
    await caller.member(state.store, workspace_id, role="admin", apps=False)
    found = await state.store.io(state.store.audit_verdict)
    return json_response(
        AuditVerdict(
            ok=found.first_break is None,
            entries=found.entries,
            first_break=found.first_break,
            problem=found.problem,
            head_seq=found.head_seq,
            head_hash=found.head_hash,
        )
    )


_WORKSPACE_PATH = Param(
    "workspaceId", "The workspace.", required=True, max_length=MAX_ID_CHARS, where="path"
)

OPS = [
    Op(
        "POST",
        "/api/v2/session",
        "signIn",
        "Sign in to the Manage page",
        sign_in,
        SessionInfo,
        body=SignInBody,
        authenticated=False,
        description="With a personal API key (apiKey) or a one-time sign-in link's token "
        "(loginToken, from runnerd admin login-link; good once, for 10 minutes). Sets the "
        "session cookie (HttpOnly, SameSite=Strict, Secure over TLS); the answer's "
        "csrfToken must accompany every request of the session that changes state "
        "(X-CSRF-Token). Workspace keys and scoped tokens are refused.",
    ),
    Op(
        "GET",
        "/api/v2/session",
        "getSession",
        "Who is signed in, and where",
        get_session,
        SessionInfo,
    ),
    Op("DELETE", "/api/v2/session", "signOut", "Sign out (ends the session)", sign_out, SignedOut),
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
        "other workspaces they belong to.",
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
    Op(
        "POST",
        "/api/v2/audit/verify",
        "verifyAudit",
        "Verify the audit trail's hash chain (admins)",
        verify_audit,
        AuditVerdict,
        params=(Param("workspaceId", "The workspace.", required=True, max_length=MAX_ID_CHARS),),
    ),
]
