"""The daemon's logs: text (the default) or one JSON object a line (``log_format =
"json"``), each with the id of the request it belongs to, which also travels back as
the ``X-Request-Id`` header. Logs never hold an input, an output or a secret value."""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["REQUEST_ID", "RequestIds", "configure"]

REQUEST_ID: ContextVar[str | None] = ContextVar("runnerd_request_id", default=None)
_GIVEN = re.compile(r"^[A-Za-z0-9._-]{8,64}$")  # a caller's own id, when it is plain


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = REQUEST_ID.get()
        if request_id:
            entry["requestId"] = request_id
        if record.exc_info and record.exc_info[0] is not None:
            entry["error"] = record.exc_info[0].__name__  # the type only: never a message
        return json.dumps(entry, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = REQUEST_ID.get()
        return f"{line} [{request_id}]" if request_id else line


def configure(level: str, fmt: str) -> None:
    """Logging for ``runnerd serve``: every logger (uvicorn's too) through one handler."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True


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
        request_id = given if _GIVEN.match(given) else "req_" + secrets.token_hex(8)
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
