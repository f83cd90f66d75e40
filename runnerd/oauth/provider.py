"""runnerd's OAuth 2.1 authorization server, on the MCP SDK's server auth handlers
(``mcp.server.auth``: request validation, PKCE S256, redirect URI and expiry checks,
the metadata documents): this module is the provider they call, over the store
(runnerd/store/oauth.py). Loaded at the first OAuth request (runnerd/oauth/__init__.py).

- Clients: dynamic registration (RFC 7591; a client secret is kept as a hash and
  checked by ``HashedSecretAuthenticator``), or a Client ID Metadata Document
  (runnerd/oauth/documents.py), cached for ``OAUTH_DOCUMENT_CACHE_S``.
- ``/oauth/authorize`` keeps the request and sends the browser to the Manage page's
  consent screen (``/#/consent?request=…``); api/oauth.py records the decision and
  makes the one-time code.
- Codes, access and refresh tokens: runnerd/store/oauth.py.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import json
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from mcp.server.auth.handlers.authorize import AuthorizationHandler
from mcp.server.auth.handlers.metadata import MetadataHandler, ProtectedResourceMetadataHandler
from mcp.server.auth.handlers.register import RegistrationHandler
from mcp.server.auth.handlers.token import TokenHandler
from mcp.server.auth.middleware.client_auth import AuthenticationError, ClientAuthenticator
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    AuthorizeError,
    RefreshToken,
    RegistrationError,
    TokenError,
)
from mcp.server.auth.routes import cors_middleware
from mcp.server.auth.settings import ClientRegistrationOptions
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, RequestBodyLimitMiddleware
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken
from mcp.shared.auth import ProtectedResourceMetadata as ResourceMetadata
from mcp.shared.auth_utils import check_resource_allowed
from pydantic import ValidationError
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import request_response
from starlette.types import ASGIApp

from runnerd.api.oauth import (
    AUTHORIZE_PATH,
    REGISTER_PATH,
    REVOKE_PATH,
    SCOPES,
    TOKEN_PATH,
    resource_of,
)
from runnerd.limits import (
    OAUTH_DOCUMENT_CACHE_S,
    OAUTH_MAX_NAME_CHARS,
    OAUTH_MAX_REDIRECT_URIS,
    OAUTH_MAX_REGISTRATION_BYTES,
    OAUTH_MAX_STATE_CHARS,
    OAUTH_MAX_URI_CHARS,
    OAUTH_REQUEST_TTL_S,
)
from runnerd.oauth.documents import DocumentRefused, fetch_document, is_url_id
from runnerd.store.records import hash_key

if TYPE_CHECKING:
    from runnerd.api.state import AppState

__all__ = ["OAuthServer"]

ALL_SCOPES = " ".join(SCOPES)
AUTH_METHODS = ["none", "client_secret_post", "client_secret_basic"]


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class _Code(AuthorizationCode):
    pass


class _Refresh(RefreshToken):
    family: str


class _Access(AccessToken):
    family: str


def _loopback_or_https(uri: str) -> bool:
    """OAuth 2.1's redirect URIs: https, or http to a loopback address (native apps);
    a custom scheme for a native app too, but never javascript: or data:; never with a
    user or password, or a fragment (RFC 6749 §3.1.2)."""
    try:
        parts = urlsplit(uri)
        host = parts.hostname
    except ValueError:
        return False
    scheme = parts.scheme.lower()
    if not scheme or scheme in ("javascript", "data", "file", "vbscript"):
        return False
    if parts.username is not None or parts.password is not None or "#" in uri:
        return False
    if scheme != "http":
        return True
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _too_large(info: OAuthClientInformationFull, uris: list[str]) -> str | None:
    """Why a client's metadata is too large to keep (anyone may register), or None."""
    if len(uris) > OAUTH_MAX_REDIRECT_URIS:
        return f"at most {OAUTH_MAX_REDIRECT_URIS} redirect URIs"
    kept = info.model_dump(mode="json", exclude_none=True)
    for name, value in kept.items():
        limit = OAUTH_MAX_NAME_CHARS if name == "client_name" else OAUTH_MAX_URI_CHARS
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and len(v) > limit for v in values):
            return f"{name}: at most {limit} characters"
    return None


def _our_resource(asked: str, resource: str) -> bool:
    """Whether a client's ``resource`` (RFC 8707) names this server's: no fragment, and
    the SDK's rule (same origin, a path at or below ours)."""
    return "#" not in asked and check_resource_allowed(asked, resource)


