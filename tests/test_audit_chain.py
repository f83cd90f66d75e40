"""The audit trail's chain is keyed (HMAC under a key outside the database) and checked
against checkpoints kept outside it: someone who can write the database can neither
re-chain an edit nor delete the newest entries unseen. Through ``runnerd audit verify``,
as an operator runs it, on a real SQLite file."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from conftest import run_cli
from runnerd.store import DB_FILENAME, Store

_FIELDS = ("seq", "id", "at", "workspace_id", "actor_user_id", "actor_key_id", "action",
           "install_id", "version_id", "tool", "surface", "status", "duration_ms", "reason",
           "detail")  # fmt: skip


def _plain(prev: str, row: dict[str, object]) -> str:
    """The unkeyed hash an attacker can compute (what the chain was before it was keyed)."""
    body = json.dumps([row.get(f) for f in _FIELDS], separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(f"{prev}\n{body}".encode()).hexdigest()


def _trail(data: Path, entries: int = 6) -> None:
    """A data dir whose trail has ``entries`` entries, closed (and so checkpointed)."""
    store = Store.in_data_dir(data)
    workspace = store.create_workspace("Acme")
    for n in range(entries - 1):
        store.audit("test.event", workspace_id=workspace.id, detail={"n": n})
    store.close()


def _rechain_without_key(db: Path, edit: str | None = None) -> None:
    """What a database writer without the key can do: change an entry, then recompute
    every hash the only way open to them."""
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    if edit is not None:
        conn.execute("UPDATE audit SET detail = ? WHERE seq = 2", [edit])
    prev = "0" * 64
    for row in conn.execute("SELECT * FROM audit ORDER BY seq").fetchall():
        digest = _plain(prev, dict(row))
        conn.execute("UPDATE audit SET prev_hash = ?, hash = ? WHERE seq = ?",
                     [prev, digest, row["seq"]])  # fmt: skip
        prev = digest
    conn.commit()
    conn.close()


def _verify(data: Path, *extra: str) -> tuple[int, dict[str, object], str]:
    done = run_cli("audit", "verify", "--data-dir", str(data), "--json", *extra)
    return done.returncode, json.loads(done.stdout or "{}"), done.stderr


@pytest.mark.smoke
def test_an_intact_trail_verifies_and_prints_a_checkpoint(tmp_path: Path) -> None:
    _trail(tmp_path)
    code, found, _ = _verify(tmp_path)
    assert code == 0 and found["firstBroken"] is None and found["entries"] == 6
    head = found["head"]
    assert isinstance(head, dict) and head["seq"] == 6 and len(str(head["hash"])) == 64
    text = run_cli("audit", "verify", "--data-dir", str(tmp_path)).stdout
    assert f"checkpoint 6:{head['hash']}" in text
    assert run_cli("audit", "verify", "--data-dir", str(tmp_path), "--checkpoint",
                   f"6:{head['hash']}").returncode == 0  # fmt: skip
    key = tmp_path / "audit.key"
    assert key.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("edit", [None, '{"n":99}'])
def test_re_chaining_without_the_key_is_found(tmp_path: Path, edit: str | None) -> None:
    """An edit re-chained with the unkeyed hash (or a plain re-chain) breaks at entry 1:
    no hash of the trail verifies without the key."""
    _trail(tmp_path)
    _rechain_without_key(tmp_path / DB_FILENAME, edit)
    code, found, _ = _verify(tmp_path)
    assert code == 1 and found["firstBroken"] == 1, found


def test_re_chaining_with_another_key_is_found(tmp_path: Path) -> None:
    _trail(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    attacker = Store(tmp_path / DB_FILENAME, audit_key=b"k" * 32, audit_dir=other)
    attacker.db.execute("DELETE FROM audit WHERE seq > 1")
    attacker.audit("test.forged")
    attacker.close()
    code, found, _ = _verify(tmp_path)
    assert code == 1 and found["firstBroken"] == 2, found  # entry 1 is the real one
    # Opening a trail under another key never re-keys it.
    assert Store(tmp_path / DB_FILENAME, audit_key=b"j" * 32, audit_dir=other).close() is None
    assert _verify(tmp_path)[1]["firstBroken"] == 2


def test_deleting_the_newest_entries_is_found_even_with_the_sequence_reset(
    tmp_path: Path,
) -> None:
    """The attacker deletes the last two entries and resets SQLite's record of the highest
    seq: the data dir's checkpoint still names entry 6."""
    _trail(tmp_path)
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    conn.execute("DELETE FROM audit WHERE seq > 4")
    conn.execute("UPDATE sqlite_sequence SET seq = 4 WHERE name = 'audit'")
    conn.commit()
    conn.close()
    code, found, _ = _verify(tmp_path)
    assert code == 1 and found["firstBroken"] == 5, found
    assert "deleted" in str(found["problem"])
    # The checkpoint is never moved back to the shortened trail.
    assert json.loads((tmp_path / "audit.head").read_text())["seq"] == 6


def test_a_printed_checkpoint_finds_what_the_data_dir_lost(tmp_path: Path) -> None:
    """An attacker who also removes audit.head is caught by the checkpoint the operator
    kept elsewhere."""
    _trail(tmp_path)
    kept = _verify(tmp_path)[1]["head"]
    assert isinstance(kept, dict)
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    conn.execute("DELETE FROM audit WHERE seq = 6")
    conn.execute("UPDATE sqlite_sequence SET seq = 5 WHERE name = 'audit'")
    conn.commit()
    conn.close()
    (tmp_path / "audit.head").unlink()
    checkpoint = f"{kept['seq']}:{kept['hash']}"
    code, found, _ = _verify(tmp_path, "--checkpoint", checkpoint)
    assert code == 1 and found["firstBroken"] == 6
    done = run_cli("audit", "verify", "--data-dir", str(tmp_path), "--checkpoint", "6:xyz")
    assert done.returncode == 2 and "SEQ:HASH" in done.stderr


def test_a_trail_chained_before_the_key_is_re_chained_once_and_says_so(tmp_path: Path) -> None:
    """An upgrade: a trail of unkeyed hashes (and no checkpoint yet) is keyed on open, with
    an audit.rechain entry; after that, an unkeyed re-chain is a break again."""
    _trail(tmp_path, entries=4)
    _rechain_without_key(tmp_path / DB_FILENAME)
    (tmp_path / "audit.head").unlink()
    code, found, _ = _verify(tmp_path)  # opening the store re-chains it
    assert code == 0 and found["entries"] == 5, found
    store = Store.in_data_dir(tmp_path)
    (entry,) = store.audit_entries(action="audit.rechain")
    assert entry.detail == {"entries": 4, "plainFirstBreak": None}
    store.close()
    _rechain_without_key(tmp_path / DB_FILENAME)  # now there is a checkpoint: never again
    assert _verify(tmp_path)[0] == 1
