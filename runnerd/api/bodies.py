"""Wire types: every request and response body of the HTTP API, as msgspec Structs.

Field names are camelCase on the wire, as List App Tools answers them. These types are also what
``schemas/openapi.json`` is generated from.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec

from runnerd.govern.people import EMAIL_PATTERN
from runnerd.limits import (
    MAX_EGRESS_ENTRIES,
    MAX_EGRESS_ENTRY_CHARS,
    MAX_EMAIL_CHARS,
    MAX_SLUG_CHARS,
    MAX_VERSION_CHARS,
)
from runnerd.model import ApprovalStatus, Effect, Language, Role, RunEnd, RunStatus, Surface
from runnerd.store import AuditEntry, BudgetStatus, InstallRecord

T = TypeVar("T")

__all__ = [
    "AppInfo",
    "AppList",
    "DeployBody",
    "DeployResult",
    "ErrorEnvelope",
    "FrameInfo",
    "GitDeployBody",
    "GitDeployInfo",
    "GitDeployList",
    "GitPushEvent",
    "GitPushResult",
    "Health",
    "InstallBody",
    "InstallInfo",
    "InstallList",
    "RunBody",
    "RunResponse",
    "SwitchBody",
    "ToolInfo",
    "ToolList",
    "VersionInfo",
]


class _Wire(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    pass


def _wire_of(
    record: type[msgspec.Struct], name: str, *, renamed: dict[str, str] | None = None
) -> type[msgspec.Struct]:
    """The wire type of a store record: the same fields, types and defaults, defined once
    (by the record), camelCase on the wire, some fields under another name."""
    fields = [
        (
            (renamed or {}).get(f.name, f.name),
            f.type,
            msgspec.field(default_factory=f.default_factory)
            if f.default_factory is not msgspec.NODEFAULT
            else f.default,
        )
        for f in msgspec.structs.fields(record)
    ]
    return msgspec.defstruct(
        name, fields, bases=(_Wire,), module=__name__, rename="camel", forbid_unknown_fields=True
    )


def wire_view(kind: type[T], record: msgspec.Struct, **renamed: str) -> T:
    """``record`` as the wire type ``kind``: the fields ``kind`` has (a wire type may show
    less than the store holds, such as no input hash), ``renamed`` from record field to
    wire field. Values are not checked again: they come from the store."""
    values = msgspec.structs.asdict(record)
    for old, new in renamed.items():
        values[new] = values.pop(old)
    fields: tuple[str, ...] = kind.__struct_fields__  # type: ignore[attr-defined]
    return kind(**{name: values[name] for name in fields if name in values})


class ToolInfo(_Wire):
    """One tool, at the version its install runs (seed 003, List App Tools)."""

    reference: str  # app-slug/tool_name
    name: str
    description: str
    effect: Effect
    language: Language
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    timeout_ms: int
    app_id: str
    app_slug: str
    install_id: str
    version_id: str
    version: str


class ToolList(_Wire):
    data: list[ToolInfo]
    next_cursor: str | None = None  # the complete set is one page: always null


class RunBody(_Wire):
    input: dict[str, Any]
    surface: Surface = "api"
    workflow_run_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None


class RunResponse(_Wire, omit_defaults=False):
    run_id: str
    status: RunEnd
    output: Any
    error: str | None
    duration_ms: int


class RunResponseWithoutOutput(RunResponse):
    """The answer of a replay whose output no node holds any more: the run's five fields
    and why its output is not here (OUTPUT_EXPIRED, OUTPUT_NODE_STOPPED,
    OUTPUT_NODE_UNREACHABLE, RUN_INTERRUPTED; docs/API.md). Every other run answers
    exactly the five."""

    output_available: bool
    output_missing: str


_Commit = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{40}([0-9a-f]{24})?$")]
_Ref = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class DeployBody(_Wire):
    """An app bundle: every file the manifest's globs name, path -> base64 content; a Git
    deploy (``runnerd app deploy --git``) also names the commit it read and its ref."""

    files: dict[str, str]
    commit: _Commit | None = None
    ref: _Ref | None = None


class Problem(_Wire, omit_defaults=True):
    file: str
    message: str
    line: int | None = None


class VersionInfo(_Wire):
    app_id: str
    app_slug: str
    version_id: str
    version: str
    content_hash: str
    created_at: str
    tools: list[str]
    published_at: str | None = None
    egress: list[str] = []  # the destinations this version asks to reach
    commit: str | None = None  # a Git deploy's commit (null for a folder's)
    ref: str | None = None  # its full ref name (null for a commit named by its id)


class DeployResult(_Wire):
    version: VersionInfo
    warnings: list[Problem]
    pages: int = 0  # the version's page files (the manifest's pages folder)


class FrameInfo(_Wire):
    """Where the Manage page opens an install's pages (api/frames.py)."""

    url: str  # <apps_url>/f/<token>/<entry>
    origin: str  # the apps origin: the frame's messages come from it
    token: str  # the frame token: the X-Runnerd-Frame header of the frame's calls
    expires_at: str


