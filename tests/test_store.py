"""The SQLite store: migrations from empty, WAL, immutable versions, version strings."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import AppDir
from runnerd.errors import VersionExists
from runnerd.store import DB_FILENAME, MIGRATIONS, Store, new_id
from runnerd.upload.bundle import read_app_dir
from runnerd.upload.deploy import upload_version
from runnerd.upload.toolchain import Toolchain


def upload(store: Store, app: AppDir, toolchain: Toolchain) -> str:
    version, _ = upload_version(store, read_app_dir(app.root), toolchain=toolchain)
    return version.version


def test_migrations_build_the_schema_from_an_empty_database(tmp_path: Path) -> None:
    store = Store.in_data_dir(tmp_path)
    assert store.schema_version == len(MIGRATIONS)
    assert {"apps", "app_versions", "tools"} <= set(store.db.table_names())
    store.close()
    again = Store(tmp_path / DB_FILENAME)  # reopening applies nothing twice
    assert again.schema_version == len(MIGRATIONS)
    again.close()


def test_database_is_in_wal_mode_and_private(store: Store) -> None:
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.path.stat().st_mode & 0o077 == 0


def test_versions_are_numbered_in_order_when_the_manifest_has_none(
    make_app: Callable[..., AppDir], store: Store, toolchain: Toolchain
) -> None:
    app = make_app()
    app.tool("t")
    assert [upload(store, app, toolchain) for _ in range(3)] == ["1", "2", "3"]


def test_manifest_version_is_used_and_a_repeat_is_refused(
    make_app: Callable[..., AppDir], store: Store, toolchain: Toolchain
) -> None:
    app = make_app("slug: demo\nname: Demo\nversion: '2.0.0'\ntools: ./tools/*\n")
    app.tool("t")
    assert upload(store, app, toolchain) == "2.0.0"
    with pytest.raises(VersionExists, match=r"already has version '2\.0\.0'"):
        upload(store, app, toolchain)
    app_row = store.get_app("demo")
    assert app_row is not None
    assert [v.version for v in store.list_versions(app_row.id)] == ["2.0.0"]


def test_assigned_number_skips_a_string_the_manifest_already_took(
    make_app: Callable[..., AppDir], store: Store, toolchain: Toolchain
) -> None:
    first = make_app("slug: demo\nname: Demo\nversion: '2'\ntools: ./tools/*\n")
    first.tool("t")
    second = make_app()
    second.tool("t")
    assert upload(store, first, toolchain) == "2"
    assert upload(store, second, toolchain) == "3"  # seq 2, but "2" is taken


def test_stored_versions_are_immutable(
    make_app: Callable[..., AppDir], store: Store, toolchain: Toolchain
) -> None:
    app = make_app()
    app.tool("t")
    upload(store, app, toolchain)
    for sql in (
        "UPDATE tools SET source = 'x'",
        "DELETE FROM tools",
        "UPDATE app_versions SET version = '9'",
        "DELETE FROM app_versions",
    ):
        with pytest.raises(sqlite3.IntegrityError, match="immutable"):
            store.db.execute(sql)


def test_version_keeps_every_file_and_the_content_hash(
    make_app: Callable[..., AppDir], store: Store, toolchain: Toolchain
) -> None:
    app = make_app()
    app.tool("t", ".ts")
    version, bundle = upload_version(store, read_app_dir(app.root), toolchain=toolchain)
    stored = store.get_version(version.id)
    assert stored is not None and stored.content_hash == bundle.content_hash
    assert stored.content_hash.startswith("sha256:")
    tool = store.get_tool(version.id, "t")
    assert tool is not None
    assert tool.yaml_text == (app.root / "tools/t.tool.yaml").read_text()
    assert tool.source == (app.root / "tools/t.ts").read_text()
    assert tool.compiled_js is not None
    manifest = store.db.execute("SELECT manifest FROM app_versions").fetchone()[0]
    assert manifest == (app.root / "agentserve.app.yaml").read_text()


def test_ids_are_unique_and_sortable() -> None:
    ids = [new_id("ver") for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(i.startswith("ver_") and len(i) == 30 for i in ids)


def test_migrating_a_version_1_database_keeps_its_data(tmp_path: Path) -> None:
    import sqlite_utils

    path = tmp_path / DB_FILENAME
    db = sqlite_utils.Database(sqlite3.connect(str(path)))
    MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO apps VALUES ('app_1', 'old', 'Old', '2026-01-01T00:00:00.000Z')")
    db.conn.commit()
    db.close()
    store = Store(path)
    assert store.schema_version == len(MIGRATIONS)
    app = store.get_app("old")
    assert app is not None and (app.name, app.workspace_id) == ("Old", None)
    store.close()
