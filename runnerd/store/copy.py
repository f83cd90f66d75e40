"""Copy a whole store into an empty database: a single node's SQLite file into the
PostgreSQL database of a cluster (``runnerd admin copy``), or any store into another."""

from __future__ import annotations

from runnerd.errors import StoreUnavailable
from runnerd.limits import COPY_BATCH_ROWS
from runnerd.store.audit import AuditStore

__all__ = ["TABLES", "copy_store"]

# Every table of the schema, each after the tables it refers to. Node leases are not
# copied: they belong to the database the nodes served; nor are dev pages (runnerd app
# dev): they live an hour, and `runnerd app dev` sends them again to the new database.
TABLES = (
    "workspaces", "users", "memberships", "api_keys", "apps", "app_versions", "tools",
    "app_pages", "publications", "installs", "runs", "install_secrets", "budgets", "budget_usage",
    "ledger", "audit", "approvals", "idempotency", "login_links", "web_sessions",
    "approval_rules", "workspace_webhooks", "git_deploys",
    "oauth_clients", "oauth_requests", "oauth_codes", "oauth_refresh_tokens",
)  # fmt: skip
NOT_COPIED = ("nodes", "dev_pages", "dev_page_files")


def copy_store(source: AuditStore, target: AuditStore) -> dict[str, int]:
    """Copy every row of ``source`` (read as one snapshot, so a live store copies
    consistently) into ``target``, which must be empty, in one transaction. Rows per
    table; the target's audit chain and counts are checked before it commits."""
    missing = set(source.db.table_names()) - set(TABLES) - set(NOT_COPIED)
    if missing:  # a table this code does not know: refuse rather than drop it
        raise StoreUnavailable(f"cannot copy: unknown tables {sorted(missing)}")
    full = [t for t in TABLES if target.db.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()]
    if full:
        raise StoreUnavailable(
            f"{target.db.where} is not empty ({', '.join(full)} have rows): copy into a "
            "new database"
        )
    counts: dict[str, int] = {}
    with source.db.snapshot(), target.db.write():
        for table in TABLES:
            order = "seq" if table == "audit" else "1"
            rows = source.db.query(f"SELECT * FROM {table} ORDER BY {order}")
            counts[table] = 0
            batch = []
            for row in rows:
                batch.append(row)
                if len(batch) >= COPY_BATCH_ROWS:
                    target.db.insert_all(table, batch)
                    counts[table] += len(batch)
                    batch = []
            if batch:
                target.db.insert_all(table, batch)
                counts[table] += len(batch)
        # The audit trail's high-water marks (each chain's, the legacy trail's), and on
        # PostgreSQL its seq's sequence past the copied rows (store/audit.py).
        for name, top in source.audit_marks().items():
            target.db.record_high_water(name, top)
        target.align_audit_sequence()
        for table, count in counts.items():
            have = target.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            if have != count:
                raise StoreUnavailable(f"copy check: {table} has {have} rows, expected {count}")
    return counts