class AppInfo(_Wire):
    app_id: str
    app_slug: str
    name: str
    workspace_id: str | None
    versions: list[VersionInfo]


class AppList(_Wire):
    data: list[AppInfo]


_Version = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_VERSION_CHARS)]


class InstallBody(_Wire):
    app_slug: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SLUG_CHARS)]
    version: _Version


_Destination = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_EGRESS_ENTRY_CHARS)]


class EgressBody(_Wire):
    egress: Annotated[list[_Destination], msgspec.Meta(max_length=MAX_EGRESS_ENTRIES)]


class EgressGrant(_Wire):
    """What an install may reach: its version asks, the install grants (as much or less)."""

    install_id: str
    requested: list[str]
    granted: list[str]


class SwitchBody(_Wire):
    version: _Version


# An install as the API shows it: the store's record, camelCase, id as installId.
InstallInfo = _wire_of(InstallRecord, "InstallInfo", renamed={"id": "install_id"})


class InstallList(_Wire):
    data: list[InstallInfo]  # type: ignore[valid-type]  # a type made by _wire_of


class ErrorBody(_Wire, omit_defaults=True):
    code: str
    message: str
    details: dict[str, Any] | None = None


class ErrorEnvelope(_Wire):
    error: ErrorBody


class Health(_Wire):
    status: str
    checks: dict[str, str] | None = None


class PendingApproval(_Wire):
    status: Literal["pending_approval"]
    approval_id: str
    expires_at: str


class SecretBody(_Wire):
    value: str


class SecretInfo(_Wire):
    name: str
    updated_at: str


class SecretList(_Wire):
    data: list[SecretInfo]


class Deleted(_Wire):
    name: str
    deleted: bool


class BudgetBody(_Wire):
    # Milliseconds of sandbox time a month, up to 2^53 (JSON-safe); null: unlimited.
    monthly_ms: Annotated[int, msgspec.Meta(ge=0, le=2**53)] | None


# An install's budget this month as the API shows it: the store's status, camelCase.
BudgetInfo = _wire_of(BudgetStatus, "BudgetInfo")


class LedgerRow(_Wire):
    id: str
    kind: str
    run_id: str | None
    sandbox_ms: int
    payer_kind: Literal["workspace", "workflow_run"]
    payer_id: str
    workspace_id: str
    app_id: str
    install_id: str
    version_id: str
    tool: str
    user_id: str
    month: str
    created_at: str


class LedgerList(_Wire):
    data: list[LedgerRow]


# One audit entry as the API shows it: the store's entry, camelCase.
AuditInfo = _wire_of(AuditEntry, "AuditInfo")


class AuditList(_Wire):
    data: list[AuditInfo]  # type: ignore[valid-type]  # a type made by _wire_of
    next_cursor: str | None = None


