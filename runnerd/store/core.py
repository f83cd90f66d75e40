"""The connection, migrations and write transactions every part of the store shares."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, Self, TypeVar

from runnerd.errors import StoreUnavailable
from runnerd.limits import DB_THREADS, POSTGRES_STATEMENT_TIMEOUT_S
from runnerd.store.audit_key import audit_key_of, chain_key
from runnerd.store.db import Database, SQLiteDatabase, open_database
from runnerd.store.schema import MIGRATIONS

if TYPE_CHECKING:
    from runnerd.config import Settings

DB_FILENAME = "runnerd.db"
# The keyed lock of configuration writes (StoreBase._write with no key named).
CONFIG_LOCK = "config"

P = ParamSpec("P")
T = TypeVar("T")


class StoreBase:
    """The database (one SQLite file in WAL mode, or PostgreSQL) and the migrations.

    Called directly, every operation runs on the calling thread. The daemon calls it
    through ``io``, which keeps PostgreSQL's round trips off the event loop."""

    node_id: str | None = None  # set by join(): the node this process serves as
    migrate_from: int = 0
    _workers: ThreadPoolExecutor | None = None
    audit_key: bytes  # the audit chain's HMAC key (store/audit.py), never in the database
    audit_head_path: Path | None = None  # where the newest entry is checkpointed

    def __init__(
        self,
        target: Path | str | Database,
        *,
        migrate: bool = True,
        connections: int = DB_THREADS,
        audit_key: bytes | None = None,
        audit_dir: Path | None = None,
    ) -> None:
        """``migrate``: bring the schema forward now (a SQLite file, a test); else the
        database must be at exactly the schema this runnerd knows. ``connections``:
        worker threads for ``io`` on PostgreSQL, each with its own connection.
        ``audit_key``: the audit chain's key, else the one in ``audit_dir`` (a SQLite
        file's folder by default; made from the secrets key file there, as the daemon's
        is: audit_key.chain_key), where the trail's checkpoint is kept too; a store with
        neither (a test's database) chains under a key of its own, for its life only."""
        if audit_dir is None and isinstance(target, Path):
            audit_dir = target.parent
        keyed = audit_key is not None or audit_dir is not None
        if audit_key is None:
            audit_key = (
                chain_key(audit_dir / "audit.key", secrets_path=audit_dir / "secrets.key")
                if audit_dir is not None
                else secrets.token_bytes(32)
            )
        self.audit_key = audit_key
        self.audit_head_path = audit_dir / "audit.head" if audit_dir is not None else None
        if isinstance(target, Path):
            self.db: Database = SQLiteDatabase(target)
        elif isinstance(target, str):
            try:  # migrations and `admin copy` cover whole tables: no bound on a statement
                self.db = open_database(
                    target, statement_timeout_s=0 if migrate else POSTGRES_STATEMENT_TIMEOUT_S
                )
            except (ConnectionError, ValueError) as error:
                raise StoreUnavailable(str(error)) from None
        else:
            self.db = target
        self.migrate_from = self.schema_version  # what it was at open, for `admin migrate`
        if migrate:
            self.migrate()
        self._check_schema()
        if migrate and keyed:  # never re-chain under a key made up for this one store
            self.upgrade_audit_chain()
        if self.db.dialect == "postgresql":  # threads start on first use
            self._workers = ThreadPoolExecutor(connections, thread_name_prefix="runnerd-db")

    async def io(self, work: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``work(*args, **kwargs)`` (store operations, or a function of several), for
        code on the event loop.

        On SQLite it runs inline: a local file answers in microseconds, and one thread
        keeps SQLite's one writer. On PostgreSQL it runs on one of the store's worker
        threads (``connections``), each with its own connection, so a round trip, a
        wait for a keyed lock, or a database that stopped answering never holds the
        loop. Work that started finishes: a caller cancelled meanwhile is cancelled once
        the work is done, never halfway through its transaction."""
        if self._workers is None:
            return work(*args, **kwargs)
        done = asyncio.get_running_loop().run_in_executor(
            self._workers, functools.partial(work, *args, **kwargs)
        )
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            await asyncio.wait({done})
            raise

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

        settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = audit_key_of(settings)
        if url:
            return cls(
                url,
                migrate=migrate,
                connections=settings.database_connections,
                audit_key=key,
                audit_dir=settings.data_dir,
            )
        return cls(
            settings.data_dir / DB_FILENAME, migrate=migrate, audit_key=key,
            audit_dir=settings.data_dir,
        )  # fmt: skip

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> Self:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return cls(data_dir / DB_FILENAME)

    def ping(self) -> None:
        """Raise unless the database answers."""
        self.db.execute("SELECT 1").fetchone()

    def upgrade_audit_chain(self) -> int:
        """Overridden by the audit store (store/audit.py)."""
        return 0

    def checkpoint_audit(self) -> bool:
        """Overridden by the audit store (store/audit.py)."""
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a database already gone keeps the last one
            self.checkpoint_audit()
        if self._workers is not None:
            self._workers.shutdown(wait=True)
        self.db.close()

    @property
    def schema_version(self) -> int:
        return self.db.get_schema_version()

    def migrate(self) -> tuple[int, int]:
        """Apply every migration not yet applied, each in its own write transaction (so
        two processes migrating at once apply each one once). (from, to) versions."""
        before = self.schema_version
        while self.schema_version < len(MIGRATIONS):
            with self._write("migrate"):
                current = self.schema_version  # again, under the migration lock
                if current < len(MIGRATIONS):
                    MIGRATIONS[current](self.db)
                    self.db.set_schema_version(current + 1)
        return before, self.schema_version

    def db_now(self) -> datetime:
        """Now on the database's clock (PostgreSQL: ``clock_timestamp()``, when this
        statement runs), for what nodes compare across each other (leases, expiries):
        a node's skewed clock changes none of it. A SQLite file has one node, whose
        clock it is."""
        if self.db.dialect == "postgresql":
            found = self.db.execute("SELECT clock_timestamp()").fetchone()[0]
            return found.astimezone(UTC)  # type: ignore[no-any-return]
        return datetime.now(UTC)

    @contextlib.contextmanager
    def _write(self, *keys: str) -> Iterator[None]:
        """A write transaction that takes the keyed locks ``keys`` up front, so
        read-then-write sequences on what they guard cannot interleave with another
        writer's (another node's, too). With none named, the key of configuration
        (people, apps, keys, secrets, sessions, settings: rare writes, serialised among
        themselves as before). The run path names its own: ``budget:<install>``,
        ``idem:<user>``, ``approval:<id>``, ``node:<id>``; the audit chain's
        (``audit:<chain>``) is taken as its entry is written (AuditStore)."""
        with self.db.write(*(keys or (CONFIG_LOCK,))):
            yield

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """A write transaction that takes no keyed lock: for statements that check by
        themselves (``INSERT … ON CONFLICT``, a conditional ``UPDATE`` whose row count
        says who won, ``SELECT … FOR UPDATE`` of the one row it changes)."""
        with self.db.write():
            yield

    @property
    def _for_update(self) -> str:
        """`` FOR UPDATE`` on PostgreSQL (the row stays this transaction's until it ends);
        nothing on SQLite, whose write transaction already excludes every other."""
        return " FOR UPDATE" if self.db.dialect == "postgresql" else ""
