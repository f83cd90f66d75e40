"""Every domain error runnerd raises on purpose, in one table.

Each error is a class: its HTTP ``status``, its wire ``reason`` (``details.code`` in the
error envelope) and, in its docstring, the one line a reader needs. The errors know
nothing about HTTP beyond those two facts: the API layer (api/errors.py, ``from_domain``)
turns each into the envelope in one place, and docs/API.md lists every reason a caller
can meet (tests/test_error_table.py keeps the two in step).

A reason that is the envelope's code itself (``UNAUTHORIZED``, ``RATE_LIMITED``,
``SERVICE_UNAVAILABLE``) is not repeated in ``details``: those answers carry no
``details.code``. An error without a reason never reaches a caller as such: it is a 500,
or the CLI's message.

A leaf module: it imports nothing from runnerd at run time.

Sections: sign-in and access; request bodies and queries; apps, versions and installs;
calls; approvals; secrets; people and keys; runs; store and vault; config; the daemon's
doors (health, connections, MCP); the CLI's client.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

if TYPE_CHECKING:
    from runnerd.model import Problem

__all__ = [
    "ApiFailure",
    "AppNotFound",
    "AppOwnedByAnotherWorkspace",
    "ApprovalNotFound",
    "ApprovalNotPending",
    "ApprovalOfAnotherCall",
    "ApprovalRequestLost",
    "ApprovalUnavailable",
    "AskerNoLongerAllowed",
    "BackupError",
    "BodyNotAllowed",
    "BodyTooLarge",
    "BudgetExhausted",
    "BundleRejected",
    "ConfigError",
    "ContentTypeNotJson",
    "CsrfTokenInvalid",
    "DatabaseUnavailable",
    "DuplicateKey",
    "DuplicateSessionId",
    "EgressNotRequested",
    "EnvBuildFailed",
    "EnvNotReady",
    "GitDeployNotFound",
    "GitSourceInvalid",
    "HostNotAllowed",
    "IdempotencyConflict",
    "InputRejected",
    "InputTooLarge",
    "InstallNotFound",
    "InsufficientRole",
    "InsufficientScope",
    "InvalidApiKey",
    "InvalidApprovalRule",
    "InvalidBody",
    "InvalidEgress",
    "InvalidIdempotencyKey",
    "InvalidInput",
    "InvalidQuery",
    "InvalidScopes",
    "InvalidSecretName",
    "InvalidSecretValue",
    "InvalidSignIn",
    "InvalidWebhookUrl",
    "KeyNotFound",
    "McpStopping",
    "MemberNotFound",
    "MissingWorkspace",
    "NoPages",
    "NoPreviousVersion",
    "NotAMember",
    "NotAnApprover",
    "NotReady",
    "OAuthRequestNotFound",
    "OriginNotAllowed",
    "PagesOff",
    "PersonalKeyRequired",
    "RateLimited",
    "RequestHeadTooLarge",
    "RequestTimeout",
    "RunNotFound",
    "RunQueueFull",
    "RunnerdError",
    "SandboxUnavailable",
    "SecretNotFound",
    "Stopping",
    "StoreUnavailable",
    "SurfaceNotProven",
    "TemplateUnavailable",
    "TooManyConnections",
    "ToolNotFound",
    "ToolUnusable",
    "ToolchainError",
    "Unauthenticated",
    "VaultError",
    "VersionExists",
    "VersionNotFound",
    "VersionNotPublished",
    "WebhookNotFound",
    "WebhookSignatureInvalid",
    "WorkspaceKeyNotAllowed",
    "WorkspaceNotFound",
]


class RunnerdError(Exception):
    """Base of every error runnerd raises on purpose.

    An error a caller of the API may meet says so with ``reason`` (the wire reason,
    ``details.code``) and ``status`` (the HTTP status); ``wire_details`` adds what the caller
    needs besides, and ``retry_after_s`` when trying again later will work. The API maps
    every such error through these, in one place (api/errors.py). An error without a
    ``reason`` never reaches a caller as such: it is a 500.

    Raised without a message, the error says its ``default_message``.
    """

    reason: str | None = None
    status: int = 500
    retry_after_s: int | None = None
    default_message: ClassVar[str] = ""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.default_message)

    def wire_details(self) -> dict[str, Any]:
        return {}


# --- sign-in and access ---------------------------------------------------------------------


class Unauthenticated(RunnerdError):
    """No key or session, or one that no longer holds; the message says which."""

    reason, status = "UNAUTHORIZED", 401
    default_message = "Authentication required"


class InvalidApiKey(Unauthenticated):
    """The API key is unknown, or revoked."""

    default_message = "Invalid or revoked API key"


class InsufficientScope(RunnerdError):
    """A token without the scope the route needs."""

    reason, status = "INSUFFICIENT_SCOPE", 403

    def __init__(self, scope: str) -> None:
        super().__init__(f"this token lacks the {scope} scope")


class WorkspaceKeyNotAllowed(RunnerdError):
    """A workspace key, on a route that acts for a person."""

    reason, status = "WORKSPACE_KEY_NOT_ALLOWED", 403
    default_message = (
        "Workspace API keys cannot call this endpoint: a tool always runs for a person "
        "whose access can be checked; use a personal API key or token"
    )


class SurfaceNotProven(RunnerdError):
    """A run that names a surface its credential does not prove (``details.field``: the
    body's ``surface``, or the ``X-Runnerd-Frame`` header that did not verify)."""

    reason, status = "SURFACE_NOT_PROVEN", 403

    def __init__(self, message: str, field: str = "surface") -> None:
        self.field = field
        super().__init__(message)

    def wire_details(self) -> dict[str, Any]:
        return {"field": self.field}


class PersonalKeyRequired(RunnerdError):
    """A scoped token, where only a personal key will do (signing in, opening a frame)."""

    reason, status = "PERSONAL_KEY_REQUIRED", 403


class InsufficientRole(RunnerdError):
    """The person is not in the workspace with the role (and the Apps module) needed."""

    reason, status = "INSUFFICIENT_WORKSPACE_ROLE", 403
    default_message = "Insufficient workspace permissions"


class CsrfTokenInvalid(RunnerdError):
    """A session's request that changes state without the session's CSRF token."""

    reason, status = "CSRF_TOKEN_INVALID", 403
    default_message = "this request changes state and lacks the session's CSRF token"


class InvalidSignIn(RunnerdError):
    """A sign-in body with neither (or both) of apiKey and loginToken."""

    reason, status = "INVALID_SIGN_IN", 400
    default_message = "send apiKey (a personal API key) or loginToken (from a sign-in link)"


class RateLimited(RunnerdError):
    """Past the key's request rate; ``retryAfter`` says when the next one gets through."""

    reason, status = "RATE_LIMITED", 429
    default_message = "API rate limit exceeded"

    def __init__(self, retry_after_s: float) -> None:
        when = datetime.now(UTC) + timedelta(seconds=retry_after_s)
        self.retry_at = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        # Whole seconds for the header, rounded up, and never 0 (0 reads as "now").
        self.retry_after_s = max(1, round(retry_after_s + 0.499))
        super().__init__()

    def wire_details(self) -> dict[str, Any]:
        return {"retryAfter": self.retry_at}


# --- request bodies and queries -------------------------------------------------------------


class ContentTypeNotJson(RunnerdError):
    """A body not labelled ``application/json`` (with at most ``charset=utf-8``)."""

    reason, status = "CONTENT_TYPE_NOT_JSON", 415

    def __init__(self, got: str) -> None:
        super().__init__(
            "Content-Type must be application/json (a charset=utf-8 parameter may follow), "
            f"in one header; got {got}"
        )

    def wire_details(self) -> dict[str, Any]:
        return {"field": "Content-Type"}


class BodyNotAllowed(RunnerdError):
    """A body sent to a request that takes none."""

    reason, status = "BODY_NOT_ALLOWED", 400


class BodyTooLarge(RunnerdError):
    """A body over the route's limit, refused unread."""

    reason, status = "BODY_TOO_LARGE", 400

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit:,} bytes")


