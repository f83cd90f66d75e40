"""Rows as typed records, and the small helpers every store module uses."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from datetime import UTC, datetime
from typing import Any

import msgspec

__all__ = [
    "AppRecord",
    "InstallRecord",
    "KeyRecord",
    "MembershipRecord",
    "ToolRecord",
    "UserRecord",
    "VersionRecord",
    "WorkspaceRecord",
    "hash_key",
    "new_id",
    "stamp",
    "utc_now",
]

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


_last_id = 0
_id_lock = threading.Lock()


def new_id(prefix: str) -> str:
    """A sortable unique id: ``prefix_`` + 48-bit milliseconds + 80 random bits, base32.

    Ids made by one process only grow: within a millisecond (or if the clock steps
    back) the next id is the last one plus one, so runs listed by id keep the order
    in which they started."""
    global _last_id
    with _id_lock:
        value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
        if value <= _last_id:
            value = _last_id + 1
        _last_id = value
    chars = []
    for _ in range(26):
        value, rem = divmod(value, 32)
        chars.append(_CROCKFORD[rem])
    return f"{prefix}_{''.join(reversed(chars))}"


def hash_key(plaintext: str) -> str:
    """How API keys are stored: SHA-256 of a 160-bit random key (a slow hash adds nothing)."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


def utc_now() -> str:
    """Now as ISO 8601 UTC with milliseconds, such as 2026-11-30T02:46:41.123Z."""
    return stamp(datetime.now(UTC))


def stamp(when: datetime) -> str:
    """``when`` (UTC) as the store writes times: ISO 8601 with milliseconds and a Z."""
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AppRecord(msgspec.Struct, frozen=True):
    id: str
    slug: str
    name: str
    created_at: str
    workspace_id: str | None = None  # the workspace that deployed it


class VersionRecord(msgspec.Struct, frozen=True):
    id: str
    app_id: str
    app_slug: str
    version: str
    seq: int
    content_hash: str
    tool_names: tuple[str, ...]
    created_at: str
    egress: tuple[str, ...] = ()  # the destinations this version asks to reach


class WorkspaceRecord(msgspec.Struct, frozen=True):
    id: str
    name: str
    created_at: str


class UserRecord(msgspec.Struct, frozen=True):
    id: str
    email: str
    name: str | None
    created_at: str


class MembershipRecord(msgspec.Struct, frozen=True):
    workspace_id: str
    user_id: str
    role: str  # admin | builder | member | viewer
    apps_access: bool
    approver: bool = False  # may approve write calls from relays


class KeyRecord(msgspec.Struct, frozen=True):
    id: str
    kind: str  # personal | workspace | token
    user_id: str | None
    workspace_id: str | None
    scopes: tuple[str, ...]
    name: str
    prefix: str
    created_at: str


class InstallRecord(msgspec.Struct, frozen=True):
    id: str
    workspace_id: str
    app_id: str
    app_slug: str
    version_id: str
    version: str
    previous_version_id: str | None
    created_at: str
    updated_at: str
    egress: tuple[str, ...] = ()  # the destinations granted: the version's, or fewer


class ToolRecord(msgspec.Struct, frozen=True):
    version_id: str
    name: str
    description: str
    effect: str
    timeout_ms: int
    language: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    packages: tuple[str, ...]
    source_path: str
    source: str
    compiled_js: str | None
    module_format: str | None
    yaml_path: str
    yaml_text: str
