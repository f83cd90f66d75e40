"""The error envelope of seed 003, built in exactly one place.

Every error from every route is ``{"error": {"code", "message", "details"?}}``. The HTTP
status is an attribute of the error; domain errors are mapped to it here and nowhere
else.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from starlette.responses import Response

from runnerd.calls import ApprovalUnavailable, IdempotencyConflict, RunQueueFull, ToolNotFound
from runnerd.errors import BudgetExhausted, BundleRejected, VersionExists
from runnerd.run.jail import SandboxUnavailable
from runnerd.run.runner import InputRejected, ToolUnusable
from runnerd.vault import VaultError

__all__ = ["ApiError", "error_response", "from_domain"]

# code -> (HTTP status, default message), from seed 003 plus what the management API adds.
CODES: dict[str, tuple[int, str]] = {
    "BAD_REQUEST": (400, "Invalid request"),
    "UNAUTHORIZED": (401, "Authentication required"),
    "FORBIDDEN": (403, "Insufficient workspace permissions"),
    "NOT_FOUND": (404, "Not found"),
    "METHOD_NOT_ALLOWED": (405, "Method not allowed"),
    "CONFLICT": (409, "Conflict"),
    "RATE_LIMITED": (429, "API rate limit exceeded"),
    "INTERNAL_ERROR": (500, "Internal server error"),
    "SERVICE_UNAVAILABLE": (503, "Service temporarily unavailable"),
}


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
    """The one function that builds an error body."""
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.details is not None:
        body["details"] = error.details
    return Response(
        msgspec.json.encode({"error": body}),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers,
    )


def from_domain(exc: Exception) -> ApiError | None:
    """The API error for a domain error, or None if it is not one we map."""
    if isinstance(exc, BundleRejected):
        return ApiError(
            "BAD_REQUEST",
            str(exc),
            details={
                "code": "BUNDLE_REJECTED",
                "problems": [msgspec.to_builtins(p) for p in exc.problems],
            },
        )
    if isinstance(exc, VersionExists):
        return ApiError("CONFLICT", str(exc), details={"code": "VERSION_EXISTS"})
    if isinstance(exc, BudgetExhausted):
        return ApiError(
            "FORBIDDEN", str(exc), details={"code": "budget_exhausted", "resetsAt": exc.resets_at}
        )
    if isinstance(exc, ToolUnusable):
        return ApiError("CONFLICT", str(exc), details={"code": "TOOL_UNUSABLE"})
    if isinstance(exc, ToolNotFound):
        return ApiError("NOT_FOUND", str(exc), details={"code": "TOOL_NOT_FOUND"})
    if isinstance(exc, IdempotencyConflict):
        return ApiError("CONFLICT", str(exc), details={"code": "IDEMPOTENCY_KEY_REUSED"})
    if isinstance(exc, ApprovalUnavailable):
        code = {"APPROVAL_NOT_FOUND": "NOT_FOUND", "NOT_AN_APPROVER": "FORBIDDEN"}.get(
            exc.reason, "CONFLICT"
        )
        return ApiError(code, str(exc), details={"code": exc.reason})
    if isinstance(exc, RunQueueFull):
        return ApiError(
            "SERVICE_UNAVAILABLE",
            str(exc),
            details={"code": "RUN_QUEUE_FULL"},
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, (SandboxUnavailable, VaultError)):
        return ApiError(
            "SERVICE_UNAVAILABLE", str(exc), details={"code": type(exc).__name__.upper()}
        )
    if isinstance(exc, InputRejected):
        details: dict[str, Any] = {"code": exc.code}
        if exc.pointer is not None:
            details["pointer"] = exc.pointer
        return ApiError("BAD_REQUEST", str(exc), details=details)
    return None