class QueryTooLarge(RunnerdError):
    """A query string over its limit (an OAuth authorization request's), refused unread."""

    reason, status = "QUERY_TOO_LARGE", 400

    def __init__(self, limit: int) -> None:
        super().__init__(f"the query string is larger than {limit:,} bytes")


class InvalidBody(RunnerdError):
    """A body that is not JSON, or not the route's shape; the message says where."""

    reason, status = "INVALID_BODY", 400


class DuplicateKey(RunnerdError):
    """A body holding a key twice in one object (``details.key`` names it)."""

    reason, status = "DUPLICATE_KEY", 400

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(
            f"request body holds the key {key!r} twice in one object; send each key once"
        )

    def wire_details(self) -> dict[str, Any]:
        return {"key": self.key}


class InvalidQuery(RunnerdError):
    """A query parameter missing or out of bounds (``details.field`` names it)."""

    reason, status = "INVALID_QUERY", 400

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)

    def wire_details(self) -> dict[str, Any]:
        return {"field": self.field}


class InvalidIdempotencyKey(RunnerdError):
    """An Idempotency-Key header that is empty or too long."""

    reason, status = "INVALID_IDEMPOTENCY_KEY", 400

    def __init__(self, max_chars: int) -> None:
        super().__init__(f"Idempotency-Key is 1 to {max_chars} characters")


