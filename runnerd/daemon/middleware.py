"""The ASGI middleware every answer of the daemon passes, outermost first: work after the
answer (``AnswerFirst``), the request's id (``RequestIds``), the security headers
(``SecurityHeaders``). ``create_app`` stacks them in that order."""

from __future__ import annotations

import logging
import re
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runnerd.after_answer import PENDING, Pending
from runnerd.logs import REQUEST_ID
from runnerd.web.csp import CSP

__all__ = ["AnswerFirst", "RequestIds", "SecurityHeaders"]

log = logging.getLogger(__name__)

_GIVEN_ID = re.compile(r"^[A-Za-z0-9._-]{8,64}$")  # a caller's own request id, when it is plain

SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


class AnswerFirst:
    """Runs what ``after_answer`` was given right after the request's last response
    message is sent (uvicorn has written it to the socket when ``send`` returns), before
    anything else on the loop. Work left when the app returns without a last message (a
    client gone, an error) runs then."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        pending = Pending()

        async def send_then_work(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                _run(pending)

        token = PENDING.set(pending)
        try:
            await self.app(scope, receive, send_then_work)
        finally:
            PENDING.reset(token)
            _run(pending)


def _run(pending: Pending) -> None:
    pending.open = False
    work, pending.work = pending.work, []
    for one in work:
        try:
            one()
        except Exception:
            log.exception("work after an answer failed")


class RequestIds:
    """Gives each HTTP request an id (the caller's plain ``X-Request-Id``, or a new one),
    for its log lines and its answer's ``X-Request-Id`` header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _GIVEN_ID.match(given) else "req_" + secrets.token_hex(8)
        token = REQUEST_ID.set(request_id)

        async def with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []),
                                      (b"x-request-id", request_id.encode())]  # fmt: skip
            await send(message)

        try:
            await self.app(scope, receive, with_id)
        finally:
            REQUEST_ID.reset(token)


# Answers a cache must not keep (a person's data, a session's CSRF token, a frame token),
# unless a route says otherwise.
_PRIVATE_PATHS = ("/api/", "/mcp", "/oauth/")


class SecurityHeaders:
    """Adds the security headers to every answer (the API's JSON and the Manage page
    alike), keeping any a route set itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        private = scope["path"].startswith(_PRIVATE_PATHS)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (name, value) for name, value in SECURITY_HEADERS if name not in present
                ]
                if private and b"cache-control" not in present:
                    message["headers"].append((b"cache-control", b"no-store"))
            await send(message)

        await self.app(scope, receive, with_headers)