class ApprovalInfo(_Wire):
    approval_id: str
    workspace_id: str
    install_id: str
    version_id: str
    tool: str
    surface: str
    requested_by: str
    status: ApprovalStatus
    created_at: str
    expires_at: str
    decided_by: str | None
    decided_at: str | None
    run_id: str | None
    # In lists: the app and version the call was made to, and whether the caller may
    # approve or deny it (from chat the person who asked; from a relay an approver).
    app_slug: str | None = None
    version: str | None = None
    may_decide: bool | None = None
    # Only to the people who may decide it, while it is pending: the asker's email, the
    # held input (opened from its sealed copy; never in the audit or a log) and the
    # tool's input schema at the version it was held for (to render the input with).
    requested_by_email: str | msgspec.UnsetType = msgspec.UNSET
    input: Any | msgspec.UnsetType = msgspec.UNSET
    input_schema: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class ApprovalList(_Wire):
    data: list[ApprovalInfo]


class ApprovalRuleBody(_Wire):
    """Who approves an app's write calls from a relay: these roles, and these people
    (user ids of the workspace's members); at least one of the two."""

    roles: Annotated[list[Literal["admin", "builder", "member"]], msgspec.Meta(max_length=3)] = []
    user_ids: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=64)]],
        msgspec.Meta(max_length=200),
    ] = []


class ApprovalRuleInfo(_Wire):
    app_slug: str
    roles: list[Role]
    user_ids: list[str]
    updated_at: str
    updated_by: str | None


class ApprovalRuleList(_Wire):
    data: list[ApprovalRuleInfo]


class WebhookBody(_Wire):
    """The workspace's webhook: an http(s) URL; ``newSecret`` makes a new signing secret
    (a new webhook always gets one)."""

    url: Annotated[str, msgspec.Meta(min_length=8, max_length=2048)]
    new_secret: bool = False


class WebhookInfo(_Wire):
    url: str
    created_at: str
    updated_at: str
    # The signing secret, in the answer that made it only; never again.
    secret: str | msgspec.UnsetType = msgspec.UNSET


class WebhookDeleted(_Wire):
    deleted: bool


class GitDeployBody(_Wire):
    """An app's Git deploy: the repository its push webhook fetches (http(s):// or
    git://), the refs it deploys (``refs/heads/main``; ``*`` within a segment; a name
    without ``refs/`` is a branch) and the app's folder in it; ``newSecret`` makes a new
    signing secret (a new Git deploy always gets one)."""

    repository: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
    ref: _Ref = "refs/heads/main"
    path: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    new_secret: bool = False


class GitDeployInfo(_Wire):
    app_slug: str
    repository: str
    ref: str
    path: str
    webhook_url: str  # where the Git server posts its push events
    created_at: str
    updated_at: str
    # The signing secret, in the answer that made it only; never again.
    secret: str | msgspec.UnsetType = msgspec.UNSET


class GitDeployList(_Wire):
    data: list[GitDeployInfo]


class GitPushEvent(msgspec.Struct):
    """A Git server's push event (GitHub, Gitea, Forgejo alike): the ref pushed and the
    commit it now names; every other field (``repository.clone_url`` among them) is
    accepted and not used: the repository fetched is the configured one."""

    ref: str
    after: str


class GitPushResult(_Wire, omit_defaults=True):
    """What a push webhook did: ``deployed`` and the version, or why it deployed nothing
    (``ignored``: a ref the Git deploy does not follow, a branch deleted, a ping)."""

    deployed: bool
    version: VersionInfo | None = None
    warnings: list[Problem] = []
    ignored: str | None = None


class EgressUse(_Wire, omit_defaults=True):
    """One destination a run reached (or was refused) through the egress proxy: counts
    only, never a payload, a path or a header."""

    destination: str  # host:port
    connections: int
    bytes_sent: int
    bytes_received: int
    # Why the proxy refused it, for a destination never reached (run/proxy.py _REASONS).
    refused: (
        Literal[
            "not granted", "private address", "cap reached", "bad request", "no credential",
            "no such host", "lookups busy", "cannot connect", "authority mismatch",
            "grant unknown",
        ]
        | None
    ) = None  # fmt: skip