# --- apps, versions and installs ------------------------------------------------------------


class BundleRejected(RunnerdError):
    """An upload had problems; nothing was stored. ``problems`` lists every one found."""

    reason, status = "BUNDLE_REJECTED", 400

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems = list(dict.fromkeys(problems))  # one found twice: once
        count = len(problems)
        super().__init__(
            f"{count} problem{'s' if count != 1 else ''} in the upload; nothing stored"
        )

    def __repr__(self) -> str:
        return f"BundleRejected({len(self.problems)} problems: {self.problems[:3]!r}...)"

    def wire_details(self) -> dict[str, Any]:
        return {"problems": [msgspec.to_builtins(p) for p in self.problems]}


class VersionExists(RunnerdError):
    """The app already has a version with this version string; versions are immutable."""

    reason, status = "VERSION_EXISTS", 409

    def __init__(self, slug: str, version: str) -> None:
        self.slug = slug
        self.version = version
        super().__init__(
            f"app {slug!r} already has version {version!r}; versions are immutable, "
            "so change `version` in agentserve.app.yaml (or remove it to get the next number)"
        )


class AppNotFound(RunnerdError):
    """No app of that slug."""

    reason, status = "APP_NOT_FOUND", 404

    def __init__(self, slug: str) -> None:
        super().__init__(f"No app {slug!r}")


class AppOwnedByAnotherWorkspace(RunnerdError):
    """The app's slug belongs to another workspace."""

    reason, status = "APP_OWNED_BY_ANOTHER_WORKSPACE", 403

    def __init__(self, slug: str) -> None:
        super().__init__(f"app {slug!r} belongs to another workspace")


class VersionNotFound(RunnerdError):
    """No such version (of that app)."""

    reason, status = "VERSION_NOT_FOUND", 404
    default_message = "No such version"

    def __init__(self, slug: str | None = None, version: str | None = None) -> None:
        super().__init__(f"No version {version!r} of app {slug!r}" if slug and version else "")


class VersionNotPublished(RunnerdError):
    """The version exists but is not published, so it cannot be installed."""

    reason, status = "VERSION_NOT_PUBLISHED", 400

    def __init__(self, slug: str, version: str) -> None:
        super().__init__(f"version {version!r} of {slug!r} is not published")


class NoPreviousVersion(RunnerdError):
    """A rollback of an install that never ran another version."""

    reason, status = "NO_PREVIOUS_VERSION", 400
    default_message = "the install has no previous version to roll back to"


class InvalidEgress(RunnerdError):
    """An egress grant entry that does not parse (``details.field`` names it)."""

    reason, status = "INVALID_EGRESS", 400

    def __init__(self, index: int, problem: str) -> None:
        self.field = f"egress[{index}]"
        super().__init__(f"{self.field}: {problem}")

    def wire_details(self) -> dict[str, Any]:
        return {"field": self.field}


