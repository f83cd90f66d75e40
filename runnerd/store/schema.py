"""The schema, as numbered migrations. Append only: a released migration never changes."""

from __future__ import annotations

from collections.abc import Callable

import sqlite_utils

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


def _m2_people_installs_runs(db: sqlite_utils.Database) -> None:
    db.execute(
        """CREATE TABLE workspaces (
            id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at TEXT NOT NULL)"""
    )
    db.execute(
        """CREATE TABLE users (
            id TEXT PRIMARY KEY, email TEXT NOT NULL UNIQUE COLLATE NOCASE,
            name TEXT, created_at TEXT NOT NULL)"""
    )
    db.execute(
        """CREATE TABLE memberships (
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            user_id TEXT NOT NULL REFERENCES users(id),
            role TEXT NOT NULL CHECK (role IN ('admin', 'builder', 'member', 'viewer')),
            apps_access INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            PRIMARY KEY (workspace_id, user_id))"""
    )
    db.execute(
        """CREATE TABLE api_keys (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL CHECK (kind IN ('personal', 'workspace', 'token')),
            user_id TEXT REFERENCES users(id),
            workspace_id TEXT REFERENCES workspaces(id),
            scopes TEXT NOT NULL DEFAULT '[]',
            name TEXT NOT NULL DEFAULT '',
            key_hash TEXT NOT NULL UNIQUE,
            prefix TEXT NOT NULL,
            created_at TEXT NOT NULL,
            revoked_at TEXT)"""
    )
    db.execute("ALTER TABLE apps ADD COLUMN workspace_id TEXT REFERENCES workspaces(id)")
    db.execute(
        """CREATE TABLE publications (
            version_id TEXT PRIMARY KEY REFERENCES app_versions(id),
            published_by TEXT REFERENCES users(id),
            published_at TEXT NOT NULL)"""
    )
    db.execute(
        """CREATE TABLE installs (
            id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            app_id TEXT NOT NULL REFERENCES apps(id),
            version_id TEXT NOT NULL REFERENCES app_versions(id),
            previous_version_id TEXT REFERENCES app_versions(id),
            created_by TEXT REFERENCES users(id),
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            UNIQUE (workspace_id, app_id))"""
    )
    db.execute(
        """CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            install_id TEXT NOT NULL REFERENCES installs(id),
            app_id TEXT NOT NULL REFERENCES apps(id),
            version_id TEXT NOT NULL REFERENCES app_versions(id),
            tool TEXT NOT NULL,
            user_id TEXT NOT NULL REFERENCES users(id),
            surface TEXT NOT NULL,
            workflow_run_id TEXT,
            status TEXT NOT NULL DEFAULT 'running'
                CHECK (status IN ('running', 'succeeded', 'failed', 'timed_out')),
            duration_ms INTEGER,
            started_at TEXT NOT NULL,
            ended_at TEXT)"""
    )
    db.execute("CREATE INDEX runs_by_install ON runs (install_id, started_at)")


# Append only: a migration, once released, never changes.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _m1_apps_and_versions,
    _m2_people_installs_runs,
]
