"""The error envelope, ``{"error": {"code", "message", "details"?}}``, built in one place.

Every error from every route is ``{"error": {"code", "message", "details"?}}``. The HTTP
status is an attribute of the error; domain errors are mapped to it here and nowhere
else.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from starlette.responses import Response

from runnerd.errors import RunnerdError
from runnerd.metrics import METRICS

__all__ = ["ApiError", "code_for_status", "error_response", "from_domain"]

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
    the precise reason, such as INSUFFICIENT_WORKSPACE_ROLE)."""

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

    @classmethod
    def forbidden(cls, reason: str, message: str | None = None) -> ApiError:
        return cls("FORBIDDEN", message, details={"code": reason})

    @classmethod
    def rate_limited(cls, retry_after_s: float) -> ApiError:
        when = datetime.now(UTC) + timedelta(seconds=retry_after_s)
        stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return cls(
            "RATE_LIMITED",
            details={"retryAfter": stamp},
            headers={"Retry-After": str(max(1, round(retry_after_s + 0.499)))},
        )


def error_response(error: ApiError) -> Response:
    """The one function that builds an error body (and counts the refusal)."""
    METRICS.refusals.labels(str((error.details or {}).get("code", error.code))).inc()
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
    """The API error for a domain error that carries a wire reason, or None."""
    if not isinstance(exc, RunnerdError) or exc.reason is None:
        return None
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
    return ApiError(
        code_for_status(exc.status),
        str(exc),
        details={"code": exc.reason, **exc.wire_details()},
        headers=headers,
    )
