"""The one place where SQLite and PostgreSQL differ.

The store's code writes one SQL, SQLite's spelling with ``?`` placeholders, and calls a
``Database``: ``query`` (rows as dicts), ``execute`` (a cursor: tuples, ``rowcount``),
``insert``/``insert_all`` (a dict a row; lists and dicts stored as JSON), ``write``
(a transaction that holds its keyed locks from its first statement), and ``ddl`` for
migrations. ``SQLiteDatabase`` is sqlite-utils on one WAL file, as before.
``PostgresDatabase`` gives each thread its own psycopg 3 connection (the store runs
its PostgreSQL work on a few worker threads, see ``StoreBase.io``); it rewrites
placeholders once per statement text, reads ``numeric`` (what SUM of a BIGINT gives)
as an int, and spells the few types SQLite and PostgreSQL name differently.

On SQLite a write transaction is BEGIN IMMEDIATE: one writer at a time, as ever. On
PostgreSQL no lock is shared by every write: a transaction takes the keyed locks of what it
reads and then writes on the strength of (``write(*keys)``, ``lock(key)``: advisory locks
on a hash of the key; an install's budget, the configuration, an audit chain), and the
rest check by themselves (``INSERT … ON CONFLICT``, conditional updates, ``FOR UPDATE``
of one row), so two runs of different installs never wait for each other. Every
connection bounds what a node that freezes or is cut off can hold (``_PG_SESSION``,
``_PG_TCP``; limits.py): the server ends a transaction idle past its bound, which frees
its locks, and a statement waits for a lock, or runs, only so long.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import select
import socket
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import sqlite_utils

from runnerd.config import redact_url
from runnerd.errors import DatabaseUnavailable
from runnerd.limits import (
    POSTGRES_CONNECT_TIMEOUT_S,
    POSTGRES_IDLE_IN_TRANSACTION_S,
    POSTGRES_KEEPALIVES_COUNT,
    POSTGRES_KEEPALIVES_IDLE_S,
    POSTGRES_KEEPALIVES_INTERVAL_S,
    POSTGRES_LOCK_TIMEOUT_S,
    POSTGRES_STATEMENT_TIMEOUT_S,
    POSTGRES_TCP_USER_TIMEOUT_S,
    SQLITE_BUSY_TIMEOUT_S,
)

__all__ = ["Database", "PostgresDatabase", "SQLiteDatabase", "open_database"]


def lock_id(key: str) -> int:
    """The PostgreSQL advisory lock (a signed 64-bit id) of runnerd's keyed lock ``key``."""
    digest = hashlib.blake2b(f"runnerd:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


# How a node's connections show in pg_stat_activity: which host and process they serve.
APPLICATION_NAME = f"runnerd {socket.gethostname()} {os.getpid()}"[:63]


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Database(Protocol):
    dialect: str  # "sqlite" or "postgresql"
    where: str  # for messages: the file, or the URL without its password

    def execute(self, sql: str, params: Iterable[Any] = ()) -> Cursor: ...
    def query(self, sql: str, params: Iterable[Any] = ()) -> Iterator[dict[str, Any]]: ...
    def insert(self, table: str, row: Mapping[str, Any]) -> None: ...
    def insert_all(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None: ...
    def write(self, *keys: str) -> contextlib.AbstractContextManager[None]: ...
    def lock(self, key: str) -> None: ...
    def snapshot(self) -> contextlib.AbstractContextManager[None]: ...
    def ddl(self, sql: str) -> None: ...
    def sorted_json_list(self, column: str, table: str, where: str) -> str: ...
    def record_high_water(self, table: str, value: int) -> None: ...
    def high_water(self, table: str) -> int | None: ...
    def table_names(self) -> list[str]: ...
    def get_schema_version(self) -> int: ...
    def set_schema_version(self, version: int) -> None: ...
    def close(self) -> None: ...


def open_database(
    url: str, *, statement_timeout_s: float = POSTGRES_STATEMENT_TIMEOUT_S
) -> Database:
    """``sqlite:///absolute/path.db`` or ``postgresql://user:pass@host:port/db``.
    ``statement_timeout_s``: PostgreSQL's bound on one statement (0: none)."""
    if url.startswith("sqlite:///"):
        return SQLiteDatabase(Path(url.removeprefix("sqlite://")))
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresDatabase(url, statement_timeout_s=statement_timeout_s)
    raise ValueError(f"database_url {redact_url(url)!r}: expected sqlite:///PATH or postgresql://…")


@lru_cache(maxsize=256)
def _insert_sql(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def _json_value(value: Any) -> Any:
    # As sqlite-utils stores them: lists and dicts as JSON text.
    return json.dumps(value) if isinstance(value, (dict, list, tuple)) else value


class SQLiteDatabase:
    """One SQLite file in WAL mode, through sqlite-utils."""

    dialect = "sqlite"

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), check_same_thread=False, timeout=SQLITE_BUSY_TIMEOUT_S)
        self.path = path
        self.where = str(path)
        self.utils = sqlite_utils.Database(conn)
        self.utils.execute("PRAGMA foreign_keys = ON")
        self.utils.enable_wal()
        # WAL + NORMAL: a commit survives the daemon being killed (it is in the WAL the
        # moment COMMIT returns); only a power cut can lose the last transactions.
        self.utils.execute("PRAGMA synchronous = NORMAL")
        with contextlib.suppress(OSError):
            os.chmod(path, 0o600)

    def execute(self, sql: str, params: Iterable[Any] = ()) -> Cursor:
        return self.utils.execute(sql, list(params))

    def query(self, sql: str, params: Iterable[Any] = ()) -> Iterator[dict[str, Any]]:
        return self.utils.query(sql, list(params))

    def insert(self, table: str, row: Mapping[str, Any]) -> None:
        self.insert_all(table, [row])

    def insert_all(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
        # One statement of our own: sqlite-utils' insert looks the table up and reads its
        # columns first, which doubled the cost of a run's end (its ledger and audit rows).
        batch = [dict(row) for row in rows]
        if batch:
            columns = list(batch[0])
            self.utils.conn.executemany(
                _insert_sql(table, tuple(columns)),
                [[_json_value(row[c]) for c in columns] for row in batch],
            )

    @contextlib.contextmanager
    def write(self, *keys: str) -> Iterator[None]:
        """BEGIN IMMEDIATE: the file's one write lock up front, so read-then-write
        sequences cannot interleave with another writer (``keys`` add nothing to it)."""
        self.utils.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.utils.conn.rollback()
            raise
        else:
            self.utils.execute("COMMIT")

    def lock(self, key: str) -> None:
        """Nothing to take: the transaction already holds the file's write lock."""

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """A read transaction: every read inside sees one moment (WAL), while writers go on."""
        self.utils.execute("BEGIN")
        try:
            yield
        finally:
            self.utils.conn.rollback()

    def ddl(self, sql: str) -> None:
        self.utils.execute(sql)

    def sorted_json_list(self, column: str, table: str, where: str) -> str:
        """A subquery: ``column`` of ``table``'s rows that match ``where``, as a JSON list
        in order (text)."""
        return (
            f"(SELECT json_group_array({column}) FROM "
            f"(SELECT {column} FROM {table} WHERE {where} ORDER BY {column}) AS t)"
        )

    def record_high_water(self, table: str, value: int) -> None:
        """Nothing to do: SQLite's own sqlite_sequence keeps the highest AUTOINCREMENT
        key ever given out, inside the same transaction."""

    def high_water(self, table: str) -> int | None:
        """The highest key ``table`` ever had, deleted rows included."""
        row = self.utils.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", [table])
        found = row.fetchone()
        return int(found[0]) if found else None

    def table_names(self) -> list[str]:
        return [name for name in self.utils.table_names() if not name.startswith("sqlite_")]

    def get_schema_version(self) -> int:
        return int(self.utils.execute("PRAGMA user_version").fetchone()[0])

    def set_schema_version(self, version: int) -> None:
        self.utils.execute(f"PRAGMA user_version = {int(version)}")

    def close(self) -> None:
        self.utils.close()


@lru_cache(maxsize=1024)
def _pg_sql(sql: str) -> str:
    """SQLite's spelling to psycopg's: ``?`` placeholders become ``%s`` (a literal ``%``
    doubles). The store's SQL has no ``?`` inside string literals."""
    return sql.replace("%", "%%").replace("?", "%s")


_PG_TYPES = (
    (re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b"),
     "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),  # SQLite's INTEGER is 64-bit
    (re.compile(r"\bBLOB\b"), "BYTEA"),
    (re.compile(r"\s+COLLATE NOCASE\b"), ""),  # case-blind uniqueness: an index on lower()
)  # fmt: skip


def _hung_up(conn: Any) -> bool:
    """The server spoke, unasked, on an idle connection: at a restart, a failover or a
    terminated backend, it sends a FATAL message and closes. Seen by one poll of the
    socket, without a round trip. (Any other word on an idle connection, a notice, is
    rare, and costs only a new connection.)"""
    poller = select.poll()
    poller.register(conn.pgconn.socket, select.POLLIN)
    return bool(poller.poll(0))


# libpq's TCP parameters (ignored on a Unix socket); a URL that names one keeps its own.
_PG_TCP = {
    "keepalives": "1",
    "keepalives_idle": str(POSTGRES_KEEPALIVES_IDLE_S),
    "keepalives_interval": str(POSTGRES_KEEPALIVES_INTERVAL_S),
    "keepalives_count": str(POSTGRES_KEEPALIVES_COUNT),
    "tcp_user_timeout": str(POSTGRES_TCP_USER_TIMEOUT_S * 1000),  # milliseconds
}
# The session's bounds, in one round trip when a connection is made: each one that the
# role, the database or the URL's options (``options=-c lock_timeout=30s``) set is kept.
_PG_SESSION = (
    "SELECT set_config(s.name, ours.value, false) FROM pg_settings AS s "
    "JOIN unnest(%s::text[], %s::text[]) AS ours(name, value) ON ours.name = s.name "
    "WHERE s.source NOT IN ('client', 'user', 'database', 'database user')"
)


# What libpq says when the server answered but refused the login (not an outage).
_LOGIN_REFUSED = re.compile(
    r"password authentication failed|no password supplied|role .* does not exist|"
    r"database .* does not exist|no pg_hba\.conf entry|authentication failed"
)


def _unreachable(where: str, error: Exception) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if _LOGIN_REFUSED.search(first):
        return (
            f"PostgreSQL at {where} refused the login: {first} (check database_url's user, "
            "password and database, or PGPASSWORD / ~/.pgpass)"
        )
    return f"PostgreSQL at {where} did not answer: {first}"


class PostgresDatabase:
    """A PostgreSQL database shared by every node, through psycopg 3: one connection per
    thread that uses it, made on first use and made again when it breaks. A store
    operation and its transaction run on one thread, so they run on one connection;
    the store's worker threads are its connection pool."""

    dialect = "postgresql"

    def __init__(
        self, url: str, *, statement_timeout_s: float = POSTGRES_STATEMENT_TIMEOUT_S
    ) -> None:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
        from psycopg.types.numeric import NumericLoader

        class _IntegralNumeric(NumericLoader):
            # SUM(bigint) is numeric in PostgreSQL; the store only sums whole numbers.
            def load(self, data: Any) -> Any:
                value = super().load(data)
                if isinstance(value, Decimal) and value == value.to_integral_value():
                    return int(value)
                return value

        self.where = redact_url(url)
        self._url = url
        try:
            given = conninfo_to_dict(url)
        except psycopg.ProgrammingError:  # psycopg.connect says what is wrong with it
            given = {}
        self._tcp: dict[str, Any] = {k: v for k, v in _PG_TCP.items() if k not in given}
        self._session = {
            "idle_in_transaction_session_timeout": f"{POSTGRES_IDLE_IN_TRANSACTION_S}s",
            "lock_timeout": f"{POSTGRES_LOCK_TIMEOUT_S}s",
            "statement_timeout": f"{int(statement_timeout_s * 1000)}ms",
        }
        self._psycopg = psycopg
        self._loader = _IntegralNumeric
        self._dict_row = psycopg.rows.dict_row
        self._local = threading.local()
        # Bumped when a connection fails: every thread then makes its own again before
        # its next statement (after a restart or failover, all of them are stale).
        self._generation = 0
        self._opened: list[Any] = []  # every thread's connection, to close them all
        self._opened_lock = threading.Lock()
        try:
            self._live()
        except DatabaseUnavailable as error:
            raise ConnectionError(str(error)) from None
        # runnerd's own bookkeeping, beside the migrated schema: its version, and the
        # highest keys ever given out (what SQLite's sqlite_sequence keeps).
        self.execute(
            "CREATE TABLE IF NOT EXISTS runnerd_schema (id INTEGER PRIMARY KEY CHECK (id = 1), "
            "version INTEGER NOT NULL)"
        )
        self.execute(
            "CREATE TABLE IF NOT EXISTS runnerd_high_water (name TEXT PRIMARY KEY, "
            "value BIGINT NOT NULL)"
        )

    def _connect(self) -> Any:
        try:
            conn = self._psycopg.connect(
                self._url,
                autocommit=True,
                connect_timeout=POSTGRES_CONNECT_TIMEOUT_S,
                application_name=APPLICATION_NAME,
                **self._tcp,
            )
        except self._psycopg.OperationalError as error:
            raise DatabaseUnavailable(_unreachable(self.where, error)) from None
        try:
            conn.execute(_PG_SESSION, [list(self._session), list(self._session.values())])
        except self._psycopg.OperationalError as error:
            conn.close()
            raise DatabaseUnavailable(_unreachable(self.where, error)) from None
        conn.adapters.register_loader("numeric", self._loader)
        return conn

    def _live(self) -> Any:
        """This thread's connection. Inside a transaction, always the one it began on:
        its statements stay together, and fail together if that connection broke.
        Between transactions it is made again when it broke, when the server hung up on
        it while it sat idle (a restart, a failover, a terminated backend), or when
        another thread's connection failed (after a restart, all of them are stale)."""
        conn = getattr(self._local, "conn", None)
        if getattr(self._local, "pinned", 0):
            return conn
        stale = getattr(self._local, "generation", -1) != self._generation
        if conn is None or conn.closed or conn.broken or stale or _hung_up(conn):
            generation = self._generation
            if conn is not None and not conn.closed:
                conn.close()
            conn = self._local.conn = self._connect()
            self._local.generation = generation
            with self._opened_lock:
                self._opened = [c for c in self._opened if not c.closed] + [conn]
        return conn

    @contextlib.contextmanager
    def _pinned(self) -> Iterator[Any]:
        """This thread's connection, kept for every statement until the block ends."""
        conn = self._live()
        self._local.pinned = getattr(self._local, "pinned", 0) + 1
        try:
            yield conn
        finally:
            self._local.pinned -= 1

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """PostgreSQL not answering becomes DatabaseUnavailable (503, Retry-After): also
        a lock or a statement past its bound, and a transaction the server ended for
        idling past its bound (this node stopped in it). A connection that broke makes
        every thread's connection suspect: each makes its own again before its next
        transaction."""
        errors = self._psycopg.errors
        try:
            yield
        except (
            self._psycopg.OperationalError,  # lock_timeout, statement_timeout among them
            self._psycopg.InterfaceError,
            errors.IdleInTransactionSessionTimeout,
        ) as error:
            conn = getattr(self._local, "conn", None)
            if conn is None or conn.closed or conn.broken:
                self._generation += 1
            raise DatabaseUnavailable(_unreachable(self.where, error)) from None

    def execute(self, sql: str, params: Iterable[Any] = ()) -> Cursor:
        values = [_json_value(p) for p in params]
        with self._guard():
            return self._live().execute(_pg_sql(sql), values)  # type: ignore[no-any-return]

    def query(self, sql: str, params: Iterable[Any] = ()) -> Iterator[dict[str, Any]]:
        with self._guard():
            cursor = self._live().cursor(row_factory=self._dict_row)
            cursor.execute(_pg_sql(sql), [_json_value(p) for p in params])
            return iter(cursor.fetchall())

    def insert(self, table: str, row: Mapping[str, Any]) -> None:
        self.insert_all(table, [row])

    def insert_all(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
        batch = [dict(row) for row in rows]
        if not batch:
            return
        columns = list(batch[0])
        sql = (
            f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join('%s' for _ in columns)})"
        )
        with self._guard(), self._live().cursor() as cursor:
            cursor.executemany(
                sql,
                [[_json_value(row[c]) for c in columns] for row in batch],
            )

    @contextlib.contextmanager
    def write(self, *keys: str) -> Iterator[None]:
        """A transaction that holds the keyed locks ``keys`` (what it reads, then writes
        on the strength of: an install's budget, a person's idempotency keys, …) from its
        first statement, across every node; more are taken inside it with ``lock``. No
        lock is shared by every write: two runs of different installs never wait for
        each other, and a transaction that names no key takes none."""
        with self._guard(), self._pinned() as conn, conn.transaction():
            for key in sorted(set(keys)):  # one order everywhere: no deadlock between two
                conn.execute("SELECT pg_advisory_xact_lock(%s)", [lock_id(key)])
            yield

    def lock(self, key: str) -> None:
        """Take the keyed lock ``key`` until the current write transaction ends (the
        audit chain's, as late as its entry is written, so it is held the least)."""
        with self._guard():
            self._live().execute("SELECT pg_advisory_xact_lock(%s)", [lock_id(key)])

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """A read transaction that sees one moment (REPEATABLE READ)."""
        with self._guard(), self._pinned() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield

    def ddl(self, sql: str) -> None:
        for pattern, replacement in _PG_TYPES:
            sql = pattern.sub(replacement, sql)
        self.execute(sql)

    def sorted_json_list(self, column: str, table: str, where: str) -> str:
        return (
            f"(SELECT COALESCE(json_agg({column} ORDER BY {column})::text, '[]') "
            f"FROM {table} WHERE {where})"
        )

    def record_high_water(self, table: str, value: int) -> None:
        """Keep the highest key ``table`` ever had, in the caller's transaction (a
        sequence would not roll back with it)."""
        self.execute(
            "INSERT INTO runnerd_high_water VALUES (?, ?) ON CONFLICT (name) DO UPDATE "
            "SET value = GREATEST(runnerd_high_water.value, excluded.value)",
            [table, value],
        )

    def high_water(self, table: str) -> int | None:
        found = self.execute(
            "SELECT value FROM runnerd_high_water WHERE name = ?", [table]
        ).fetchone()
        return int(found[0]) if found else None

    def table_names(self) -> list[str]:
        rows = self.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
        return [row[0] for row in rows if not row[0].startswith("runnerd_")]

    def get_schema_version(self) -> int:
        row = self.execute("SELECT version FROM runnerd_schema WHERE id = 1").fetchone()
        return int(row[0]) if row else 0

    def set_schema_version(self, version: int) -> None:
        self.execute(
            "INSERT INTO runnerd_schema VALUES (1, ?) "
            "ON CONFLICT (id) DO UPDATE SET version = excluded.version",
            [version],
        )

    def listen(self, channel: str, stop: threading.Event) -> Iterator[str | None]:
        """The payloads NOTIFY sends on ``channel``, on a connection of their own (not a
        worker thread's), until ``stop`` is set (seen within a second). Yields None
        each time it (re)connects: what was sent while it was away is lost, so the
        caller looks again. A database away is tried again every second."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", channel):
            raise ValueError(f"not a channel name: {channel!r}")
        while not stop.is_set():
            try:
                conn = self._connect()
            except DatabaseUnavailable:
                stop.wait(1.0)
                continue
            try:
                with conn:
                    conn.execute(f"LISTEN {channel}")
                    yield None
                    while not stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            yield note.payload
            except (self._psycopg.OperationalError, self._psycopg.InterfaceError):
                stop.wait(1.0)

    def close(self) -> None:
        with self._opened_lock:
            for conn in self._opened:
                conn.close()
            self._opened = []
