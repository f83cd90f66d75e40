"""The SQLite store: the only package with SQL in it.

One file in the data dir, WAL mode, opened through sqlite-utils. The schema is built by
numbered migrations (``PRAGMA user_version`` holds the last one applied); each runs in
its own transaction, so a database is always at one exact version. Stored app versions
are immutable: triggers refuse any UPDATE or DELETE of a version or its tools.
"""

from runnerd.store.approvals import ApprovalRow, ApprovalsStore
from runnerd.store.apps import AppsStore
from runnerd.store.audit import AuditEntry
from runnerd.store.core import DB_FILENAME, StoreUnavailable
from runnerd.store.people import PeopleStore
from runnerd.store.records import (
    AppRecord,
    InstallRecord,
    KeyRecord,
    MembershipRecord,
    ToolRecord,
    UserRecord,
    VersionRecord,
    WorkspaceRecord,
    hash_key,
    new_id,
    utc_now,
)
from runnerd.store.runs import BudgetStatus, RunRow, RunsStore, month_end, month_of
from runnerd.store.schema import MIGRATIONS
from runnerd.store.secrets import SecretsStore
from runnerd.store.sessions import SessionRecord, SessionsStore

__all__ = [
    "DB_FILENAME",
    "MIGRATIONS",
    "AppRecord",
    "ApprovalRow",
    "AuditEntry",
    "BudgetStatus",
    "InstallRecord",
    "KeyRecord",
    "MembershipRecord",
    "RunRow",
    "SessionRecord",
    "Store",
    "StoreUnavailable",
    "ToolRecord",
    "UserRecord",
    "VersionRecord",
    "WorkspaceRecord",
    "hash_key",
    "month_end",
    "month_of",
    "new_id",
    "utc_now",
]


class Store(AppsStore, PeopleStore, RunsStore, SecretsStore, ApprovalsStore, SessionsStore):
    """The database of one runnerd install. Not shared between threads without a lock."""
