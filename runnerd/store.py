"""The SQLite store: the only module with SQL in it.

One file in the data dir, WAL mode, opened through sqlite-utils. The schema is built by
numbered migrations (``PRAGMA user_version`` holds the last one applied); each runs in
its own transaction, so a database is always at one exact version. Stored app versions
are immutable: triggers refuse any UPDATE or DELETE of a version or its tools.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import sqlite_utils

from runnerd.bundle import Bundle, Tool
from runnerd.errors import VersionExists

__all__ = ["AppRecord", "Store", "ToolRecord", "VersionRecord", "new_id", "utc_now"]

DB_FILENAME = "runnerd.db"
_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def new_id(prefix: str) -> str:
    """A sortable unique id: ``prefix_`` + 48-bit milliseconds + 80 random bits, base32."""
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    chars = []
    for _ in range(26):
        value, rem = divmod(value, 32)
        chars.append(_CROCKFORD[rem])
    return f"{prefix}_{''.join(reversed(chars))}"


def utc_now() -> str:
    """Now as ISO 8601 UTC with milliseconds, such as 2026-11-30T02:46:41.123Z."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AppRecord(msgspec.Struct, frozen=True):
    id: str
    slug: str
    name: str
    created_at: str


class VersionRecord(msgspec.Struct, frozen=True):
    id: str
    app_id: str
    app_slug: str
    version: str
    seq: int
    content_hash: str
    tool_names: tuple[str, ...]
    created_at: str


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


# --- Migrations -----------------------------------------------------------------------------


def _m1_apps_and_versions(db: sqlite_utils.Database) -> None:
    db.execute(
        """CREATE TABLE apps (
            id TEXT PRIMARY KEY,
            slug TEXT NOT NULL UNIQUE,
            name TEXT NOT NULL,
            created_at TEXT NOT NULL
        )"""
    )
    db.execute(
        """CREATE TABLE app_versions (
            id TEXT PRIMARY KEY,
            app_id TEXT NOT NULL REFERENCES apps(id),
            version TEXT NOT NULL,
            seq INTEGER NOT NULL,
            manifest TEXT NOT NULL,
            content_hash TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (app_id, version),
            UNIQUE (app_id, seq)
        )"""
    )
    db.execute(
        """CREATE TABLE tools (
            version_id TEXT NOT NULL REFERENCES app_versions(id),
            name TEXT NOT NULL,
            description TEXT NOT NULL,
            effect TEXT NOT NULL CHECK (effect IN ('read', 'write')),
            timeout_ms INTEGER NOT NULL,
            language TEXT NOT NULL CHECK (language IN ('python', 'javascript', 'typescript')),
            input_schema TEXT NOT NULL,
            output_schema TEXT NOT NULL,
            packages TEXT NOT NULL,
            yaml_path TEXT NOT NULL,
            yaml_text TEXT NOT NULL,
            source_path TEXT NOT NULL,
            source TEXT NOT NULL,
            compiled_js TEXT,
            module_format TEXT,
            PRIMARY KEY (version_id, name)
        )"""
    )
    for table in ("app_versions", "tools"):
        for action in ("UPDATE", "DELETE"):
            db.execute(
                f"""CREATE TRIGGER {table}_immutable_{action.lower()}
                BEFORE {action} ON {table}
                BEGIN SELECT RAISE(ABORT, 'stored app versions are immutable'); END"""
            )


# Append only: a migration, once released, never changes.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_m1_apps_and_versions]


