"""The audit trail as one hash chain per workspace (and one for the host's own entries),
each appended under its own keyed lock: on real SQLite files and real PostgreSQL
databases, every chain verifies, an edit or a deletion in one chain is found at its seq,
a trail written before the chains keeps verifying, a lock held on one workspace's chain
does not hold another's, and a reader paging one workspace's trail by cursor while it
is written sees every entry once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from inproc import InProcess
from pg_cluster import PgCluster
from runnerd.store import MIGRATIONS, Store
from runnerd.store.audit import _FIELDS, GENESIS, HOST_CHAIN, _digest
from runnerd.store.copy import copy_store
from runnerd.store.db import Database, lock_id, open_database

KEY = b"a" * 32
# The schema just before the audit trail had chains.
BEFORE_CHAINS = next(
    n for n, migration in enumerate(MIGRATIONS) if migration.__name__ == "_m15_audit_chains"
)


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store lives: a SQLite file's URL, or a fresh PostgreSQL database's."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'runnerd.db'}"
    pg: PgCluster = request.getfixturevalue("pg")
    return pg.new_database()


@pytest.fixture
def store(target: str) -> Iterator[Store]:
    opened = Store(target, audit_key=KEY)
    yield opened
    opened.close()


def _trail(store: Store) -> tuple[str, str]:
    """Two workspaces whose entries interleave, and host entries among them."""
    a, b = store.create_workspace("A").id, store.create_workspace("B").id
    for n in range(4):
        store.audit("test.a", workspace_id=a, detail={"n": n})
        store.audit("test.b", workspace_id=b, detail={"n": n})
        store.audit("test.host", detail={"n": n})
    return a, b


def _rows(store: Store, chain: str | None = None) -> list[dict[str, object]]:
    where, args = ("WHERE chain = ?", [chain]) if chain else ("", [])
    return list(store.db.query(f"SELECT * FROM audit {where} ORDER BY seq", args))


def test_every_chain_verifies_each_counted_from_one(store: Store) -> None:
    a, b = _trail(store)
    for chain in (a, b, HOST_CHAIN):
        rows = _rows(store, chain)
        assert [r["chain_seq"] for r in rows] == list(range(1, len(rows) + 1))
        assert rows[0]["prev_hash"] == GENESIS  # a chain starts from GENESIS
        assert [r["prev_hash"] for r in rows[1:]] == [r["hash"] for r in rows[:-1]]
    assert {r["chain"] for r in _rows(store, a)} == {a}
    every = _rows(store)
    found = store.audit_verdict()
    assert (found.entries, found.first_break) == (len(every), None)
    assert (found.head_seq, found.head_hash) == (every[-1]["seq"], every[-1]["hash"])
    # A workspace's verdict is its own chain: its count, its newest entry.
    mine = store.audit_verdict(workspace_id=a)
    ours = _rows(store, a)
    assert (mine.entries, mine.first_break) == (len(ours), None)
    assert (mine.head_seq, mine.head_hash) == (ours[-1]["seq"], ours[-1]["hash"])
    # The API's page of a workspace is what its chain holds, in seq order.
    assert [e.seq for e in store.audit_entries(workspace_id=a)] == [r["seq"] for r in ours]


def test_an_edited_entry_in_one_chain_is_found_at_its_seq(store: Store) -> None:
    a, b = _trail(store)
    edited = _rows(store, b)[2]["seq"]
    store.db.execute("UPDATE audit SET detail = ? WHERE seq = ?", ['{"n":99}', edited])
    found = store.audit_verdict()
    assert found.first_break == edited and "changed" in str(found.problem), found
    assert store.audit_verdict(workspace_id=b).first_break == edited
    assert store.audit_verdict(workspace_id=a).first_break is None  # not their chain


def test_deleting_the_newest_entries_of_one_chain_is_caught(store: Store) -> None:
    """Workspace A's two newest entries go; B's and the host's chains go on after them,
    so nothing after them in A's chain breaks: the marks kept outside it catch it."""
    a, b = _trail(store)
    store.audit("test.b", workspace_id=b)  # B's chain goes on past A's newest
    gone = [r["seq"] for r in _rows(store, a)][-2:]
    store.db.execute("DELETE FROM audit WHERE seq IN (?, ?)", gone)
    found = store.audit_verdict()
    assert found.first_break is not None and found.entries == len(_rows(store)), found
    if store.db.dialect == "postgresql":  # A's high-water mark: its newest seq
        assert found.first_break == gone[-1] and "deleted" in str(found.problem), found
        assert store.audit_verdict(workspace_id=b).first_break is None
    else:  # one writer, one gap-free seq: the entry after the gap breaks
        assert found.first_break == gone[0] + 1 and "missing" in str(found.problem), found
    assert store.audit_verdict(workspace_id=a).first_break == found.first_break


def test_a_whole_chain_deleted_is_caught(store: Store) -> None:
    a, _ = _trail(store)
    store.audit("test.host")
    seqs = [r["seq"] for r in _rows(store, a)]
    store.db.execute(f"DELETE FROM audit WHERE chain = ? AND seq <= {seqs[-1]}", [a])
    found = store.audit_verdict()
    expected = seqs[-1] if store.db.dialect == "postgresql" else seqs[0] + 1
    assert found.first_break == expected, found