class RunInfo(_Wire):
    run_id: str
    install_id: str
    tool: str
    version_id: str
    version: str | None
    status: RunStatus
    duration_ms: int | None
    surface: str
    user_id: str
    user_email: str | None
    started_at: str
    ended_at: str | None
    error_kind: str | None = None
    workflow_run_id: str | None = None
    approval_id: str | None = None
    egress: list[EgressUse] | None = None  # for a run whose install has an egress grant


class RunDetail(_Wire):
    """One run, with its output while runnerd still holds it in memory (never on disk),
    on whichever node ran it. ``output_missing``: why a finished run's output is not
    here, for those who may see it (as RunResponse's)."""

    run: RunInfo
    output: Any = None
    error: str | None = None
    output_available: bool = False
    output_missing: str | None = None


class RunList(_Wire):
    data: list[RunInfo]
    next_cursor: str | None = None


class LatestRuns(_Wire):
    data: dict[str, list[RunInfo]]


# --- the Manage page: sessions, people, keys ------------------------------------------------


class SignInBody(_Wire):
    api_key: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    login_token: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None


class WorkspaceRole(_Wire):
    workspace_id: str
    name: str
    role: Role
    apps_access: bool
    approver: bool


class SessionInfo(_Wire, omit_defaults=False):
    """The signed-in person, the workspaces they belong to, and the session's CSRF token
    (null when the caller used an API key)."""

    user_id: str
    email: str
    csrf_token: str | None
    expires_at: str | None
    workspaces: list[WorkspaceRole]


class SignedOut(_Wire):
    signed_out: bool


class MemberBody(_Wire):
    email: Annotated[
        str, msgspec.Meta(min_length=3, max_length=MAX_EMAIL_CHARS, pattern=EMAIL_PATTERN)
    ]
    role: Role = "member"
    apps_access: bool = True
    approver: bool = False


class MemberInfo(_Wire):
    user_id: str
    email: str
    role: Role
    apps_access: bool
    approver: bool


class MemberList(_Wire):
    data: list[MemberInfo]


class KeyInfo(_Wire):
    key_id: str
    kind: Literal["personal", "workspace", "token"]
    name: str
    prefix: str  # the first characters, to tell keys apart; never the key
    created_at: str
    user_id: str | None = None
    email: str | None = None
    scopes: list[str] = []
    surface: str | None = None  # a token's bound surface (relay, workflow, chat)


class KeyList(_Wire):
    data: list[KeyInfo]


class NewKeyBody(_Wire):
    kind: Literal["personal", "workspace", "token"]
    name: Annotated[str, msgspec.Meta(max_length=128)] = ""
    email: Annotated[str, msgspec.Meta(min_length=3, max_length=MAX_EMAIL_CHARS)] | None = None
    scopes: list[Literal["api:read", "tools:run", "apps:write"]] = []
    # A token only: the surface its runs are recorded as (a relay's, a workflow's, a chat
    # client's), whatever a run's body says (docs/GOVERNANCE.md).
    surface: Literal["relay", "workflow", "chat"] | None = None


class NewKey(_Wire):
    """A new key: ``apiKey`` is its plaintext, shown in this answer only."""

    key: KeyInfo
    api_key: str


class Revoked(_Wire):
    key_id: str
    revoked: bool


class AuditVerdict(_Wire, omit_defaults=False):
    ok: bool
    entries: int
    first_break: int | None  # the seq of the first entry whose chain breaks
    problem: str | None = None  # why it breaks
    # The newest entry: a checkpoint to keep outside runnerd (`audit verify --checkpoint`).
    head_seq: int | None = None
    head_hash: str | None = None


class UsageDay(_Wire):
    day: str  # YYYY-MM-DD (UTC)
    succeeded: int
    failed: int
    timed_out: int
    running: int
    sandbox_ms: int


class UsageList(_Wire):
    data: list[UsageDay]


class ToolDetail(_Wire):
    """A tool of an install's version, with what List App Tools does not show."""

    tool: ToolInfo
    packages: list[str]
    egress: list[str]  # what the install may reach (its grant)


class InputVerdict(_Wire):
    valid: bool
