"""Rows as typed records, and how the store keeps API keys."""

from __future__ import annotations

import hashlib

import msgspec

from runnerd.model import Role, Tool

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
]


def hash_key(plaintext: str) -> str:
    """How API keys are stored: SHA-256 of a 160-bit random key (a slow hash adds nothing)."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


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
    commit: str | None = None  # a Git deploy's commit (None for a folder's)
    ref: str | None = None  # and its full ref name (None for a commit named by its id)


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
    role: Role
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
    # The surface a token is bound to (relay, workflow, chat): its runs are recorded as
    # that surface (api/surfaces.py). None for every other key.
    surface: str | None = None

    @property
    def is_oauth(self) -> bool:
        """An OAuth access token (runnerd/oauth): a chat client's, consented to."""
        return self.kind == "token" and self.prefix.startswith("rk_o_")

    @property
    def rate_bucket(self) -> str:
        """The rate-limit bucket a call with this key spends from: its own, but all the
        OAuth access tokens of a person share one (each consent mints a token: minting
        more must not multiply the person's limit)."""
        if self.is_oauth and self.user_id is not None:
            return f"oauth:{self.user_id}"
        return self.id


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
    page_entry: str | None = None  # the page its version's frame opens; None: no pages


class ToolRecord(Tool, frozen=True):
    """A stored tool: the checked Tool and the version it belongs to."""

    version_id: str