class EgressNotRequested(RunnerdError):
    """An egress grant wider than the version asks for: a grant only narrows."""

    reason, status = "EGRESS_NOT_REQUESTED", 400

    def __init__(self, index: int, wanted: str, version: str) -> None:
        self.field = f"egress[{index}]"
        super().__init__(
            f"{self.field}: {wanted} is not among what version {version} asks for; a grant "
            "can only narrow the version's egress"
        )

    def wire_details(self) -> dict[str, Any]:
        return {"field": self.field}


class InstallNotFound(RunnerdError):
    """No such install, or one in a workspace the caller is not in."""

    reason, status = "INSTALL_NOT_FOUND", 404
    default_message = "No such install"


class NoPages(RunnerdError):
    """The install's version ships no pages (its manifest names no ``pages`` folder)."""

    reason, status = "NO_PAGES", 404
    default_message = "The installed version has no pages: its manifest names no pages folder"


class NoDevPages(RunnerdError):
    """The person holds no dev pages of the install (runnerd app dev)."""

    reason, status = "NO_DEV_PAGES", 404
    default_message = "You hold no dev pages of this install: run runnerd app dev DIR"


class PagesOff(RunnerdError):
    """The daemon serves no app pages: its ``apps_port`` is 0."""

    reason, status = "PAGES_OFF", 409
    default_message = "This daemon serves no app pages (apps_port is 0): an operator sets apps_port"


# --- calls ----------------------------------------------------------------------------------


class ToolNotFound(RunnerdError):
    """The installed version has no tool of that name."""

    reason, status = "TOOL_NOT_FOUND", 404


class IdempotencyConflict(RunnerdError):
    """The Idempotency-Key was first used with another request."""

    reason, status = "IDEMPOTENCY_KEY_REUSED", 409


class BudgetExhausted(RunnerdError):
    """The install's monthly budget is spent; refused before any sandbox starts."""

    reason, status = "budget_exhausted", 403  # lowercase: the wire reason apps already know

    def __init__(self, install_id: str, resets_at: str) -> None:
        self.install_id = install_id
        self.resets_at = resets_at
        super().__init__(
            f"the monthly budget of this install is spent; it resets at {resets_at}, or "
            "when an admin raises it"
        )

    def wire_details(self) -> dict[str, Any]:
        return {"resetsAt": self.resets_at}


class RunQueueFull(RunnerdError):
    """More runs are waiting than the queue holds; try again shortly."""

    reason, status, retry_after_s = "RUN_QUEUE_FULL", 503, 1


class Stopping(RunnerdError):
    """The daemon is stopping: it admits no new run; another node (or this one, once
    restarted) will."""

    reason, status, retry_after_s = "RUNNERD_STOPPING", 503, 5


class RunNotFound(RunnerdError):
    """No such run, or one in a workspace the caller is not in."""

    reason, status = "RUN_NOT_FOUND", 404
    default_message = "No such run"


# --- approvals ------------------------------------------------------------------------------


class ApprovalUnavailable(RunnerdError):
    """An approval that cannot be decided or run; the subclasses say why."""


class OAuthRequestNotFound(RunnerdError):
    """No such OAuth authorization request waiting for consent: decided already, or
    expired (10 minutes); the client must start again."""

    reason, status = "OAUTH_REQUEST_NOT_FOUND", 404
    default_message = "This sign-in request was decided already or has expired: start again"


class ApprovalNotFound(ApprovalUnavailable):
    """No such approval, or one in a workspace the caller is not in."""

    reason, status = "APPROVAL_NOT_FOUND", 404
    default_message = "No such approval"


class NotAnApprover(ApprovalUnavailable):
    """The person may not decide this approval."""

    reason, status = "NOT_AN_APPROVER", 403


class ApprovalNotPending(ApprovalUnavailable):
    """The approval was decided already, or expired."""

    reason, status = "APPROVAL_NOT_PENDING", 409


class ApprovalOfAnotherCall(ApprovalUnavailable):
    """A confirmation names an approval held for another call (another install, tool or
    input). Only MCP's confirmed retry meets it, and answers it as an MCP error."""


