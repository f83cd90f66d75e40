"""The schema, as numbered migrations. Append only: a released migration never changes."""

from __future__ import annotations

from collections.abc import Callable

from runnerd.store.db import Database

# --- Migrations -----------------------------------------------------------------------------


def _m1_apps_and_versions(db: Database) -> None:
    db.ddl(
        """CREATE TABLE apps (
            id TEXT PRIMARY KEY,
            slug TEXT NOT NULL UNIQUE,
            name TEXT NOT NULL,
            created_at TEXT NOT NULL
        )"""
    )
    db.ddl(
        """CREATE TABLE app_versions (
            id TEXT PRIMARY KEY,
            app_id TEXT NOT NULL REFERENCES apps(id),
            version TEXT NOT NULL,
            seq INTEGER NOT NULL,
            manifest TEXT NOT NULL,
            content_hash TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (app_id, version),
            UNIQUE (app_id, seq)
        )"""
    )
    db.ddl(
        """CREATE TABLE tools (
            version_id TEXT NOT NULL REFERENCES app_versions(id),
            name TEXT NOT NULL,
            description TEXT NOT NULL,
            effect TEXT NOT NULL CHECK (effect IN ('read', 'write')),
            timeout_ms INTEGER NOT NULL,
            language TEXT NOT NULL CHECK (language IN ('python', 'javascript', 'typescript')),
            input_schema TEXT NOT NULL,
            output_schema TEXT NOT NULL,
            packages TEXT NOT NULL,
            yaml_path TEXT NOT NULL,
            yaml_text TEXT NOT NULL,
            source_path TEXT NOT NULL,
            source TEXT NOT NULL,
            compiled_js TEXT,
            module_format TEXT,
            PRIMARY KEY (version_id, name)
        )"""
    )
    for table in ("app_versions", "tools"):
        _immutable(db, table)


def _immutable(db: Database, table: str) -> None:
    """Triggers that refuse any UPDATE or DELETE of ``table``'s rows."""
    if db.dialect == "postgresql":
        db.ddl(
            """CREATE OR REPLACE FUNCTION runnerd_immutable() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'stored app versions are immutable'; END $$"""
        )
        db.ddl(
            f"""CREATE TRIGGER {table}_immutable BEFORE UPDATE OR DELETE ON {table}
            FOR EACH ROW EXECUTE FUNCTION runnerd_immutable()"""
        )
        return
    for action in ("UPDATE", "DELETE"):
        db.ddl(
            f"""CREATE TRIGGER {table}_immutable_{action.lower()}
            BEFORE {action} ON {table}
            BEGIN SELECT RAISE(ABORT, 'stored app versions are immutable'); END"""
        )


def _m2_people_installs_runs(db: Database) -> None:
    db.ddl(
        """CREATE TABLE workspaces (
            id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at TEXT NOT NULL)"""
    )
    db.ddl(
        """CREATE TABLE users (
            id TEXT PRIMARY KEY, email TEXT NOT NULL UNIQUE COLLATE NOCASE,
            name TEXT, created_at TEXT NOT NULL)"""
    )
    if db.dialect == "postgresql":  # SQLite's COLLATE NOCASE
        db.ddl("CREATE UNIQUE INDEX users_email_nocase ON users (lower(email))")
    db.ddl(
        """CREATE TABLE memberships (
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            user_id TEXT NOT NULL REFERENCES users(id),
            role TEXT NOT NULL CHECK (role IN ('admin', 'builder', 'member', 'viewer')),
            apps_access INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            PRIMARY KEY (workspace_id, user_id))"""
    )
    db.ddl(
        """CREATE TABLE api_keys (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL CHECK (kind IN ('personal', 'workspace', 'token')),
            user_id TEXT REFERENCES users(id),
            workspace_id TEXT REFERENCES workspaces(id),
            scopes TEXT NOT NULL DEFAULT '[]',
            name TEXT NOT NULL DEFAULT '',
            key_hash TEXT NOT NULL UNIQUE,
            prefix TEXT NOT NULL,
            created_at TEXT NOT NULL,
            revoked_at TEXT)"""
    )
    db.ddl("ALTER TABLE apps ADD COLUMN workspace_id TEXT REFERENCES workspaces(id)")
    db.ddl(
        """CREATE TABLE publications (
            version_id TEXT PRIMARY KEY REFERENCES app_versions(id),
            published_by TEXT REFERENCES users(id),
            published_at TEXT NOT NULL)"""
    )
    db.ddl(
        """CREATE TABLE installs (
            id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            app_id TEXT NOT NULL REFERENCES apps(id),
            version_id TEXT NOT NULL REFERENCES app_versions(id),
            previous_version_id TEXT REFERENCES app_versions(id),
            created_by TEXT REFERENCES users(id),
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            UNIQUE (workspace_id, app_id))"""
    )
    db.ddl(
        """CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            install_id TEXT NOT NULL REFERENCES installs(id),
            app_id TEXT NOT NULL REFERENCES apps(id),
            version_id TEXT NOT NULL REFERENCES app_versions(id),
            tool TEXT NOT NULL,
            user_id TEXT NOT NULL REFERENCES users(id),
            surface TEXT NOT NULL,
            workflow_run_id TEXT,
            status TEXT NOT NULL DEFAULT 'running'
                CHECK (status IN ('running', 'succeeded', 'failed', 'timed_out')),
            duration_ms INTEGER,
            started_at TEXT NOT NULL,
            ended_at TEXT)"""
    )
    db.ddl("CREATE INDEX runs_by_install ON runs (install_id, started_at)")


