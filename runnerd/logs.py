"""The daemon's logs: text (the default) or one JSON object a line (``log_format =
"json"``), each with the id of the request it belongs to, which also travels back as
the ``X-Request-Id`` header. Logs never hold an input, an output or a secret value."""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar

__all__ = ["REQUEST_ID", "configure"]

# Set for each HTTP request by RequestIds (runnerd/daemon/middleware.py).
REQUEST_ID: ContextVar[str | None] = ContextVar("runnerd_request_id", default=None)


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
    # httpx logs each request's whole URL at INFO: a webhook's path often carries a token,
    # and a client's document URL is the client's to keep. runnerd logs what it sends.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
