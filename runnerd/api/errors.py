"""The error envelope, ``{"error": {"code", "message", "details"?}}``, built in one place.

Every error from every route is ``{"error": {"code", "message", "details"?}}``. Handlers
raise the named errors of runnerd/errors.py (``InstallNotFound()``, ``AppNotFound(slug)``):
each carries its HTTP status, wire reason and default message, and ``from_domain`` maps
it to the envelope here and nowhere else. ``ApiError`` is the envelope itself: what
``error_response`` writes, also for what no domain error names (an unknown route, a
wrong method, an internal error).
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response

from runnerd.errors import RunnerdError
from runnerd.metrics import METRICS

__all__ = [
    "ApiError",
    "code_for_status",
    "count_refusal",
    "envelope",
    "error_response",
    "from_domain",
]

# code -> (HTTP status, default message): the List App Tools codes, plus what the
# management API adds (405, 409, 415).
CODES: dict[str, tuple[int, str]] = {
    "BAD_REQUEST": (400, "Invalid request"),
    "UNAUTHORIZED": (401, "Authentication required"),
    "FORBIDDEN": (403, "Insufficient workspace permissions"),
    "NOT_FOUND": (404, "Not found"),
    "METHOD_NOT_ALLOWED": (405, "Method not allowed"),
    "CONFLICT": (409, "Conflict"),
    "UNSUPPORTED_MEDIA_TYPE": (415, "Content-Type must be application/json"),
    "RATE_LIMITED": (429, "API rate limit exceeded"),
    "INTERNAL_ERROR": (500, "Internal server error"),
    "SERVICE_UNAVAILABLE": (503, "Service temporarily unavailable"),
}
_BY_STATUS = {status: code for code, (status, _) in CODES.items()}


class ApiError(Exception):
    """An error answer: ``code`` from CODES, a message, and ``details`` (details.code is
    the precise reason, such as INSUFFICIENT_WORKSPACE_ROLE). Built by ``from_domain``
    from a named error, or for an answer no domain error names."""

    def __init__(
        self,
        code: str,
        message: str | None = None,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.code = code
        self.status, default = CODES[code]
        self.message = message or default
        self.details = details
        self.headers = headers or {}
        super().__init__(self.message)


def count_refusal(error: ApiError) -> None:
    """Count a refusal in ``runnerd_refusals_total``, by its reason (details.code, else
    the code): once for each refusal, on every surface (this module's error answers,
    MCP's refused calls)."""
    METRICS.refusals.labels(str((error.details or {}).get("code", error.code))).inc()


def error_response(error: ApiError) -> Response:
    """The one function that builds an error body (and counts the refusal)."""
    count_refusal(error)
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.details is not None:
        body["details"] = error.details
    return Response(
        msgspec.json.encode({"error": body}),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers,
    )


def code_for_status(status: int) -> str:
    """The envelope code of an HTTP status (BAD_REQUEST for one not listed)."""
    return _BY_STATUS.get(status, "BAD_REQUEST")


def from_domain(exc: Exception) -> ApiError | None:
    """The envelope of a domain error that carries a wire reason; None for anything else
    (an internal error).

    The envelope's code follows the status; details.code is the reason, unless the reason
    is that code itself (UNAUTHORIZED, RATE_LIMITED...), which says nothing more."""
    if not isinstance(exc, RunnerdError) or exc.reason is None:
        return None
    code = code_for_status(exc.status)
    wire = exc.wire_details()
    details = (wire or None) if exc.reason == code else {"code": exc.reason, **wire}
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
    return ApiError(code, str(exc), details=details, headers=headers)


def envelope(exc: RunnerdError) -> ApiError:
    """The envelope of a domain error caught on its way to a caller (``from_domain``).
    One without a wire reason is raised on: it is an internal error, for the error path
    that logs it."""
    error = from_domain(exc)
    if error is None:
        raise exc
    return error
