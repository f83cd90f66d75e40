"""Backups of the store: a consistent copy of a live database, and putting one back.

The copy uses SQLite's online backup API, so a daemon may keep serving (and writing)
while it runs: the copy is the database as of one moment. It holds what the database
holds: never an input, an output or a secret in clear (secrets are sealed with the key
in ``secrets.key``, which is kept apart: back it up separately, or a restored store
cannot open its secrets). People's dev pages (store/dev_pages.py) are in it as they are
in the file; restored, they still go an hour after their last PUT.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path

from runnerd.errors import BackupError
from runnerd.limits import BACKUP_BUSY_TIMEOUT_S, BACKUP_STEP_PAGES
from runnerd.store.core import DB_FILENAME
from runnerd.store.schema import MIGRATIONS

__all__ = ["backup", "restore", "sealed_with"]


def _check(path: Path) -> int:
    """The schema version of a runnerd database file; BackupError if it is none."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise BackupError(f"{path}: not a SQLite database ({exc})") from None
    try:
        ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error as exc:
        raise BackupError(f"{path}: not a readable SQLite database ({exc})") from None
    finally:
        conn.close()
    if ok != "ok":
        raise BackupError(f"{path}: the database fails its integrity check: {ok}")
    if "audit" not in tables or version < 1:
        raise BackupError(f"{path}: not a runnerd database")
    if version > len(MIGRATIONS):
        raise BackupError(
            f"{path}: made by a newer runnerd (schema {version}; this one knows "
            f"{len(MIGRATIONS)}): upgrade runnerd first"
        )
    return version


def _copy(source: sqlite3.Connection, target: Path) -> None:
    staging = target.with_name(f".{target.name}.{os.getpid()}.partial")
    with contextlib.suppress(FileNotFoundError):
        staging.unlink()
    dest = sqlite3.connect(str(staging))
    try:
        # Page by page, letting writers in between: a live daemon is never held up long.
        source.backup(dest, pages=BACKUP_STEP_PAGES, sleep=0.001)
        dest.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
    finally:
        dest.close()
    os.chmod(staging, 0o600)
    staging.replace(target)


def backup(data_dir: Path, target: Path) -> int:
    """Copy the store of ``data_dir`` to ``target`` (a consistent snapshot, even of a
    live store); returns the copy's size in bytes."""
    db = data_dir / DB_FILENAME
    if not db.is_file():
        raise BackupError(f"{data_dir}: no runnerd database here ({DB_FILENAME})")
    target.parent.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(str(db), timeout=BACKUP_BUSY_TIMEOUT_S)
    try:
        _copy(source, target)
    finally:
        source.close()
    _check(target)
    return target.stat().st_size


def sealed_with(source: Path) -> set[str]:
    """The ids of the secrets keys a backup's secrets are sealed with (read only; none
    from a backup with no secrets, or of a schema before them)."""
    _check(source)
    conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT DISTINCT key_id FROM install_secrets").fetchall()
    except sqlite3.Error:
        return set()
    finally:
        conn.close()
    return {str(row[0]) for row in rows}


def restore(source: Path, data_dir: Path) -> Path | None:
    """Put the backup ``source`` in place as the store of ``data_dir`` (no daemon may be
    serving it). An existing database is kept beside it, renamed; returns its new path."""
    _check(source)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = data_dir / "daemon.lock"
    if lock.exists():
        import fcntl

        with open(lock) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise BackupError(
                    f"a daemon is serving {data_dir}: stop it before restoring"
                ) from None
    db = data_dir / DB_FILENAME
    kept = None
    if db.exists():
        kept = db.with_name(f"{DB_FILENAME}.before-restore-{time.strftime('%Y%m%dT%H%M%S')}")
        db.replace(kept)
    for suffix in ("-wal", "-shm"):  # the old database's journal must not meet the new one
        with contextlib.suppress(FileNotFoundError):
            db.with_name(DB_FILENAME + suffix).unlink()
    # The audit checkpoint named the old database's newest entry; a restore goes back to
    # an older trail on purpose (the old database is kept beside it). The restored trail
    # is checkpointed when it is next opened.
    old_head = data_dir / "audit.head"
    if old_head.exists():
        old_head.replace(data_dir / f"audit.head.before-restore-{time.strftime('%Y%m%dT%H%M%S')}")
    conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        _copy(conn, db)
    finally:
        conn.close()
    return kept
