"""The composition root: the daemon's ASGI app, built from the op table's routes, the
Manage page's, /mcp and /metrics; the middleware every answer passes; one error path for
everything that goes wrong; and the lifespan (runnerd/daemon/lifespan.py) that holds
the store, the machine and the governor while it serves."""

from __future__ import annotations

import functools
import logging
import traceback
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from runnerd.api.errors import ApiError, code_for_status, error_response, from_domain
from runnerd.api.ops import Op
from runnerd.api.reading import refuse_body, require_json
from runnerd.api.routes import OPS
from runnerd.config import Settings
from runnerd.daemon.lifespan import lifespan
from runnerd.daemon.metrics_route import metrics
from runnerd.daemon.middleware import AnswerFirst, RequestIds, SecurityHeaders
from runnerd.daemon.peer_route import peer_result
from runnerd.govern.peers import PEER_PATH
from runnerd.mcp.endpoint import McpEndpoint
from runnerd.oauth import oauth_routes
from runnerd.run.runtimes import Runtimes
from runnerd.web.pages import web_routes

__all__ = ["create_app"]

log = logging.getLogger("runnerd")


def _endpoint(op: Op) -> Any:
    changes_state = op.method != "GET"

    async def endpoint(request: Request) -> Response:
        try:
            # Before anything else: what changes state takes a JSON body (415 for any
            # other type, so no cross-site form gets in), or none at all.
            if op.body is not None:
                require_json(request.headers)
            elif changes_state:
                await refuse_body(request)
            return await op.handler(request, request.app.state.runnerd)
        except ClientDisconnect:
            # The client went away mid-body (or its body stalled and was cut): nobody
            # reads an answer, and it is no internal error. Nothing was changed.
            log.debug("%s %s: the client went away before its body ended", op.method, op.path)
            return Response(status_code=400)
        except Exception as exc:
            return _unexpected(request, exc)

    endpoint.__name__ = op.operation_id
    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = code_for_status(exc.status_code)
    headers = dict(exc.headers or {})
    error = ApiError(code, headers=headers)
    return error_response(error)


def _unexpected(request: Request, exc: Exception) -> Response:
    """The answer to what a handler raised: a named error's envelope (``from_domain``),
    else a 500 that is logged."""
    mapped = from_domain(exc)
    if mapped is not None:
        return error_response(mapped)
    # The message may quote an input or a secret: log the type and where, never the text.
    where = "".join(traceback.format_tb(exc.__traceback__))
    log.error(
        "internal error %s on %s %s\n%s",
        type(exc).__name__,
        request.method,
        request.url.path,
        where,
    )
    return error_response(ApiError("INTERNAL_ERROR"))


def create_app(
    settings: Settings, *, freeze_heap: bool = True, runtimes: Runtimes | None = None
) -> Starlette:
    """The daemon's app for ``settings``: nothing is opened until its lifespan starts
    (runnerd/daemon/lifespan.py). What a test may replace comes in as a keyword-only
    argument and is handed to the lifespan: ``freeze_heap`` False where the process
    outlives the app, ``runtimes`` found once for many apps (tests serving the app in
    their own process)."""
    gateway = McpEndpoint()

    routes: list[BaseRoute] = [Route(op.path, _endpoint(op), methods=[op.method]) for op in OPS]
    routes += web_routes()
    routes.append(Route("/mcp", gateway, methods=["GET", "POST", "DELETE"]))
    routes += oauth_routes()
    routes.append(Route("/metrics", metrics, methods=["GET"]))
    routes.append(Route(PEER_PATH, peer_result, methods=["GET"]))
    return Starlette(
        routes=routes,
        lifespan=functools.partial(
            lifespan, settings=settings, mcp=gateway, freeze_heap=freeze_heap, runtimes=runtimes
        ),
        # AnswerFirst outermost: what runs after an answer waits for all of it.
        middleware=[Middleware(AnswerFirst), Middleware(RequestIds), Middleware(SecurityHeaders)],
        exception_handlers={HTTPException: _http_error},
    )