def _m3_governance(db: Database) -> None:
    """Secrets, budgets, the usage ledger, the audit trail, approvals, idempotency."""
    db.ddl("ALTER TABLE memberships ADD COLUMN approver INTEGER NOT NULL DEFAULT 0")
    db.ddl(
        """CREATE TABLE install_secrets (
            install_id TEXT NOT NULL REFERENCES installs(id),
            name TEXT NOT NULL,
            key_id TEXT NOT NULL,
            nonce BLOB NOT NULL,
            ciphertext BLOB NOT NULL,
            updated_at TEXT NOT NULL,
            updated_by TEXT,
            PRIMARY KEY (install_id, name))"""
    )
    db.ddl(
        """CREATE TABLE budgets (
            install_id TEXT PRIMARY KEY REFERENCES installs(id),
            monthly_ms INTEGER,
            updated_at TEXT NOT NULL,
            updated_by TEXT)"""
    )
    db.ddl(
        """CREATE TABLE budget_usage (
            install_id TEXT NOT NULL REFERENCES installs(id),
            month TEXT NOT NULL,
            used_ms INTEGER NOT NULL DEFAULT 0,
            reserved_ms INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (install_id, month))"""
    )
    for column in (
        "reserved_ms INTEGER NOT NULL DEFAULT 0",
        "month TEXT",
        "error_kind TEXT",
        "approval_id TEXT",
        "timeout_ms INTEGER",
    ):
        db.ddl(f"ALTER TABLE runs ADD COLUMN {column}")
    db.ddl(
        """CREATE TABLE ledger (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            run_id TEXT UNIQUE,
            sandbox_ms INTEGER NOT NULL,
            payer_kind TEXT NOT NULL CHECK (payer_kind IN ('workspace', 'workflow_run')),
            payer_id TEXT NOT NULL,
            workspace_id TEXT NOT NULL,
            app_id TEXT NOT NULL,
            install_id TEXT NOT NULL,
            version_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            user_id TEXT NOT NULL,
            month TEXT NOT NULL,
            created_at TEXT NOT NULL)"""
    )
    db.ddl("CREATE INDEX ledger_by_month ON ledger (month, install_id)")
    db.ddl(
        """CREATE TABLE audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            at TEXT NOT NULL,
            workspace_id TEXT,
            actor_user_id TEXT,
            actor_key_id TEXT,
            action TEXT NOT NULL,
            install_id TEXT,
            version_id TEXT,
            tool TEXT,
            surface TEXT,
            status TEXT,
            duration_ms INTEGER,
            reason TEXT,
            detail TEXT NOT NULL DEFAULT '{}',
            prev_hash TEXT NOT NULL,
            hash TEXT NOT NULL)"""
    )
    db.ddl("CREATE INDEX audit_by_workspace ON audit (workspace_id, seq)")
    db.ddl(
        """CREATE TABLE approvals (
            id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL,
            install_id TEXT NOT NULL,
            version_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            input_hash TEXT NOT NULL,
            surface TEXT NOT NULL,
            requested_by TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            decided_by TEXT,
            decided_at TEXT,
            run_id TEXT)"""
    )
    db.ddl(
        """CREATE TABLE idempotency (
            user_id TEXT NOT NULL,
            key TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            run_id TEXT,
            created_at TEXT NOT NULL,
            PRIMARY KEY (user_id, key))"""
    )
    db.ddl("CREATE INDEX idempotency_by_age ON idempotency (created_at)")
    db.ddl("CREATE INDEX approvals_due ON approvals (status, expires_at)")
    db.ddl("CREATE INDEX runs_by_tool ON runs (install_id, tool, id)")