class _Tokens(TokenHandler):
    """The SDK's token endpoint, which reads ``resource`` but leaves it unchecked: a
    code or refresh exchanged for another resource is refused (RFC 8707 §2.2)."""

    def __init__(self, provider: Provider, authenticator: ClientAuthenticator, resource: str):
        super().__init__(provider, authenticator)  # type: ignore[arg-type]
        self._resource = resource

    async def handle(self, request: Request) -> Response:
        form = await request.form()  # kept on the request: the SDK's handler reads it again
        asked = form.get("resource")
        if isinstance(asked, str) and not _our_resource(asked, self._resource):
            return JSONResponse(
                {"error": "invalid_target",
                 "error_description": f"this server's resource is {self._resource}"},
                status_code=400, headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
            )  # fmt: skip
        answer: Response = await super().handle(request)
        return answer


class Provider:
    """The SDK's ``OAuthAuthorizationServerProvider`` over runnerd's store."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    @property
    def _settings(self) -> Any:
        return self.state.settings

    # --- clients ------------------------------------------------------------------------------

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        store = self.state.store
        row = await store.io(store.oauth_client, client_id)
        if row is not None and row["kind"] == "registered":
            return self._client(client_id, row["info"])
        if not is_url_id(client_id):
            return None
        if row is not None and time.time() - _epoch(row["fetched_at"]) < OAUTH_DOCUMENT_CACHE_S:
            return self._client(client_id, row["info"])
        try:
            document = await fetch_document(
                client_id, allow_loopback=self._settings.oauth_allow_loopback_clients
            )
            info = OAuthClientInformationFull.model_validate(
                {**document, "client_id": client_id, "token_endpoint_auth_method": "none"}
            )
        except (DocumentRefused, ValidationError):
            return None
        if not all(_loopback_or_https(str(u)) for u in info.redirect_uris or ()):
            return None
        kept = info.model_dump(mode="json", exclude_none=True)
        await store.io(
            store.save_oauth_client, client_id, kind="metadata_document", info=kept, secret=None
        )
        return self._client(client_id, kept)

    @staticmethod
    def _client(client_id: str, info: Any) -> OAuthClientInformationFull:
        data = info if isinstance(info, dict) else json.loads(info)
        found = OAuthClientInformationFull.model_validate({**data, "client_id": client_id})
        if found.scope is None:
            found.scope = ALL_SCOPES
        return found

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        uris = [str(u) for u in client_info.redirect_uris or ()]
        if not uris or not all(_loopback_or_https(u) for u in uris):
            raise RegistrationError(
                "invalid_redirect_uri",
                "redirect URIs are https, or http to a loopback address, with no user, "
                "password or fragment",
            )
        too_large = _too_large(client_info, uris)
        if too_large is not None:
            raise RegistrationError("invalid_client_metadata", too_large)
        secret = client_info.client_secret
        kept = client_info.model_dump(mode="json", exclude_none=True)
        kept.pop("client_secret", None)
        store = self.state.store
        await store.io(
            store.save_oauth_client,
            client_info.client_id,
            kind="registered",
            info=kept,
            secret=secret,
        )

    async def secret_hash(self, client_id: str) -> str | None:
        store = self.state.store
        row = await store.io(store.oauth_client, client_id)
        return None if row is None else row["secret_hash"]

    # --- authorization ------------------------------------------------------------------------

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        resource = resource_of(self._settings)
        if params.resource is not None and not _our_resource(params.resource, resource):
            raise AuthorizeError("invalid_target", f"this server's resource is {resource}")
        if params.state is not None and len(params.state) > OAUTH_MAX_STATE_CHARS:
            raise AuthorizeError(
                "invalid_request", f"state: at most {OAUTH_MAX_STATE_CHARS} characters"
            )
        scopes = [s for s in (params.scopes or (client.scope or ALL_SCOPES).split()) if s]
        if not scopes or any(s not in SCOPES for s in scopes):
            raise AuthorizeError("invalid_scope", f"the scopes are {ALL_SCOPES}")
        kept = {
            "redirect_uri": str(params.redirect_uri),
            "redirect_explicit": params.redirect_uri_provided_explicitly,
            "code_challenge": params.code_challenge,
            "state": params.state,
            "scopes": scopes,
            "resource": params.resource or resource,
        }
        store = self.state.store
        request_id = await store.io(
            store.create_oauth_request, client.client_id, kept, ttl_s=OAUTH_REQUEST_TTL_S
        )
        return f"{self._settings.public_base}/#/consent?request={request_id}"

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> _Code | None:
        store = self.state.store
        row = await store.io(store.oauth_code, authorization_code)
        if row is None:
            return None
        params = row["params"]
        return _Code(
            code=authorization_code,
            scopes=row["scopes"],
            expires_at=_epoch(row["expires_at"]),
            client_id=row["client_id"],
            code_challenge=params["code_challenge"],
            redirect_uri=params["redirect_uri"],
            redirect_uri_provided_explicitly=params["redirect_explicit"],
            resource=params.get("resource"),
            subject=row["user_id"],
        )

    def _ttls(self) -> dict[str, int]:
        return {
            "access_ttl_s": self._settings.oauth_access_token_s,
            "refresh_ttl_s": self._settings.oauth_refresh_token_days * 86_400,
        }

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: _Code
    ) -> OAuthToken:
        store = self.state.store
        issued = await store.io(
            store.redeem_oauth_code,
            authorization_code.code,
            client_id=client.client_id,
            client_name=client.client_name or client.client_id,
            **self._ttls(),
        )
        if issued is None:
            raise TokenError("invalid_grant", "the code was used already, or the access ended")
        return _token(issued)

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> _Refresh | None:
        store = self.state.store
        row = await store.io(store.oauth_refresh_token, refresh_token)
        if row is None:
            # A rotated one used again: the exchange revokes its family, then refuses.
            return _Refresh(token=refresh_token, client_id=client.client_id, scopes=[], family="")
        return _Refresh(
            token=refresh_token,
            client_id=row["client_id"],
            scopes=row["scopes"],
            expires_at=int(_epoch(row["expires_at"])),
            resource=row["resource"],
            subject=row["user_id"],
            family=row["family"],
        )

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: _Refresh, scopes: list[str]
    ) -> OAuthToken:
        store = self.state.store
        issued = await store.io(
            store.rotate_oauth_refresh,
            refresh_token.token,
            client_id=client.client_id,
            client_name=client.client_name or client.client_id,
            scopes=tuple(scopes or refresh_token.scopes),
            **self._ttls(),
        )
        if issued is None:
            raise TokenError("invalid_grant", "the refresh token was used, revoked or expired")
        return _token(issued)

    async def load_access_token(self, token: str) -> _Access | None:
        store = self.state.store
        row = await store.io(store.oauth_access_token, token)
        if row is None:
            return None
        return _Access(
            token=token,
            client_id=row["client_id"],
            scopes=row["scopes"],
            expires_at=int(_epoch(row["expires_at"])) if row["expires_at"] else None,
            subject=row["user_id"],
            family=row["family"],
        )

    async def revoke_token(self, token: _Access | _Refresh) -> None:
        if not token.family:
            return
        store = self.state.store
        await store.io(store.revoke_oauth_family, token.family, actor_user_id=token.subject)


def _token(issued: Any) -> OAuthToken:
    return OAuthToken(
        access_token=issued.access_token,
        token_type="Bearer",
        expires_in=issued.expires_in,
        scope=" ".join(issued.scopes),
        refresh_token=issued.refresh_token,
    )


class HashedSecretAuthenticator(ClientAuthenticator):
    """The SDK's client authentication, against the hash of a registered client's secret
    (the store keeps no secret): client_secret_basic or client_secret_post for a client
    registered with a secret, none for a public one (PKCE is its proof)."""

    def __init__(self, provider: Provider) -> None:
        super().__init__(provider)  # type: ignore[arg-type]
        self._runnerd = provider

    async def authenticate_request(self, request: Request) -> OAuthClientInformationFull:
        form = await request.form()
        client_id = form.get("client_id")
        if not isinstance(client_id, str) or not client_id:
            raise AuthenticationError("Missing client_id")
        client = await self._runnerd.get_client(client_id)
        if client is None:
            raise AuthenticationError("Invalid client_id")
        stored = await self._runnerd.secret_hash(client_id)
        if stored is None:
            return client  # a public client
        sent: str | None = None
        header = request.headers.get("authorization", "")
        if header[:6].lower() == "basic ":
            try:
                sent_id, _, secret = base64.b64decode(header[6:]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise AuthenticationError("Invalid Basic authentication header") from None
            if unquote(sent_id) != client_id:
                raise AuthenticationError("Client ID mismatch in Basic auth")
            sent = unquote(secret)
        elif isinstance(form.get("client_secret"), str):
            sent = str(form.get("client_secret"))
        if not sent or not hmac.compare_digest(hash_key(sent), stored):
            raise AuthenticationError("Invalid client_secret")
        return client


class Revocation:
    """RFC 7009 revocation. The SDK's handler demands a client_secret field even of a
    public client, so this one, on the same authenticator: the token (access or
    refresh) of the authenticated client and every token of its consent are revoked;
    200 whether or not the token was known."""

    def __init__(self, provider: Provider, authenticator: ClientAuthenticator) -> None:
        self._provider = provider
        self._authenticator = authenticator

    async def handle(self, request: Request) -> Response:
        headers = {"Cache-Control": "no-store", "Pragma": "no-cache"}
        try:
            client = await self._authenticator.authenticate_request(request)
        except AuthenticationError as exc:
            body = {"error": "invalid_client", "error_description": exc.message}
            return JSONResponse(body, status_code=401, headers=headers)
        sent = (await request.form()).get("token")
        if not isinstance(sent, str) or not sent:
            body = {"error": "invalid_request", "error_description": "token is required"}
            return JSONResponse(body, status_code=400, headers=headers)
        found: _Access | _Refresh | None = await self._provider.load_access_token(sent)
        if found is None:
            found = await self._provider.load_refresh_token(client, sent)
        if found is not None and found.client_id == client.client_id:
            await self._provider.revoke_token(found)
        return Response(status_code=200, headers=headers)


def _limited(app: ASGIApp, max_body: int = DEFAULT_MAX_REQUEST_BODY_SIZE) -> ASGIApp:
    return CORSMiddleware(
        RequestBodyLimitMiddleware(app, max_body),
        allow_origins="*",
        allow_methods=["POST", "OPTIONS"],
        allow_headers=["Authorization", "Content-Type", "MCP-Protocol-Version"],
    )


class OAuthServer:
    """The OAuth endpoints' ASGI apps, by path."""

    def __init__(self, state: AppState) -> None:
        settings = state.settings
        issuer = settings.public_base
        provider = Provider(state)
        authenticator = HashedSecretAuthenticator(provider)
        # Strings, so the models keep a path-less issuer as it is (no trailing slash):
        # clients compare issuers as strings (RFC 8414 §3.3).
        metadata = OAuthMetadata.model_validate(
            {
                "issuer": issuer,
                "authorization_endpoint": issuer + AUTHORIZE_PATH,
                "token_endpoint": issuer + TOKEN_PATH,
                "registration_endpoint": issuer + REGISTER_PATH,
                "revocation_endpoint": issuer + REVOKE_PATH,
                "revocation_endpoint_auth_methods_supported": AUTH_METHODS,
                "scopes_supported": list(SCOPES),
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "token_endpoint_auth_methods_supported": AUTH_METHODS,
                "code_challenge_methods_supported": ["S256"],
                "client_id_metadata_document_supported": True,
                "authorization_response_iss_parameter_supported": True,
            }
        )
        resource = ResourceMetadata.model_validate(
            {
                "resource": resource_of(settings),
                "authorization_servers": [issuer],
                "scopes_supported": list(SCOPES),
                "resource_name": "runnerd",
            }
        )
        registration = ClientRegistrationOptions(
            enabled=True, valid_scopes=list(SCOPES), default_scopes=list(SCOPES)
        )
        self.apps: dict[str, ASGIApp] = {
            "metadata": cors_middleware(MetadataHandler(metadata).handle, ["GET", "OPTIONS"]),
            "resource": cors_middleware(
                ProtectedResourceMetadataHandler(resource).handle, ["GET", "OPTIONS"]
            ),
            "authorize": RequestBodyLimitMiddleware(
                request_response(AuthorizationHandler(provider).handle),  # type: ignore[arg-type]
                DEFAULT_MAX_REQUEST_BODY_SIZE,
            ),
            "token": _limited(
                request_response(_Tokens(provider, authenticator, resource_of(settings)).handle)
            ),
            "register": _limited(
                request_response(RegistrationHandler(provider, registration).handle),  # type: ignore[arg-type]
                OAUTH_MAX_REGISTRATION_BYTES,
            ),
            "revoke": _limited(request_response(Revocation(provider, authenticator).handle)),
        }