def _legacy_database(url: str) -> list[tuple[int, str | None]]:
    """A database at the schema before chains, holding a trail the runnerd of then wrote:
    one chain over the global seq, from GENESIS (and its high-water mark)."""
    db: Database = open_database(url, statement_timeout_s=0)
    for n in range(BEFORE_CHAINS):
        with db.write():
            MIGRATIONS[n](db)
            db.set_schema_version(n + 1)
    written: list[tuple[int, str | None]] = []
    prev = GENESIS
    with db.write():
        for seq in range(1, 8):
            workspace = ("ws_legacyA", "ws_legacyB", None)[seq % 3]
            row: dict[str, object] = dict.fromkeys(_FIELDS)
            row.update(seq=seq, id=f"aud_legacy{seq}", at="2026-01-01T00:00:00Z",
                       action="test.legacy", workspace_id=workspace,
                       detail=json.dumps({"n": seq}))  # fmt: skip
            row["prev_hash"] = prev
            row["hash"] = prev = _digest(KEY, prev, row)
            db.insert("audit", row)
            db.record_high_water("audit", seq)
            written.append((seq, workspace))
    db.close()
    return written


def test_a_trail_written_before_chains_still_verifies_and_chains_follow_it(
    target: str,
) -> None:
    legacy = _legacy_database(target)
    store = Store(target, audit_key=KEY)  # migrates: the trail gains its chain columns
    try:
        assert store.schema_version == len(MIGRATIONS)
        assert {r["chain"] for r in _rows(store)} == {None}
        assert store.audit_verdict().first_break is None
        ws = store.create_workspace("New").id
        store.audit("test.new", workspace_id=ws)
        store.audit("test.new")
        store.audit("test.new", workspace_id="ws_legacyA")  # a new chain, from GENESIS
        rows = _rows(store)
        assert [r["seq"] for r in rows] == list(range(1, len(legacy) + 5))  # seq goes on
        assert [(r["chain"], r["chain_seq"]) for r in rows[len(legacy):]] == [
            (ws, 1), (ws, 2), (HOST_CHAIN, 1), ("ws_legacyA", 1)]  # fmt: skip
        found = store.audit_verdict()
        assert (found.entries, found.first_break) == (len(rows), None), found
        old = store.audit_verdict(workspace_id="ws_legacyA")
        assert (old.entries, old.first_break) == (3, None), old  # 2 legacy + 1 chained
        # The legacy trail is checked as before: an edit breaks it at that entry.
        store.db.execute("UPDATE audit SET action = 'test.forged' WHERE seq = 4")
        assert store.audit_verdict().first_break == 4
        assert store.audit_verdict(workspace_id=ws).first_break == 4  # shared, before
    finally:
        store.close()


def test_the_legacy_trail_s_newest_entries_deleted_are_caught(target: str) -> None:
    legacy = _legacy_database(target)
    store = Store(target, audit_key=KEY)
    try:
        store.db.execute("DELETE FROM audit WHERE seq >= ?", [len(legacy) - 1])
        found = store.audit_verdict()
        assert found.first_break == len(legacy) - 1 and "deleted" in str(found.problem)
    finally:
        store.close()


def test_a_sqlite_trail_copied_into_postgresql_goes_on_there(tmp_path: Path, pg: PgCluster) -> None:
    source = Store(tmp_path / "runnerd.db", audit_key=KEY)
    a, b = _trail(source)
    target = Store(pg.new_database(), audit_key=KEY)
    try:
        copy_store(source, target)
        copied = _rows(target)
        target.audit("test.after", workspace_id=a)  # a seq past the copied ones
        assert _rows(target)[-1]["seq"] > copied[-1]["seq"]
        assert target.audit_verdict().first_break is None
        # The copy's marks remember what it copied: B's newest deleted is caught.
        newest_b = _rows(target, b)[-1]["seq"]
        target.db.execute("DELETE FROM audit WHERE seq = ?", [newest_b])
        assert target.audit_verdict().first_break == newest_b
    finally:
        target.close()
        source.close()


# --- PostgreSQL: no lock shared by two workspaces' chains ---------------------------------


@pytest.fixture
def pg_store(pg: PgCluster) -> Iterator[tuple[Store, str]]:
    url = pg.new_database()
    opened = Store(url, audit_key=KEY, connections=4)
    yield opened, url
    opened.close()


def test_a_held_chain_lock_holds_only_its_own_workspace(pg_store: tuple[Store, str]) -> None:
    store, url = pg_store
    a, b = store.create_workspace("A").id, store.create_workspace("B").id
    done = threading.Event()
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [lock_id(f"audit:{a}")])
        started = time.monotonic()
        store.audit("test.b", workspace_id=b)
        assert time.monotonic() - started < 1.0  # B's append never waited for A's lock
        waiting = threading.Thread(
            target=lambda: (store.audit("test.a", workspace_id=a), done.set()), daemon=True
        )
        waiting.start()
        time.sleep(0.8)
        assert not done.is_set()  # A's append waits for its chain's lock
        other.execute("SELECT pg_advisory_unlock(%s)", [lock_id(f"audit:{a}")])
    waiting.join(5)
    assert done.is_set()
    assert store.audit_verdict().first_break is None