def _m4_egress(db: Database) -> None:
    """What each version asks to reach, and what each install grants (JSON lists of
    destinations in normal form; empty: no network, as before)."""
    db.ddl("ALTER TABLE app_versions ADD COLUMN egress TEXT NOT NULL DEFAULT '[]'")
    db.ddl("ALTER TABLE installs ADD COLUMN egress TEXT NOT NULL DEFAULT '[]'")


def _m5_run_egress(db: Database) -> None:
    """What a run reached through the egress proxy: per destination, connections and
    bytes each way, or why it was refused (JSON; NULL for a run without a grant). Never a
    payload, a path or a header."""
    db.ddl("ALTER TABLE runs ADD COLUMN egress TEXT")


def _m6_sign_in(db: Database) -> None:
    """The Manage page's one-time sign-in links and browser sessions (hashes only)."""
    db.ddl(
        """CREATE TABLE login_links (
            token_hash TEXT PRIMARY KEY,
            user_id TEXT NOT NULL REFERENCES users(id),
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            used_at TEXT)"""
    )
    db.ddl(
        """CREATE TABLE web_sessions (
            id_hash TEXT PRIMARY KEY,
            id TEXT NOT NULL,
            user_id TEXT NOT NULL REFERENCES users(id),
            csrf TEXT NOT NULL,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL)"""
    )


def _m7_nodes(db: Database) -> None:
    """The nodes serving this database (one for a SQLite file; any number share a
    PostgreSQL database), each with a lease it renews, and the node of each run: when a
    node dies, another closes its runs once the lease runs out."""
    db.ddl(
        """CREATE TABLE nodes (
            id TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            version TEXT NOT NULL,
            started_at TEXT NOT NULL,
            lease_until TEXT NOT NULL,
            stopped_at TEXT)"""
    )
    db.ddl("ALTER TABLE runs ADD COLUMN node_id TEXT")
    db.ddl("CREATE INDEX runs_by_status ON runs (status, node_id)")


def _m8_session_credential(db: Database) -> None:
    """The key a browser session was signed in with (NULL for a sign-in link): the
    session dies with it. Sessions from before this migration named no key, so they
    are ended (people sign in again once)."""
    db.ddl("ALTER TABLE web_sessions ADD COLUMN key_id TEXT")
    db.execute("DELETE FROM web_sessions")
    db.ddl("CREATE INDEX web_sessions_by_key ON web_sessions (key_id)")


def _m9_sealed_approvals(db: Database) -> None:
    """A held call's input, sealed with the secrets key (AES-GCM, bound to its approval),
    and the key and workflow run it was made with: any node can release it, after a
    restart too. The sealed input is cleared when the approval is decided or expires."""
    for column in ("sealed_kid TEXT", "sealed_nonce BLOB", "sealed_input BLOB", "key_id TEXT",
                   "workflow_run_id TEXT"):  # fmt: skip
        db.ddl(f"ALTER TABLE approvals ADD COLUMN {column}")


