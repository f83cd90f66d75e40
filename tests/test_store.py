"""The store on SQLite and on PostgreSQL: migrations from empty, WAL, immutable versions,
version strings."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from conftest import AppDir, upload_version
from pg_cluster import PgCluster
from runnerd.errors import BudgetExhausted, DatabaseUnavailable, VersionExists
from runnerd.ids import new_id
from runnerd.run.toolchain import Toolchain
from runnerd.store import DB_FILENAME, MIGRATIONS, Store
from runnerd.store.db import PostgresDatabase, SQLiteDatabase
from runnerd.upload.walk import read_app_dir


def upload(store: Store, app: AppDir, toolchain: Toolchain) -> str:
    version, _ = upload_version(store, read_app_dir(app.root), toolchain=toolchain)
    return version.version


@pytest.mark.smoke
def test_migrations_build_the_schema_from_an_empty_database(tmp_path: Path) -> None:
    store = Store.in_data_dir(tmp_path)
    assert store.schema_version == len(MIGRATIONS)
    assert {"apps", "app_versions", "tools"} <= set(store.db.table_names())
    store.close()
    again = Store(tmp_path / DB_FILENAME)  # reopening applies nothing twice
    assert again.schema_version == len(MIGRATIONS)
    again.close()


def test_database_is_in_wal_mode_and_private(tmp_path: Path) -> None:
    store = Store.in_data_dir(tmp_path)
    assert isinstance(store.db, SQLiteDatabase)
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.path.stat().st_mode & 0o077 == 0
    store.close()


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
        with pytest.raises((sqlite3.IntegrityError, psycopg.Error), match="immutable"):
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
    ids = [new_id("ver") for _ in range(1000)]  # many share a millisecond
    assert len(set(ids)) == 1000
    assert ids == sorted(ids)  # in the order they were made
    assert all(i.startswith("ver_") and len(i) == 30 for i in ids)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrating_a_version_1_database_keeps_its_data(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target: Path | str = tmp_path / DB_FILENAME
    if backend == "postgresql":
        target = request.getfixturevalue("pg").new_database()
    db = SQLiteDatabase(target) if isinstance(target, Path) else PostgresDatabase(target)
    with db.write():
        MIGRATIONS[0](db)
        db.set_schema_version(1)
        db.execute("INSERT INTO apps VALUES ('app_1', 'old', 'Old', '2026-01-01T00:00:00.000Z')")
    db.close()
    store = Store(target)
    assert store.schema_version == len(MIGRATIONS)
    app = store.get_app("old")
    assert app is not None and (app.name, app.workspace_id) == ("Old", None)
    store.close()


@pytest.mark.smoke
def test_a_run_lifecycle_on_each_backend(
    make_app: Callable[..., AppDir], store: Store, toolchain: Toolchain
) -> None:
    """People, keys, an install, a budget, secrets, runs, the ledger, approvals,
    idempotency, sign-in and the audit chain: the same answers on SQLite and PostgreSQL."""
    ws = store.create_workspace("Acme")
    alice = store.ensure_user("Alice@Example.com")
    assert store.ensure_user("alice@example.com").id == alice.id  # emails are case-blind
    store.set_membership(ws.id, alice.id, role="admin", approver=True)
    key, plaintext = store.create_key(kind="personal", user_id=alice.id)
    assert store.find_key(plaintext) == key
    app = make_app()
    app.tool("t")
    version, _ = upload_version(store, read_app_dir(app.root), toolchain=toolchain)
    assert [v.tool_names for v in store.list_versions(version.app_id)] == [("t",)]
    store.publish(version.id, alice.id, workspace_id=ws.id)
    install = store.create_install(ws.id, version.app_id, version.id, alice.id)
    store.put_secret(install.id, "TOKEN", ("k1", b"\x00nonce", b"\xffsealed"),
                     workspace_id=ws.id, user_id=alice.id)  # fmt: skip
    assert store.sealed_secrets(install.id) == [
        (install.id, "TOKEN", "k1", b"\x00nonce", b"\xffsealed")
    ]
    store.set_budget(install.id, 1000, alice.id, workspace_id=ws.id)

    approval = store.create_approval(
        workspace_id=ws.id, install_id=install.id, version_id=version.id, tool="t",
        input_hash="h", surface="chat", requested_by=alice.id, ttl_s=60,
    )  # fmt: skip
    assert store.pending_approvals() == 1
    decided = store.decide_approval(approval.id, approve=True, user_id=alice.id)
    assert decided is not None and decided.status == "approved"
    assert store.decide_approval(approval.id, approve=False, user_id=alice.id) is None
    assert store.claim_idempotency_key(alice.id, "k", "hash", 3600) is None
    assert store.claim_idempotency_key(alice.id, "k", "hash", 3600) == ("hash", None, None)

    # The run the approval released, claimed by key "k": both learn its id as it starts.
    first = store.start_run(install=install, tool="t", user_id=alice.id, surface="api",
                            timeout_ms=600, approval_id=approval.id,
                            idempotency=(alice.id, "k"))  # fmt: skip
    assert store.claim_idempotency_key(alice.id, "k", "hash", 3600) == ("hash", first, None)
    assert store.get_approval(approval.id).run_id == first  # type: ignore[union-attr]
    assert store.budget(install.id).reserved_ms == 600
    store.finish_run(first, status="succeeded", duration_ms=400)
    store.finish_run(first, status="failed", duration_ms=9)  # a second end changes nothing
    status = store.budget(install.id)
    assert (status.used_ms, status.reserved_ms) == (400, 0)
    second = store.start_run(install=install, tool="t", user_id=alice.id, surface="mcp",
                             timeout_ms=700)  # fmt: skip
    store.finish_run(second, status="timed_out", duration_ms=700)
    with pytest.raises(BudgetExhausted):  # 1100 ms used of 1000
        store.start_run(install=install, tool="t", user_id=alice.id, surface="api")
    runs = store.list_runs(install.id)
    assert [(r.id, r.status) for r in runs] == [(second, "timed_out"), (first, "succeeded")]
    assert sum(row["sandbox_ms"] for row in store.ledger(install_id=install.id)) == 1100
    assert [(day["succeeded"], day["timed_out"], day["sandbox_ms"])
            for day in store.usage_by_day(install.id, 1)] == [(1, 1, 1100)]  # fmt: skip

    # A key whose call was refused before its run started is released for a retry.
    assert store.claim_idempotency_key(alice.id, "k2", "hash", 3600) is None
    store.release_idempotency_key(alice.id, "k2")
    assert store.claim_idempotency_key(alice.id, "k2", "hash", 3600) is None

    token = store.create_login_link(alice.id, ttl_s=60)
    assert store.use_login_link(token) == alice.id
    assert store.use_login_link(token) is None
    session, secret = store.create_session(alice.id, ttl_s=60, via="link")
    assert store.find_session(secret) == session
    assert store.end_session(secret) and store.find_session(secret) is None

    entries, broken = store.verify_audit()
    assert entries >= 8 and broken is None
    assert {"tool.run", "budget.set"} <= {
        entry.action for entry in store.audit_entries(workspace_id=ws.id)
    }
    # Deleting the newest entry leaves no later row to break; the chain still knows.
    store.db.execute("DELETE FROM audit WHERE seq = ?", [entries])
    assert store.verify_audit() == (entries - 1, entries)


def test_store_work_leaves_the_event_loop_only_on_postgresql(store: Store) -> None:
    """``io``: inline on SQLite; on PostgreSQL a worker thread with its own connection,
    and a caller cancelled meanwhile is cancelled only once the work has finished."""

    async def main() -> None:
        ran_on = await store.io(threading.get_ident)
        if store.db.dialect == "sqlite":
            assert ran_on == threading.get_ident()
            return
        assert ran_on != threading.get_ident()
        finished = threading.Event()

        def slow_write() -> None:
            with store.db.write():
                store.db.execute("SELECT pg_sleep(0.3)")
            finished.set()

        task = asyncio.ensure_future(store.io(slow_write))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert finished.is_set()
        # The worker's own connection is clean afterwards: a write transaction works.
        await store.io(store.create_workspace, "After")

    asyncio.run(main())


def _terminate_backend(url: str, db: PostgresDatabase) -> None:
    """End, from outside, the server process behind this thread's connection of ``db``
    (what a restart or a failover does to every connection), and wait until it is gone."""
    pid = db.execute("SELECT pg_backend_pid()").fetchone()
    with psycopg.connect(url, autocommit=True) as admin:
        ended = admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid and pid[0]])
        assert ended.fetchone() == (True,)


def test_a_connection_the_server_hung_up_on_is_made_again_before_its_next_statement(
    pg: PgCluster,
) -> None:
    url = pg.new_database()
    db = PostgresDatabase(url)
    try:
        _terminate_backend(url, db)
        # No statement failed in this process: the hang-up itself is what is noticed.
        assert db.execute("SELECT 1").fetchone() == (1,)
        with db.write():
            db.execute("CREATE TABLE kept (n INTEGER)")
        _terminate_backend(url, db)
        with db.snapshot():
            assert db.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    finally:
        db.close()


def test_a_transaction_keeps_its_connection_when_another_thread_s_breaks(
    pg: PgCluster,
) -> None:
    """Another thread's connection failing makes every connection suspect, but one in
    the middle of a transaction must not be swapped: the rest of the transaction would
    run outside it, and a rollback would keep half of it."""
    url = pg.new_database()
    db = PostgresDatabase(url)
    try:
        db.execute("CREATE TABLE half (n INTEGER)")
        failed: list[BaseException] = []

        def broken_elsewhere() -> None:
            with pytest.raises(DatabaseUnavailable) as caught, db.snapshot():
                _terminate_backend(url, db)  # inside a transaction, unseen until used
                db.execute("SELECT 1")
            failed.append(caught.value)

        with pytest.raises(RuntimeError, match="undone"), db.write():
            db.execute("INSERT INTO half VALUES (1)")
            other = threading.Thread(target=broken_elsewhere)
            other.start()
            other.join()
            assert failed, "the other thread's statement did not fail"
            db.execute("INSERT INTO half VALUES (2)")
            raise RuntimeError("undone")
        assert db.execute("SELECT count(*) FROM half").fetchone() == (0,)
    finally:
        db.close()