def test_paging_one_workspace_while_two_threads_append_sees_every_entry_once(
    pg_store: tuple[Store, str],
) -> None:
    """Each append holds its chain's lock a little while before it commits; a third
    thread writes another workspace, so the global seq interleaves. A reader pages A's
    trail by cursor meanwhile: an entry committed after the reader passed its seq would
    be skipped; none is."""
    store, _ = pg_store
    a, b = store.create_workspace("A").id, store.create_workspace("B").id
    per_writer, stop = 25, threading.Event()

    def write(workspace: str, count: int, pause: float) -> None:
        for n in range(count):
            with store.db.write():
                store._append_audit("test.page", workspace_id=workspace, detail={"n": n})
                time.sleep(pause)  # the chain's lock held, the entry not yet committed

    writers = [
        threading.Thread(target=write, args=(a, per_writer, 0.004)),
        threading.Thread(target=write, args=(a, per_writer, 0.002)),
        threading.Thread(target=write, args=(b, per_writer * 2, 0.001)),
    ]
    seen: list[int] = []
    cursor = 0
    for writer in writers:
        writer.start()
    while True:
        finished = not any(w.is_alive() for w in writers)
        page = store.audit_entries(workspace_id=a, action="test.page", after_seq=cursor, limit=3)
        seen += [e.seq for e in page]
        cursor = page[-1].seq if page else cursor
        if finished and not page:
            break
    stop.set()
    every = [e.seq for e in store.audit_entries(workspace_id=a, action="test.page", limit=1000)]
    assert len(every) == 2 * per_writer
    assert seen == every  # each once, in order, none skipped
    assert store.audit_verdict().first_break is None


def test_the_data_dir_checkpoint_keeps_each_chain_s_newest_entry(
    pg: PgCluster, tmp_path: Path
) -> None:
    """On PostgreSQL the global seq has gaps and each chain's mark is a row anyone who
    writes the database can lower; audit.head, outside it, names every chain's newest."""
    store = Store(pg.new_database(), audit_key=KEY, audit_dir=tmp_path)
    try:
        a, b = _trail(store)
        store.audit("test.a", workspace_id=a)
        assert store.checkpoint_audit()
        kept = json.loads((tmp_path / "audit.head").read_text())
        assert set(kept["chains"]) == {a, b, HOST_CHAIN}
        assert kept["chains"][b] == [_rows(store, b)[-1]["seq"], _rows(store, b)[-1]["hash"]]
        gone = _rows(store, b)[-1]["seq"]
        store.db.execute("DELETE FROM audit WHERE seq = ?", [gone])
        store.db.execute("UPDATE runnerd_high_water SET value = ? WHERE name = ?",
                         [_rows(store, b)[-1]["seq"], f"audit:{b}"])  # fmt: skip
        found = store.audit_verdict()
        assert found.first_break == gone and "audit.head" in str(found.problem), found
        # New entries in B do not move the checkpoint onto the shortened chain.
        store.audit("test.b", workspace_id=b)
        assert not store.checkpoint_audit()
        assert json.loads((tmp_path / "audit.head").read_text())["chains"][b][0] == gone
    finally:
        store.close()


# --- The API: a workspace admin verifies their workspace's chain ------------------------------

BACKENDS = ["sqlite", "postgresql"]


def test_a_workspace_admin_verifies_their_own_chain(app_daemon: InProcess) -> None:
    store = app_daemon.store()
    try:
        other = store.create_workspace("Other").id
        for n in range(3):
            store.audit("test.other", workspace_id=other, detail={"n": n})
        ours = len(_rows(store, app_daemon.workspace_id))
        edited = _rows(store, other)[1]["seq"]
        store.db.execute("UPDATE audit SET detail = '{}' WHERE seq = ?", [edited])
        assert store.audit_verdict().first_break == edited  # the host's verdict: every chain
    finally:
        store.close()
    admin = app_daemon.person("other-admin@example.com", role="admin", workspace_id=other)

    def verify(workspace_id: str, key: str) -> dict[str, object]:
        answer = app_daemon.call("POST", "/api/v2/audit/verify", key,
                                 params={"workspaceId": workspace_id})  # fmt: skip
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    mine = verify(app_daemon.workspace_id, app_daemon.admin_key)
    assert mine["ok"] is True and mine["firstBreak"] is None, mine
    assert mine["entries"] == ours and isinstance(mine["headSeq"], int)
    theirs = verify(other, admin)
    assert theirs["ok"] is False and theirs["firstBreak"] == edited, theirs
    assert theirs["headSeq"] is None  # no head to keep from a broken chain
    store = app_daemon.store()
    try:  # workspace.create, three entries, the new admin's membership and key
        assert theirs["entries"] == len(_rows(store, other)) >= 5
    finally:
        store.close()