def _m10_oauth(db: Database) -> None:
    """runnerd as an OAuth 2.1 authorization server (runnerd/api/oauth.py): its clients
    (registered, or a fetched Client ID Metadata Document), the authorization requests
    waiting for consent, the one-time codes and the refresh tokens (hashes only). An
    access token is an API key of kind token, bound to one workspace, that expires."""
    db.ddl("ALTER TABLE api_keys ADD COLUMN expires_at TEXT")
    db.ddl(
        """CREATE TABLE oauth_clients (
            client_id TEXT PRIMARY KEY,
            kind TEXT NOT NULL CHECK (kind IN ('registered', 'metadata_document')),
            info TEXT NOT NULL,
            secret_hash TEXT,
            created_at TEXT NOT NULL,
            fetched_at TEXT NOT NULL)"""
    )
    db.ddl(
        """CREATE TABLE oauth_requests (
            id_hash TEXT PRIMARY KEY,
            client_id TEXT NOT NULL,
            params TEXT NOT NULL,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL)"""
    )
    db.ddl(
        """CREATE TABLE oauth_codes (
            code_hash TEXT PRIMARY KEY,
            client_id TEXT NOT NULL,
            user_id TEXT NOT NULL REFERENCES users(id),
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            scopes TEXT NOT NULL,
            params TEXT NOT NULL,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            used_at TEXT,
            family TEXT)"""
    )
    db.ddl(
        """CREATE TABLE oauth_refresh_tokens (
            token_hash TEXT PRIMARY KEY,
            id TEXT NOT NULL,
            family TEXT NOT NULL,
            client_id TEXT NOT NULL,
            user_id TEXT NOT NULL REFERENCES users(id),
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            scopes TEXT NOT NULL,
            resource TEXT,
            access_key_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            rotated_at TEXT,
            revoked_at TEXT)"""
    )
    db.ddl("CREATE INDEX oauth_refresh_by_family ON oauth_refresh_tokens (family)")
    db.ddl("CREATE INDEX oauth_refresh_by_key ON oauth_refresh_tokens (access_key_id)")


def _m11_approval_rules(db: Database) -> None:
    """Who approves an app's write calls from a relay, per workspace and app (JSON lists
    of roles and of person ids), and each workspace's webhook for approvals that wait
    (its URL and its signing secret, sealed by the vault)."""
    db.ddl(
        """CREATE TABLE approval_rules (
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            app_id TEXT NOT NULL REFERENCES apps(id),
            roles TEXT NOT NULL DEFAULT '[]',
            user_ids TEXT NOT NULL DEFAULT '[]',
            updated_at TEXT NOT NULL,
            updated_by TEXT REFERENCES users(id),
            PRIMARY KEY (workspace_id, app_id))"""
    )
    db.ddl(
        """CREATE TABLE workspace_webhooks (
            workspace_id TEXT PRIMARY KEY REFERENCES workspaces(id),
            url TEXT NOT NULL,
            secret_kid TEXT NOT NULL,
            secret_nonce BLOB NOT NULL,
            secret_sealed BLOB NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            updated_by TEXT REFERENCES users(id))"""
    )


def _m12_idempotent_approvals(db: Database) -> None:
    """The approval an idempotency key's call was held for: a retry with the key finds
    it (or its run) instead of holding another."""
    db.ddl("ALTER TABLE idempotency ADD COLUMN approval_id TEXT")


def _m13_node_leases(db: Database) -> None:
    """Each node's own clock at its last renewal (leases are in the database's clock): an
    interrupted run is metered from its start to its node's last renewal, on one clock."""
    db.ddl("ALTER TABLE nodes ADD COLUMN renewed_at TEXT")


def _m14_node_urls(db: Database) -> None:
    """Where each node answers the others for the results it holds (govern/peers.py)."""
    db.ddl("ALTER TABLE nodes ADD COLUMN url TEXT")


def _m15_audit_chains(db: Database) -> None:
    """The audit trail as one hash chain per workspace (and one, ``host``, for entries of
    no workspace), so writers of two workspaces never wait for each other (store/audit.py):
    each entry's chain and its place in it (1, 2, 3 …). Entries written before keep their
    one whole-database chain (``chain`` NULL). On PostgreSQL, each new entry's seq comes
    from the table's own sequence, set past the entries already there."""
    db.ddl("ALTER TABLE audit ADD COLUMN chain TEXT")
    db.ddl("ALTER TABLE audit ADD COLUMN chain_seq INTEGER")
    db.ddl("CREATE UNIQUE INDEX audit_by_chain ON audit (chain, chain_seq)")
    if db.dialect == "postgresql":
        db.execute(
            "SELECT setval(pg_get_serial_sequence('audit', 'seq'), COALESCE(MAX(seq), 0) + 1, "
            "false) FROM audit"
        )


