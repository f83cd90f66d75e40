"""Sign-in for the Manage page: ``POST /api/v2/session`` signs in with a personal API
key or a one-time sign-in link (``runnerd admin login-link``) and sets the session
cookie; the session acts as its person under the API's own rules (api/auth.py).
``GET`` says who is signed in, and where; ``DELETE`` signs out.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import caller_of
from runnerd.api.bodies import SessionInfo, SignedOut, SignInBody, WorkspaceRole
from runnerd.api.ops import Op, json_response
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.errors import (
    InvalidApiKey,
    InvalidSignIn,
    PersonalKeyRequired,
    Unauthenticated,
    WorkspaceKeyNotAllowed,
)
from runnerd.limits import MAX_SMALL_BODY_BYTES
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
]