class Store:
    """The database of one runnerd install. Not shared between threads without a lock."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), check_same_thread=False, timeout=10)
        self.path = path
        self.db = sqlite_utils.Database(conn)
        self.db.execute("PRAGMA foreign_keys = ON")
        self.db.enable_wal()
        with contextlib.suppress(OSError):
            os.chmod(path, 0o600)
        self.migrate()

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> Store:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return cls(data_dir / DB_FILENAME)

    def close(self) -> None:
        self.db.close()

    @property
    def schema_version(self) -> int:
        row = self.db.execute("PRAGMA user_version").fetchone()
        return int(row[0])

    def migrate(self) -> None:
        """Apply every migration not yet applied, each in its own transaction."""
        while (current := self.schema_version) < len(MIGRATIONS):
            with self._write():
                MIGRATIONS[current](self.db)
                self.db.execute(f"PRAGMA user_version = {current + 1}")

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """A write transaction that takes the write lock up front (BEGIN IMMEDIATE), so
        read-then-write sequences cannot interleave with another writer."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.conn.rollback()
            raise
        else:
            self.db.execute("COMMIT")

    # --- Apps and versions ------------------------------------------------------------------

    def add_version(self, bundle: Bundle) -> VersionRecord:
        """Store ``bundle`` as a new immutable version of its app (created on first upload).

        The version string is the manifest's, else the next number in order. Raises
        VersionExists when the app already has that version string; then nothing changes.
        """
        manifest = bundle.manifest
        now = utc_now()
        with self._write():
            app = self._app_row(manifest.slug)
            if app is None:
                app = {
                    "id": new_id("app"),
                    "slug": manifest.slug,
                    "name": manifest.name,
                    "created_at": now,
                }
                self.db.table("apps").insert(app)
            elif app["name"] != manifest.name:
                self.db.execute("UPDATE apps SET name = ? WHERE id = ?", [manifest.name, app["id"]])
            seq = self._next_seq(app["id"])
            version = manifest.version or self._free_version_string(app["id"], seq)
            if self._version_taken(app["id"], version):
                raise VersionExists(manifest.slug, version)
            version_id = new_id("ver")
            self.db.table("app_versions").insert(
                {
                    "id": version_id,
                    "app_id": app["id"],
                    "version": version,
                    "seq": seq,
                    "manifest": manifest.text,
                    "content_hash": bundle.content_hash,
                    "created_at": now,
                }
            )
            self.db.table("tools").insert_all(_tool_row(version_id, t) for t in bundle.tools)
        return VersionRecord(
            id=version_id,
            app_id=app["id"],
            app_slug=manifest.slug,
            version=version,
            seq=seq,
            content_hash=bundle.content_hash,
            tool_names=tuple(t.name for t in bundle.tools),
            created_at=now,
        )

    def _app_row(self, slug: str) -> dict[str, Any] | None:
        rows = list(self.db.query("SELECT * FROM apps WHERE slug = ?", [slug]))
        return rows[0] if rows else None

    def _next_seq(self, app_id: str) -> int:
        row = self.db.execute(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM app_versions WHERE app_id = ?", [app_id]
        ).fetchone()
        return int(row[0])

    def _version_taken(self, app_id: str, version: str) -> bool:
        row = self.db.execute(
            "SELECT 1 FROM app_versions WHERE app_id = ? AND version = ?", [app_id, version]
        ).fetchone()
        return row is not None

    def _free_version_string(self, app_id: str, seq: int) -> str:
        """The sequence number as a string, or the next free number after it."""
        candidate = seq
        while self._version_taken(app_id, str(candidate)):
            candidate += 1
        return str(candidate)

    def get_app(self, slug: str) -> AppRecord | None:
        row = self._app_row(slug)
        return AppRecord(**row) if row else None

    def list_versions(self, app_id: str) -> list[VersionRecord]:
        rows = self.db.query(
            """SELECT v.*, a.slug AS app_slug,
                      (SELECT json_group_array(name) FROM
                         (SELECT name FROM tools WHERE version_id = v.id ORDER BY name))
                      AS tool_names
               FROM app_versions v JOIN apps a ON a.id = v.app_id
               WHERE v.app_id = ? ORDER BY v.seq""",
            [app_id],
        )
        return [_version_record(r) for r in rows]

    def get_version(self, version_id: str) -> VersionRecord | None:
        rows = list(
            self.db.query(
                """SELECT v.*, a.slug AS app_slug,
                      (SELECT json_group_array(name) FROM
                         (SELECT name FROM tools WHERE version_id = v.id ORDER BY name))
                      AS tool_names
               FROM app_versions v JOIN apps a ON a.id = v.app_id WHERE v.id = ?""",
                [version_id],
            )
        )
        return _version_record(rows[0]) if rows else None

    def get_tools(self, version_id: str) -> list[ToolRecord]:
        rows = self.db.query("SELECT * FROM tools WHERE version_id = ? ORDER BY name", [version_id])
        return [_tool_record(r) for r in rows]

    def tools_with_packages(self) -> list[tuple[VersionRecord, ToolRecord]]:
        """Every stored tool that lists packages, with its version (for env bookkeeping)."""
        rows = self.db.query("SELECT * FROM tools WHERE packages != '[]' ORDER BY version_id")
        found = []
        for row in rows:
            version = self.get_version(row["version_id"])
            assert version is not None
            found.append((version, _tool_record(row)))
        return found

    def get_tool(self, version_id: str, name: str) -> ToolRecord | None:
        rows = list(
            self.db.query(
                "SELECT * FROM tools WHERE version_id = ? AND name = ?", [version_id, name]
            )
        )
        return _tool_record(rows[0]) if rows else None


def _tool_row(version_id: str, tool: Tool) -> dict[str, Any]:
    return {
        "version_id": version_id,
        "name": tool.name,
        "description": tool.description,
        "effect": tool.effect,
        "timeout_ms": tool.timeout_ms,
        "language": tool.language,
        "input_schema": json.dumps(tool.input_schema),
        "output_schema": json.dumps(tool.output_schema),
        "packages": json.dumps(list(tool.packages)),
        "yaml_path": tool.yaml_path,
        "yaml_text": tool.yaml_text,
        "source_path": tool.source_path,
        "source": tool.source,
        "compiled_js": tool.compiled_js,
        "module_format": tool.module_format,
    }


def _tool_record(row: dict[str, Any]) -> ToolRecord:
    return ToolRecord(
        **{
            **row,
            "input_schema": json.loads(row["input_schema"]),
            "output_schema": json.loads(row["output_schema"]),
            "packages": tuple(json.loads(row["packages"])),
        }
    )


def _version_record(row: dict[str, Any]) -> VersionRecord:
    return VersionRecord(
        id=row["id"],
        app_id=row["app_id"],
        app_slug=row["app_slug"],
        version=row["version"],
        seq=row["seq"],
        content_hash=row["content_hash"],
        tool_names=tuple(json.loads(row["tool_names"])),
        created_at=row["created_at"],
    )
