"""OAuth 2.1 for MCP clients: runnerd is its own authorization server for its people.

- ``/.well-known/oauth-protected-resource`` (and ``…/mcp``): RFC 9728 metadata of the
  resource ``{public_base}/mcp``; a 401 from /mcp points at it (``api.auth.oauth_challenge``).
- ``/.well-known/oauth-authorization-server``: RFC 8414 metadata.
- ``/oauth/authorize`` (code + PKCE S256 only), ``/oauth/token``, ``/oauth/register``
  (RFC 7591), ``/oauth/revoke`` (RFC 7009). Consent: the Manage page's
  ``#/consent`` screen, over api/oauth.py (which holds the paths and lifetimes).

The protocol is the MCP SDK's server auth handlers (runnerd/oauth/provider.py), loaded
at the first OAuth request, in a thread (as /mcp loads the SDK): most daemons never
see one. Every OAuth path answers only under a served Host (as /mcp, the DNS-rebinding
rule; runnerd/mcp/endpoint.py), and what is posted to them spends a rate-limit token
of the client's address (the API's rate, ``rate_limit_per_second``).
"""

from __future__ import annotations

import asyncio
import importlib
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from runnerd.api.auth import RESOURCE_METADATA_PATH
from runnerd.api.errors import envelope, error_response
from runnerd.api.oauth import AUTHORIZE_PATH, REGISTER_PATH, REVOKE_PATH, TOKEN_PATH
from runnerd.errors import HostNotAllowed, QueryTooLarge, RunnerdError
from runnerd.limits import OAUTH_MAX_QUERY_BYTES
from runnerd.mcp.endpoint import host_served, served_hosts

if TYPE_CHECKING:
    from runnerd.config import Settings

__all__ = ["oauth_routes"]


class _Lazy:
    """One OAuth endpoint: the SDK's handlers built at the first request of the app
    (kept in its ``app.state.oauth``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    async def _loaded(app_state: Any) -> Any:
        found: asyncio.Future[Any] | None = getattr(app_state, "oauth", None)
        if found is None:
            found = asyncio.get_running_loop().create_future()
            app_state.oauth = found
            try:
                module = await asyncio.to_thread(importlib.import_module, "runnerd.oauth.provider")
                found.set_result(module.OAuthServer(app_state.runnerd))
            except Exception as exc:
                found.set_exception(exc)
        return await asyncio.shield(found)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app_state = scope["app"].state
        try:
            if not _host_served(scope, app_state.runnerd.settings):
                raise HostNotAllowed
            # No key to count by: the client's address. Every POST, and every request to
            # authorize (it stores the request, and may fetch a client's document).
            if scope["method"] == "POST" or self.name == "authorize":
                client = scope.get("client") or ("", 0)
                app_state.runnerd.limiter.take(f"oauth-from:{client[0]}")
            if self.name == "authorize" and len(scope.get("query_string", b"")) > (
                OAUTH_MAX_QUERY_BYTES
            ):
                raise QueryTooLarge(OAUTH_MAX_QUERY_BYTES)
        except RunnerdError as exc:
            await error_response(envelope(exc))(scope, receive, send)
            return
        server = await self._loaded(app_state)
        app: ASGIApp = server.apps[self.name]
        await app(scope, receive, send)


def _host_served(scope: Scope, settings: Settings) -> bool:
    served = served_hosts(settings)
    return "*" in served or host_served(Headers(scope=scope), served)


def oauth_routes() -> list[Route]:
    """The OAuth routes of the daemon's app (runnerd/daemon/app.py)."""
    meta = ["GET", "OPTIONS"]
    posted = ["POST", "OPTIONS"]
    return [
        Route(RESOURCE_METADATA_PATH, _Lazy("resource"), methods=meta),
        Route(f"{RESOURCE_METADATA_PATH}/mcp", _Lazy("resource"), methods=meta),
        Route("/.well-known/oauth-authorization-server", _Lazy("metadata"), methods=meta),
        Route(AUTHORIZE_PATH, _Lazy("authorize"), methods=["GET", "POST"]),
        Route(TOKEN_PATH, _Lazy("token"), methods=posted),
        Route(REGISTER_PATH, _Lazy("register"), methods=posted),
        Route(REVOKE_PATH, _Lazy("revoke"), methods=posted),
    ]
