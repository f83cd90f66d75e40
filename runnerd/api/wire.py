"""Wire types: every request and response body of the HTTP API, as msgspec Structs.

Field names are camelCase on the wire (seed 003). These types are also what
``schemas/openapi.json`` is generated from.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "AppInfo",
    "AppList",
    "DeployBody",
    "DeployResult",
    "ErrorEnvelope",
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

Surface = Literal["app", "chat", "relay", "workflow", "api", "cli", "test"]


class _Wire(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    pass


class ToolInfo(_Wire):
    """One tool, at the version its install runs (seed 003, List App Tools)."""

    reference: str  # app-slug/tool_name
    name: str
    description: str
    effect: Literal["read", "write"]
    language: Literal["python", "javascript", "typescript"]
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
    workflow_run_id: str | None = None


class RunResponse(_Wire, omit_defaults=False):
    run_id: str
    status: Literal["succeeded", "failed", "timed_out"]
    output: Any
    error: str | None
    duration_ms: int


class DeployBody(_Wire):
    """An app bundle: every file the manifest's globs name, path -> base64 content."""

    files: dict[str, str]


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


class DeployResult(_Wire):
    version: VersionInfo
    warnings: list[Problem]


class AppInfo(_Wire):
    app_id: str
    app_slug: str
    name: str
    workspace_id: str | None
    versions: list[VersionInfo]


class AppList(_Wire):
    data: list[AppInfo]


class InstallBody(_Wire):
    app_slug: str
    version: str


class SwitchBody(_Wire):
    version: str


class InstallInfo(_Wire):
    install_id: str
    workspace_id: str
    app_id: str
    app_slug: str
    version_id: str
    version: str
    previous_version_id: str | None
    created_at: str
    updated_at: str


class InstallList(_Wire):
    data: list[InstallInfo]


class ErrorBody(_Wire, omit_defaults=True):
    code: str
    message: str
    details: dict[str, Any] | None = None


class ErrorEnvelope(_Wire):
    error: ErrorBody


class Health(_Wire):
    status: str
    checks: dict[str, str] | None = None