class ApprovalRequestLost(ApprovalUnavailable):
    """The held call's sealed input cannot be opened (held by an older release, or sealed
    with a secrets key this daemon does not have): deny it and call again."""

    reason, status = "APPROVAL_REQUEST_LOST", 409


class AskerNoLongerAllowed(ApprovalUnavailable):
    """The person who made the call may no longer run tools in the workspace."""

    reason, status = "ASKER_NO_LONGER_ALLOWED", 409


class InvalidApprovalRule(RunnerdError):
    """An approval rule that names no role and no person, or a person who is not in the
    workspace (``details.field`` names the part)."""

    reason, status = "INVALID_APPROVAL_RULE", 400

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)

    def wire_details(self) -> dict[str, Any]:
        return {"field": self.field}


class InvalidWebhookUrl(RunnerdError):
    """A webhook URL that is not http(s), or that reaches this daemon itself."""

    reason, status = "INVALID_WEBHOOK_URL", 400

    def wire_details(self) -> dict[str, Any]:
        return {"field": "url"}


class WebhookNotFound(RunnerdError):
    """The workspace has no webhook."""

    reason, status = "WEBHOOK_NOT_FOUND", 404
    default_message = "This workspace has no webhook"


class GitSourceInvalid(RunnerdError):
    """A Git deploy whose repository cannot be read, whose ref names no commit, or whose
    path holds no app at that commit (``details.field``: ``repository``, ``ref``, ``path``)."""

    reason, status = "GIT_SOURCE_INVALID", 400

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)

    def wire_details(self) -> dict[str, Any]:
        return {"field": self.field}


class GitDeployNotFound(RunnerdError):
    """No Git deploy is set for this app in this workspace."""

    reason, status = "GIT_DEPLOY_NOT_FOUND", 404
    default_message = "No Git deploy is set for this app in this workspace"


class WebhookSignatureInvalid(Unauthenticated):
    """A push webhook whose X-Hub-Signature-256 is missing or does not sign its body."""

    default_message = (
        "X-Hub-Signature-256 is missing, or is not sha256=<HMAC-SHA256 of the body> "
        "with the Git deploy's secret"
    )


# --- secrets --------------------------------------------------------------------------------


class InvalidSecretName(RunnerdError):
    """A secret name that is no environment variable name, or one runnerd reserves."""

    reason, status = "INVALID_SECRET_NAME", 400
    default_message = (
        "a secret name is an environment variable name: capital letters, digits and "
        "underscores, not starting with a digit, and not one runnerd or the runtimes use "
        "(PATH, HOME, LD_*, PYTHON*, NODE_*...)"
    )


class InvalidSecretValue(RunnerdError):
    """A secret value too short to scrub, or too large."""

    reason, status = "INVALID_SECRET_VALUE", 400


class SecretNotFound(RunnerdError):
    """The install has no secret of that name."""

    reason, status = "SECRET_NOT_FOUND", 404

    def __init__(self, name: str) -> None:
        super().__init__(f"the install has no secret {name}")


# --- people and keys ------------------------------------------------------------------------


class WorkspaceNotFound(RunnerdError):
    """No such workspace."""

    reason, status = "WORKSPACE_NOT_FOUND", 404
    default_message = "No such workspace"


class MemberNotFound(RunnerdError):
    """The person is not in this workspace."""

    reason, status = "MEMBER_NOT_FOUND", 404
    default_message = "No such person in this workspace"


class NotAMember(RunnerdError):
    """A key asked for a person who is not in the workspace."""

    reason, status = "NOT_A_MEMBER", 400

    def __init__(self, email: str, where: str = "this workspace") -> None:
        super().__init__(f"{email} is not a person of {where}: add them first")


class LastAdmin(RunnerdError):
    """The workspace's only admin demoted or taken out: nobody could manage it any more
    (only the host's CLI could mend it)."""

    reason, status = "LAST_ADMIN", 409

    def __init__(self) -> None:
        super().__init__("this is the workspace's only admin: make another person an admin first")


