"""The shapes every layer shares: a checked app and its tools, a problem with an upload, and
the fixed vocabularies (effect, language, run status, surface, role) as ``Literal`` types.

A leaf: it imports nothing from runnerd, so the store, the upload checks, the machine and
the surfaces name one type for one thing without importing each other. The Structs are
the ones that were already stored and sent; their fields, and so everything serialised
from them, are as before.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "ApprovalStatus",
    "Bundle",
    "Effect",
    "Language",
    "Manifest",
    "ModuleFormat",
    "Page",
    "Problem",
    "Role",
    "RunEnd",
    "RunStatus",
    "Surface",
    "Tool",
]

# What a tool does to the world: a write may need an approval before it runs.
Effect = Literal["read", "write"]
# The language of a tool's one source file (limits.SOURCE_LANGUAGES maps the extensions).
Language = Literal["python", "javascript", "typescript"]
# How a JavaScript or TypeScript tool's code is loaded in the jail.
ModuleFormat = Literal["esm", "cjs"]
# How a run ended; a run's row says "running" until then.
RunEnd = Literal["succeeded", "failed", "timed_out"]
RunStatus = Literal["running", "succeeded", "failed", "timed_out"]
# Where a call came from, as a run and an approval record it; chat and relay calls of a
# write tool wait for an approval.
Surface = Literal["app", "chat", "relay", "workflow", "api", "cli", "test"]
ApprovalStatus = Literal["pending", "approved", "denied", "expired"]
# A member's role in a workspace (roles.ROLES orders them).
Role = Literal["admin", "builder", "member", "viewer"]


class Problem(msgspec.Struct, frozen=True, omit_defaults=True):
    """One thing wrong with an upload: the file (relative to the app), the line, the message."""

    file: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.message}"


class Manifest(msgspec.Struct, frozen=True):
    """An app's checked ``agentserve.app.yaml``."""

    slug: str
    name: str
    version: str | None
    tools: tuple[str, ...]  # the globs
    text: str  # the manifest file as uploaded
    egress: tuple[str, ...] = ()  # the destinations asked for, in normal form
    pages: str | None = None  # the pages folder, relative to the manifest ("dist"), if any
    entry: str | None = None  # the page a frame opens (in the pages folder), if pages


class Tool(msgspec.Struct, frozen=True):
    """One checked tool, everything a run needs and nothing of the rest of the app. A
    stored tool (store.ToolRecord) is this and the version it belongs to."""

    name: str
    description: str
    effect: Effect
    timeout_ms: int
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    packages: tuple[str, ...]  # normalized exact pins, sorted
    language: Language
    yaml_path: str
    yaml_text: str
    source_path: str
    source: str
    compiled_js: str | None  # what the jail runs when not the source (runnerd/upload/code.py)
    module_format: ModuleFormat | None  # for JavaScript and TypeScript, None for Python


class Page(msgspec.Struct, frozen=True):
    """One file of an app's pages: its path in the pages folder, content, type, digest."""

    path: str
    content: bytes
    content_type: str
    sha256: str  # hex


class Bundle(msgspec.Struct, frozen=True):
    """A checked upload: what a deploy stores as one immutable version."""

    manifest: Manifest
    tools: tuple[Tool, ...]  # sorted by name
    warnings: tuple[Problem, ...]
    content_hash: str  # sha256 of the manifest and every tool file, source and build
    pages: tuple[Page, ...] = ()  # sorted by path; its pages' digests are in content_hash
