"""The connection, migrations and write transactions every part of the store shares."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Self

from runnerd.errors import RunnerdError
from runnerd.store.db import Database, SQLiteDatabase, open_database
from runnerd.store.schema import MIGRATIONS

if TYPE_CHECKING:
    from runnerd.config import Settings

DB_FILENAME = "runnerd.db"


class StoreUnavailable(RunnerdError):
    """The database cannot be used: unreachable, or at a schema this runnerd does not
    serve. The message says what to do."""


class StoreBase:
    """One database connection (SQLite in WAL mode, or PostgreSQL) and the migrations.
    Not shared between threads."""

    node_id: str | None = None  # set by join(): the node this process serves as
    migrate_from: int = 0

    def __init__(self, target: Path | str | Database, *, migrate: bool = True) -> None:
        """``migrate``: bring the schema forward now (a SQLite file, a test); else the
        database must be at exactly the schema this runnerd knows."""
        if isinstance(target, Path):
            self.db: Database = SQLiteDatabase(target)
        elif isinstance(target, str):
            try:
                self.db = open_database(target)
            except (ConnectionError, ValueError) as error:
                raise StoreUnavailable(str(error)) from None
        else:
            self.db = target
        self.migrate_from = self.schema_version  # what it was at open, for `admin migrate`
        if migrate:
            self.migrate()
        self._check_schema()

    def _check_schema(self) -> None:
        have, know = self.schema_version, len(MIGRATIONS)
        if have > know:
            self.db.close()
            raise StoreUnavailable(
                f"the database at {self.db.where} is at schema {have}, newer than this "
                f"runnerd knows ({know}): run the runnerd that migrated it, or a newer one"
            )
        if have < know:
            self.db.close()
            raise StoreUnavailable(
                f"the database at {self.db.where} is at schema {have}; this runnerd "
                f"serves schema {know}: run `runnerd admin migrate` first"
            )

    @classmethod
    def open(cls, settings: Settings, *, migrate: bool | None = None) -> Self:
        """The store the settings name: ``database_url``, else the data dir's file.
        A SQLite file (one node) is migrated as it opens; a shared PostgreSQL database
        only by ``runnerd admin migrate`` (``migrate=True``): nodes refuse any other
        schema than their own."""
        url = settings.database_url
        if migrate is None:
            migrate = not url or url.startswith("sqlite:")
        if url:
            return cls(url, migrate=migrate)
        settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return cls(settings.data_dir / DB_FILENAME, migrate=migrate)

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> Self:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return cls(data_dir / DB_FILENAME)

    def close(self) -> None:
        self.db.close()

    @property
    def schema_version(self) -> int:
        return self.db.get_schema_version()

    def migrate(self) -> tuple[int, int]:
        """Apply every migration not yet applied, each in its own write transaction (so
        two processes migrating at once apply each one once). (from, to) versions."""
        before = self.schema_version
        while self.schema_version < len(MIGRATIONS):
            with self._write():
                current = self.schema_version  # again, under the write lock
                if current < len(MIGRATIONS):
                    MIGRATIONS[current](self.db)
                    self.db.set_schema_version(current + 1)
        return before, self.schema_version

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """A write transaction that takes the write lock up front, so read-then-write
        sequences cannot interleave with another writer (another node's, too)."""
        with self.db.write():
            yield