def _m16_key_surfaces(db: Database) -> None:
    """The surface a token is bound to (``relay``, ``workflow`` or ``chat``; NULL for
    every other key): its runs are recorded as that surface, whatever a body says."""
    db.ddl("ALTER TABLE api_keys ADD COLUMN surface TEXT")


def _m17_app_pages(db: Database) -> None:
    """An app version's pages (the manifest's ``pages`` folder), served on the apps
    origin: each file's path in the folder, its bytes, type and sha256 (hex, its ETag).
    Immutable, as the version is; the version row says which page a frame opens."""
    db.ddl(
        """CREATE TABLE app_pages (
            version_id TEXT NOT NULL REFERENCES app_versions(id),
            path TEXT NOT NULL,
            content BLOB NOT NULL,
            content_type TEXT NOT NULL,
            sha256 TEXT NOT NULL,
            PRIMARY KEY (version_id, path)
        )"""
    )
    db.ddl("ALTER TABLE app_versions ADD COLUMN page_entry TEXT")
    _immutable(db, "app_pages")


def _m18_git_deploys(db: Database) -> None:
    """The commit a version was deployed from, and its ref (a Git deploy; NULL for a
    folder's), and each workspace's Git deploys: per app, the repository a push webhook
    fetches, the refs it deploys and the app's folder, with its signing secret sealed by
    the vault (as the approvals webhook's)."""
    db.ddl("ALTER TABLE app_versions ADD COLUMN git_commit TEXT")
    db.ddl("ALTER TABLE app_versions ADD COLUMN git_ref TEXT")
    db.ddl(
        """CREATE TABLE git_deploys (
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            app_slug TEXT NOT NULL,
            repository TEXT NOT NULL,
            ref_pattern TEXT NOT NULL,
            path TEXT NOT NULL DEFAULT '',
            secret_kid TEXT NOT NULL,
            secret_nonce BLOB NOT NULL,
            secret_sealed BLOB NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            updated_by TEXT REFERENCES users(id),
            PRIMARY KEY (workspace_id, app_slug))"""
    )


def _m19_dev_pages(db: Database) -> None:
    """A person's dev pages of an install (``runnerd app dev``), so every node of a
    cluster serves them: per install and person, the entry page, a revision the PUTs
    count, their bytes and the last PUT's time (the database's clock: they expire by
    it); and their files, each with its bytes, type and sha256. Transient: dropped with
    the person's DELETE, after DEV_PAGES_TTL_S, or with the install, and never copied
    by ``admin copy``."""
    db.ddl(
        """CREATE TABLE dev_pages (
            install_id TEXT NOT NULL REFERENCES installs(id) ON DELETE CASCADE,
            user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
            entry TEXT NOT NULL,
            revision INTEGER NOT NULL,
            size INTEGER NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (install_id, user_id))"""
    )
    db.ddl("CREATE INDEX dev_pages_updated ON dev_pages (updated_at)")
    db.ddl(
        """CREATE TABLE dev_page_files (
            install_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            path TEXT NOT NULL,
            content BLOB NOT NULL,
            content_type TEXT NOT NULL,
            sha256 TEXT NOT NULL,
            PRIMARY KEY (install_id, user_id, path),
            FOREIGN KEY (install_id, user_id) REFERENCES dev_pages (install_id, user_id)
                ON DELETE CASCADE)"""
    )


# Append only: a migration, once released, never changes.
MIGRATIONS: list[Callable[[Database], None]] = [
    _m1_apps_and_versions,
    _m2_people_installs_runs,
    _m3_governance,
    _m4_egress,
    _m5_run_egress,
    _m6_sign_in,
    _m7_nodes,
    _m8_session_credential,
    _m9_sealed_approvals,
    _m10_oauth,
    _m11_approval_rules,
    _m12_idempotent_approvals,
    _m13_node_leases,
    _m14_node_urls,
    _m15_audit_chains,
    _m16_key_surfaces,
    _m17_app_pages,
    _m18_git_deploys,
    _m19_dev_pages,
]
