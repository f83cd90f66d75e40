"""The consent step of OAuth (runnerd/oauth): what the Manage page's consent screen
reads and decides. ``/oauth/authorize`` keeps a client's request and sends the browser
to ``/#/consent?request=…``; the person signs in there as always, sees the client's
name and redirect host, picks one of their workspaces and the scopes, and allows or
denies. The decision answers where to send the browser: the client's redirect URI
with a one-time code (60 s), or with ``error=access_denied``.

Only a person decides, with their own personal key or session: a scoped token (an
OAuth access token among them) cannot grant itself more.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode, urlsplit

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import OAUTH_SCOPES, caller_of
from runnerd.api.bodies import _Wire
from runnerd.api.ops import Op, Param, json_response
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.config import Settings
from runnerd.errors import InvalidBody, OAuthRequestNotFound, PersonalKeyRequired
from runnerd.limits import MAX_SMALL_BODY_BYTES, OAUTH_CODE_TTL_S

__all__ = [
    "AUTHORIZE_PATH",
    "OPS",
    "REGISTER_PATH",
    "REVOKE_PATH",
    "SCOPES",
    "TOKEN_PATH",
    "resource_of",
]

SCOPES = OAUTH_SCOPES
AUTHORIZE_PATH = "/oauth/authorize"
TOKEN_PATH = "/oauth/token"
REGISTER_PATH = "/oauth/register"
REVOKE_PATH = "/oauth/revoke"


def resource_of(settings: Settings) -> str:
    """The protected resource: this daemon's /mcp."""
    return f"{settings.public_base}/mcp"


REQUEST_ID = Param(
    "requestId", "The authorization request (from the consent page's address).",
    required=True, max_length=64, where="path",
)  # fmt: skip


class OAuthRequestInfo(_Wire, omit_defaults=False):
    """An OAuth client's request waiting for the person's consent."""

    request_id: str
    client_id: str
    client_name: str | None
    redirect_uri: str
    redirect_host: str
    scopes: list[str]


class OAuthDecisionBody(_Wire):
    allow: bool
    workspace_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    scopes: Annotated[list[str], msgspec.Meta(max_length=8)] | None = None


class OAuthDecision(_Wire):
    """Where the browser goes next: the client's redirect URI, with a code or an error."""

    redirect_to: str


async def _client_name(state: AppState, client_id: str) -> str | None:
    row = await state.store.io(state.store.oauth_client, client_id)
    if row is None:
        return None
    name = msgspec.json.decode(row["info"]).get("client_name")
    return str(name) if name else None


async def get_request(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    caller.need_person()
    request_id = request.path_params["requestId"]
    found = await state.store.io(state.store.oauth_request, request_id)
    if found is None:
        raise OAuthRequestNotFound
    client_id, params = found
    redirect = str(params["redirect_uri"])
    return json_response(
        OAuthRequestInfo(
            request_id=request_id,
            client_id=client_id,
            client_name=await _client_name(state, client_id),
            redirect_uri=redirect,
            redirect_host=urlsplit(redirect).netloc or redirect.partition(":")[0],
            scopes=list(params["scopes"]),
        )
    )


def _redirect(uri: str, **params: str | None) -> str:
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return f"{uri}{'&' if urlsplit(uri).query else '?'}{query}"


async def decide_request(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    body = await read_body(request, OAuthDecisionBody, MAX_SMALL_BODY_BYTES)
    user_id = caller.need_person()
    if caller.key.kind != "personal":
        raise PersonalKeyRequired("consent is given by a person signed in, not by a token")
    store = state.store
    request_id = request.path_params["requestId"]
    found = await store.io(store.oauth_request, request_id)
    if found is None:
        raise OAuthRequestNotFound
    _, params = found
    asked = list(params["scopes"])
    scopes = tuple(body.scopes if body.scopes is not None else asked)
    workspace_id = body.workspace_id
    if body.allow:
        if workspace_id is None:
            raise InvalidBody("workspaceId: pick the workspace the client acts in")
        if not scopes or any(s not in asked or s not in SCOPES for s in scopes):
            raise InvalidBody(f"scopes: some of those the client asked for ({' '.join(asked)})")
        await caller.member(store, workspace_id, role="viewer")
    elif workspace_id is not None and not caller.sees(store, workspace_id):
        workspace_id = None
    if workspace_id is None:  # a denial without a workspace: filed under the first one
        mine = await store.io(store.workspaces_of, user_id)
        workspace_id = str(mine[0]["id"]) if mine else None
    decided = await store.io(
        store.decide_oauth_request,
        request_id,
        allow=body.allow,
        user_id=user_id,
        workspace_id=workspace_id,
        scopes=scopes if body.allow else (),
        actor_key_id=caller.key.id,
        code_ttl_s=OAUTH_CODE_TTL_S,
    )
    if decided is None:
        raise OAuthRequestNotFound
    _, params, code = decided
    issuer = state.settings.public_base
    if code is not None:
        target = _redirect(params["redirect_uri"], code=code, state=params["state"], iss=issuer)
    else:
        target = _redirect(
            params["redirect_uri"],
            error="access_denied",
            error_description="The person denied access",
            state=params["state"],
            iss=issuer,
        )
    return json_response(OAuthDecision(redirect_to=target))


OPS = [
    Op(
        "GET",
        "/api/v2/oauth/requests/{requestId}",
        "getOAuthRequest",
        "An OAuth client's request waiting for consent",
        get_request,
        OAuthRequestInfo,
        params=(REQUEST_ID,),
        description="What the consent screen shows: the client's name (from its "
        "registration or its metadata document), its redirect URI and host, and the scopes "
        "it asks for. Requests wait 10 minutes.",
    ),
    Op(
        "POST",
        "/api/v2/oauth/requests/{requestId}/decision",
        "decideOAuthRequest",
        "Allow or deny an OAuth client's request",
        decide_request,
        OAuthDecision,
        body=OAuthDecisionBody,
        params=(REQUEST_ID,),
        description="Allow (with one of the person's workspaces and some of the asked "
        "scopes) or deny, once; answers where to send the browser: the client's redirect "
        "URI with a one-time code (good for 60 s) or error=access_denied. A personal key "
        "or the Manage page's session only (a token is refused). Audited as "
        "oauth.consent.grant / oauth.consent.deny.",
    ),
]