class InvalidEmail(RunnerdError):
    """A person named by something that is not an email address (the API's member body
    refuses the same with INVALID_BODY before this rule is reached)."""

    reason, status = "INVALID_EMAIL", 400

    def __init__(self, max_chars: int) -> None:
        super().__init__(f"an email address is name@domain, at most {max_chars} characters")


class KeysBeyondYourWorkspaces(RunnerdError):
    """A personal key or token made or revoked for someone who also belongs to a workspace
    where the admin asking is not an admin: their keys act there too."""

    reason, status = "KEYS_BEYOND_YOUR_WORKSPACES", 403

    def __init__(self) -> None:
        super().__init__(
            "this person also belongs to a workspace you are not an admin of, where their "
            "personal keys act too: only they, or an admin of each of their workspaces, may "
            "make or revoke their keys (to end their access here, remove them from this "
            "workspace)"
        )


class InvalidScopes(RunnerdError):
    """A token asked for with no scopes, or unknown ones."""

    reason, status = "INVALID_SCOPES", 400

    def __init__(self, scopes: tuple[str, ...]) -> None:
        super().__init__(f"a token needs scopes from {', '.join(scopes)}")


class KeyNotFound(RunnerdError):
    """No such key in this workspace."""

    reason, status = "KEY_NOT_FOUND", 404
    default_message = "No such key in this workspace"


# --- runs -----------------------------------------------------------------------------------


class InputRejected(RunnerdError):
    """The call is refused before any sandbox starts; ``code`` is the reason (a subclass
    below) and ``pointer`` the JSON pointer of the failing field (the first, when
    ``problems`` lists several: each ``{"pointer", "message"}``, a bounded number, and
    ``more`` says how many were left out; on the wire ``details.inputProblems`` and
    ``details.moreInputProblems``, as ``details.problems`` is a bundle's files)."""

    status = 400
    code: ClassVar[str]

    def __init__(
        self,
        message: str,
        pointer: str | None = None,
        *,
        problems: list[dict[str, str]] | None = None,
        more: int = 0,
    ) -> None:
        self.pointer = pointer
        self.problems = problems
        self.more = more
        super().__init__(message)

    def wire_details(self) -> dict[str, Any]:
        details: dict[str, Any] = {} if self.pointer is None else {"pointer": self.pointer}
        if self.problems is not None:
            details["inputProblems"] = self.problems
            details["moreInputProblems"] = self.more
        return details


class InvalidInput(InputRejected):
    """The input breaks the tool's input schema, or nests too deeply."""

    reason = code = "INVALID_INPUT"


class InputTooLarge(InputRejected):
    """The input is larger than a tool takes."""

    reason = code = "INPUT_TOO_LARGE"


class ToolUnusable(RunnerdError):
    """A stored tool this runnerd cannot call (its schema breaks a rule added since)."""

    reason, status = "TOOL_UNUSABLE", 409


class SandboxUnavailable(RunnerdError):
    """The jail cannot start at all (no nsjail, no runtime, no free uid)."""

    reason, status = "SANDBOXUNAVAILABLE", 503  # the wire reason clients already know


class TemplateUnavailable(SandboxUnavailable):
    """A Python template could not give this call a child it could verify (dead, refused,
    stuck, or a child that failed the daemon's checks): the call runs in a fresh nsjail
    instead. Never reaches a caller."""


class EnvBuildFailed(RunnerdError):
    """An installer refused; the message is the installer's own."""


class EnvNotReady(RunnerdError):
    """The tool's package environment is not built on this node yet (a build under way
    for longer than the tool's timeout, or one that failed here); no run started. Try
    again after ``Retry-After`` (or on another node)."""

    reason, status = "ENV_NOT_READY", 503

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ToolchainError(RunnerdError):
    """Node or the toolchain is missing or broken; the message says how to fix it."""


# --- store and vault ------------------------------------------------------------------------


class DatabaseUnavailable(RunnerdError):
    """The shared database (PostgreSQL) did not answer; nothing was started or changed.
    Try again shortly: the node reconnects on the next call."""

    reason, status, retry_after_s = "DATABASE_UNAVAILABLE", 503, 5


class StoreUnavailable(RunnerdError):
    """The database cannot be used: unreachable, or at a schema this runnerd does not
    serve. The message says what to do."""


