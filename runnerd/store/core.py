"""The connection, migrations and write transactions every part of the store shares."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import sqlite_utils

from runnerd.store.schema import MIGRATIONS

DB_FILENAME = "runnerd.db"


class StoreBase:
    """One SQLite connection (WAL) and the migrations. Not shared between threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), check_same_thread=False, timeout=10)
        self.path = path
        self.db = sqlite_utils.Database(conn)
        self.db.execute("PRAGMA foreign_keys = ON")
        self.db.enable_wal()
        # WAL + NORMAL: a commit survives the daemon being killed (it is in the WAL the
        # moment COMMIT returns); only a power cut can lose the last transactions.
        self.db.execute("PRAGMA synchronous = NORMAL")
        with contextlib.suppress(OSError):
            os.chmod(path, 0o600)
        self.migrate()

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> Self:
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
