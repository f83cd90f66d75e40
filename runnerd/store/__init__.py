"""The store: the only package with SQL in it.

One SQLite file in the data dir (WAL mode, through sqlite-utils), or a PostgreSQL
database that several nodes share (``database_url``; the differences are in ``db``).
The schema is built by numbered migrations; each runs in its own transaction, so a
database is always at one exact version. Stored app versions
are immutable: triggers refuse any UPDATE or DELETE of a version or its tools.
"""

from runnerd.store.approval_rules import ApprovalRule, ApprovalRulesStore, WebhookRow
from runnerd.store.approvals import ApprovalRow, ApprovalsStore
from runnerd.store.apps import AppsStore
from runnerd.store.audit import AuditEntry
from runnerd.store.core import DB_FILENAME
from runnerd.store.dev_pages import DevPagesRow, DevPagesStore
from runnerd.store.git_deploys import GitDeployRow, GitDeploysStore
from runnerd.store.idempotency import IdempotencyStore
from runnerd.store.nodes import NodesStore
from runnerd.store.oauth import OAuthStore
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
    "ApprovalRule",
    "AuditEntry",
    "BudgetStatus",
    "DevPagesRow",
    "GitDeployRow",
    "InstallRecord",
    "KeyRecord",
    "MembershipRecord",
    "RunRow",
    "SessionRecord",
    "Store",
    "ToolRecord",
    "UserRecord",
    "VersionRecord",
    "WebhookRow",
    "WorkspaceRecord",
    "hash_key",
    "month_end",
    "month_of",
]


class Store(
    AppsStore,
    PeopleStore,
    NodesStore,
    RunsStore,
    SecretsStore,
    ApprovalsStore,
    ApprovalRulesStore,
    GitDeploysStore,
    DevPagesStore,
    IdempotencyStore,
    SessionsStore,
    OAuthStore,
):
    """The database of one runnerd install. Code on the event loop calls it through
    ``io`` (inline on SQLite, on a worker thread on PostgreSQL)."""