class BackupError(RunnerdError):
    """A backup or restore that cannot be done; the message says why."""


class VaultError(RunnerdError):
    """The key is missing or wrong for a stored secret."""

    reason, status = "VAULTERROR", 503  # the wire reason clients already know


# --- config ---------------------------------------------------------------------------------


class ConfigError(RunnerdError):
    """A config file, env variable or flag with a bad value; the message names it."""


# --- the daemon's doors: health, connections, MCP -------------------------------------------


class NotReady(RunnerdError):
    """GET /readyz: a check failed (``details.checks`` says which)."""

    reason, status = "SERVICE_UNAVAILABLE", 503
    default_message = "not ready"

    def __init__(self, checks: dict[str, Any]) -> None:
        self.checks = checks
        super().__init__()

    def wire_details(self) -> dict[str, Any]:
        return {"checks": self.checks}


class RequestTimeout(RunnerdError):
    """The request's head or body did not arrive in time; the connection is closed."""

    reason, status = "REQUEST_TIMEOUT", 408
    default_message = "The request did not arrive in time"


class RequestHeadTooLarge(RunnerdError):
    """The request head is over its limit; the connection is closed."""

    reason, status = "REQUEST_HEAD_TOO_LARGE", 431
    default_message = "The request head is too large"


class TooManyConnections(RunnerdError):
    """The client holds as many connections as it may; this one is closed."""

    reason, status, retry_after_s = "TOO_MANY_CONNECTIONS", 503, 1
    default_message = "Too many connections from this client"


class MissingWorkspace(RunnerdError):
    """/mcp without ?workspaceId=: a session belongs to one workspace."""

    reason, status = "MISSING_WORKSPACE", 400
    default_message = "connect to /mcp?workspaceId=…: a session belongs to one workspace"


class HostNotAllowed(RunnerdError):
    """/mcp reached under a Host it does not serve (DNS-rebinding protection)."""

    reason, status = "HOST_NOT_ALLOWED", 403
    default_message = (
        "this daemon does not serve /mcp under that Host: add it to allowed_hosts (or set "
        "public_url)"
    )

    def wire_details(self) -> dict[str, Any]:
        return {"field": "Host"}


class OriginNotAllowed(RunnerdError):
    """/mcp from a browser page of another site (an Origin not allowed)."""

    reason, status = "ORIGIN_NOT_ALLOWED", 403
    default_message = "requests to /mcp from pages of another site are refused"

    def wire_details(self) -> dict[str, Any]:
        return {"field": "Origin"}


class DuplicateSessionId(RunnerdError):
    """An MCP request with more than one Mcp-Session-Id header."""

    reason, status = "DUPLICATE_SESSION_ID", 400
    default_message = "send one Mcp-Session-Id header"

    def __init__(self, header: str) -> None:
        self.header = header  # as the MCP SDK spells it
        super().__init__()

    def wire_details(self) -> dict[str, Any]:
        return {"field": self.header}


class McpStopping(RunnerdError):
    """The daemon is stopping, and /mcp takes no new request."""

    reason, status = "SERVICE_UNAVAILABLE", 503
    default_message = "runnerd is stopping"


class McpSessionsFull(RunnerdError):
    """No room for another MCP session: every session of the workspace is in use (or the
    person opens their cap's worth at once). A person's own cap never refuses: it ends
    their least recently used session (mcp/sessions.py)."""

    reason, status, retry_after_s = "MCP_SESSIONS_FULL", 503, 5

    def __init__(self, scope: str) -> None:
        self.scope = scope  # "workspace" or "person": whose sessions are all in use
        super().__init__(
            f"every MCP session of this {scope} on this node is in use; end one (DELETE "
            "/mcp), or try again when one ends"
        )

    def wire_details(self) -> dict[str, Any]:
        return {"scope": self.scope}


# --- the CLI's client -----------------------------------------------------------------------


class ApiFailure(RunnerdError):
    """The daemon answered with an error envelope, or could not be reached."""

    def __init__(
        self, status: int, code: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        self.status = status
        self.code = code
        self.details = details or {}
        super().__init__(message)
