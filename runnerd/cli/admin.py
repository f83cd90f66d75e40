"""Local CLI commands on the data dir: ``service install``, ``openapi``, ``admin``
(people, roles, keys, secrets key rotation), ``ledger export`` and ``audit verify``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runnerd.cli.output import output, settings_from_args
from runnerd.errors import BackupError
from runnerd.roles import ROLES, SCOPES
from runnerd.store import DB_FILENAME, Store

if TYPE_CHECKING:
    from runnerd.config import Settings

__all__ = ["register_admin"]


def cmd_service_install(args: argparse.Namespace) -> int:
    """Write the systemd unit (ExecStart: this runnerd) and /etc/runnerd/runnerd.toml;
    bootstrap the first workspace into /var/lib/runnerd when asked."""
    import shutil

    from runnerd.package_data import resource_dir

    root = Path(args.root or "/")
    entry = Path(sys.argv[0]).resolve()
    if entry.suffix == ".pyz":  # the zipapp: run by this Python
        runnerd = f"{sys.executable} {entry}"
    elif entry.name == "runnerd" and os.access(entry, os.X_OK):
        runnerd = str(entry)
    else:
        runnerd = shutil.which("runnerd") or str(entry)
    unit = (resource_dir("packaging") / "runnerd.service").read_text()
    unit = unit.replace("ExecStart=/opt/runnerd/bin/runnerd ", f"ExecStart={runnerd} ")
    unit_path = root / "etc/systemd/system/runnerd.service"
    unit_path.parent.mkdir(parents=True, exist_ok=True)
    unit_path.write_text(unit)
    unit_path.chmod(0o644)
    config = root / "etc/runnerd/runnerd.toml"
    wrote_config = not config.exists()
    if wrote_config:
        config.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        config.write_text((resource_dir("packaging") / "runnerd.toml").read_text())
        config.chmod(0o644)
    result: dict[str, Any] = {"unit": str(unit_path), "config": str(config), "execStart": runnerd}
    if args.bootstrap_email:
        data_dir = root / "var/lib/runnerd"
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        store = Store.in_data_dir(data_dir)
        if store.db.execute("SELECT count(*) FROM workspaces").fetchone()[0]:
            print(
                f"runnerd: {data_dir} has a workspace already; not bootstrapping", file=sys.stderr
            )
        else:
            workspace = store.create_workspace(args.workspace)
            user = store.ensure_user(args.bootstrap_email)
            store.set_membership(workspace.id, user.id, role="admin", apps_access=True)
            _, key = store.create_key(kind="personal", user_id=user.id, name="bootstrap",
                                      audit_workspace_id=workspace.id)  # fmt: skip
            result.update(workspaceId=workspace.id, userId=user.id, apiKey=key)
        store.close()
    return output(
        args,
        result,
        lambda: print(
            f"wrote {unit_path} (ExecStart {runnerd})"
            + (f" and {config}" if wrote_config else f"; kept {config}")
            + (
                f"\nworkspace {result['workspaceId']}, admin key {result['apiKey']} (shown once)"
                if "apiKey" in result
                else ""
            )
            + "\nnext: systemctl daemon-reload && systemctl enable --now runnerd"
        ),
    )


def cmd_openapi(args: argparse.Namespace) -> int:
    from runnerd.api.routes import api_document

    sys.stdout.write(json.dumps(api_document(), indent=2, sort_keys=True) + "\n")
    return 0


# --- admin (local) ----------------------------------------------------------------------------


def _store(args: argparse.Namespace) -> Store:
    return Store.open(settings_from_args(args))


def _workspace(store: Store, workspace_id: str) -> str:
    if store.get_workspace(workspace_id) is None:
        raise SystemExit(f"runnerd: no workspace {workspace_id}")
    return workspace_id


def cmd_bootstrap(args: argparse.Namespace) -> int:
    store = _store(args)
    workspace = store.create_workspace(args.workspace)
    user = store.ensure_user(args.email)
    store.set_membership(workspace.id, user.id, role="admin", apps_access=True)
    _, key = store.create_key(
        kind="personal", user_id=user.id, name="bootstrap", audit_workspace_id=workspace.id
    )
    sys.stdout.write(
        json.dumps({"workspaceId": workspace.id, "userId": user.id, "apiKey": key}) + "\n"
    )
    return 0


def cmd_add_person(args: argparse.Namespace) -> int:
    store = _store(args)
    ws = _workspace(store, args.workspace)
    user = store.ensure_user(args.email)
    member = store.set_membership(
        ws, user.id, role=args.role, apps_access=args.apps_access, approver=args.approver
    )
    result: dict[str, Any] = {
        "userId": user.id,
        "role": member.role,
        "appsAccess": member.apps_access,
        "approver": member.approver,
    }
    if args.key:
        _, result["apiKey"] = store.create_key(
            kind="personal", user_id=user.id, audit_workspace_id=ws
        )
    return output(
        args,
        result,
        lambda: print(
            f"{args.email}: {member.role} in {ws}, Apps "
            f"{'on' if member.apps_access else 'off'}"
            + (f"\napi key (shown once): {result['apiKey']}" if "apiKey" in result else "")
        ),
    )


def cmd_set_role(args: argparse.Namespace) -> int:
    store = _store(args)
    ws = _workspace(store, args.workspace)
    user = store.ensure_user(args.email)
    member = store.set_membership(
        ws, user.id, role=args.role, apps_access=args.apps_access, approver=args.approver
    )
    return output(
        args,
        {
            "userId": user.id,
            "role": member.role,
            "appsAccess": member.apps_access,
            "approver": member.approver,
        },
        lambda: print(f"{args.email}: {member.role}, Apps {'on' if member.apps_access else 'off'}"),
    )


def _new_key(args: argparse.Namespace, **kw: Any) -> int:
    store = _store(args)
    record, key = store.create_key(name=args.name or "", **kw)
    return output(
        args,
        {"keyId": record.id, "apiKey": key, "kind": record.kind, "scopes": list(record.scopes)},
        lambda: print(f"{record.kind} key {record.id} (shown once): {key}"),
    )


def cmd_create_key(args: argparse.Namespace) -> int:
    user = _store(args).ensure_user(args.email)
    return _new_key(args, kind="personal", user_id=user.id)


def cmd_token(args: argparse.Namespace) -> int:
    user = _store(args).ensure_user(args.email)
    return _new_key(args, kind="token", user_id=user.id, scopes=tuple(args.scope))


def cmd_workspace_key(args: argparse.Namespace) -> int:
    ws = _workspace(_store(args), args.workspace)
    return _new_key(args, kind="workspace", workspace_id=ws)


def cmd_login_link(args: argparse.Namespace) -> int:
    """A one-time sign-in link for the Manage page (good once, for 10 minutes). The token
    is in the URL's fragment, which browsers never send: no server or proxy logs it."""
    from runnerd.limits import LOGIN_LINK_TTL_S

    settings = settings_from_args(args)
    store = Store.open(settings)
    rows = list(store.db.query("SELECT id FROM users WHERE lower(email) = lower(?)", [args.email]))
    if not rows:
        print(f"runnerd: no person with the email {args.email}", file=sys.stderr)
        return 1
    token = store.create_login_link(str(rows[0]["id"]), ttl_s=LOGIN_LINK_TTL_S)
    base = args.url or f"http://{settings.host}:{settings.port}"
    link = f"{base.rstrip('/')}/login#token={token}"
    return output(
        args,
        {"url": link, "expiresInSeconds": LOGIN_LINK_TTL_S},
        lambda: print(f"{link}\n(good once, for {LOGIN_LINK_TTL_S // 60} minutes)"),
    )


def cmd_revoke_key(args: argparse.Namespace) -> int:
    done = _store(args).revoke_key(args.key_id)
    if not done:
        print(f"runnerd: no live key {args.key_id}", file=sys.stderr)
        return 1
    return output(args, {"revoked": args.key_id}, lambda: print(f"revoked {args.key_id}"))


def cmd_ledger_export(args: argparse.Namespace) -> int:
    import csv

    store = _store(args)
    rows = store.ledger(month=args.month, workspace_id=args.workspace, install_id=args.install)
    if args.format == "json":
        sys.stdout.write(json.dumps(rows) + "\n")
        return 0
    columns = [
        "id",
        "kind",
        "run_id",
        "sandbox_ms",
        "payer_kind",
        "payer_id",
        "workspace_id",
        "app_id",
        "install_id",
        "version_id",
        "tool",
        "user_id",
        "month",
        "created_at",
    ]
    writer = csv.DictWriter(sys.stdout, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return 0


def cmd_audit_verify(args: argparse.Namespace) -> int:
    checkpoint = None
    if args.checkpoint:
        seq, _, digest = args.checkpoint.partition(":")
        if not seq.isdigit() or len(digest) != 64:
            print("runnerd: --checkpoint is SEQ:HASH, as `audit verify` printed it",
                  file=sys.stderr)  # fmt: skip
            return 2
        checkpoint = (int(seq), digest.lower())
    store = _store(args)
    try:
        found = store.audit_verdict(checkpoint)
        if found.first_break is None:
            store.checkpoint_audit()
    finally:
        store.close()
    if args.json:
        sys.stdout.write(
            json.dumps(
                {
                    "entries": found.entries,
                    "firstBroken": found.first_break,
                    "problem": found.problem,
                    "head": None
                    if found.head_seq is None
                    else {"seq": found.head_seq, "hash": found.head_hash},
                }
            )
            + "\n"
        )
    elif found.first_break is None:
        print(f"audit trail intact: {found.entries} entries")
        if found.head_seq is not None:
            print(
                f"checkpoint {found.head_seq}:{found.head_hash} (keep it elsewhere; "
                "`runnerd audit verify --checkpoint` compares it later)"
            )
    else:
        print(f"audit trail BROKEN at entry {found.first_break} (of {found.entries} read): "
              f"{found.problem}")  # fmt: skip
    return 0 if found.first_break is None else 1


def _sqlite_only(settings: Settings, what: str) -> bool:
    """False (and says why) when the store is not the data dir's SQLite file."""
    if settings.database_url:
        print(
            f"runnerd: {what} works on the data dir's SQLite store; database_url names "
            "another (for PostgreSQL, use its own pg_dump and pg_restore)",
            file=sys.stderr,
        )
        return False
    return True


def cmd_migrate(args: argparse.Namespace) -> int:
    """Bring the database's schema forward: the one step that does, for a shared
    PostgreSQL database (a SQLite file is migrated when it opens)."""
    from runnerd.store import MIGRATIONS

    store = Store.open(settings_from_args(args), migrate=True)
    try:
        before, after = store.migrate_from, store.schema_version
        where = store.db.where
    finally:
        store.close()
    return output(
        args,
        {"database": where, "from": before, "to": after, "latest": len(MIGRATIONS)},
        lambda: print(
            f"{where}: schema {before} -> {after}"
            if before != after
            else f"{where}: schema {after}, up to date"
        ),
    )


def cmd_copy(args: argparse.Namespace) -> int:
    """Copy a whole store into a new database (a single node's SQLite file into a
    cluster's PostgreSQL), then verify the copy's audit chain."""
    from runnerd.store.copy import copy_store

    settings = settings_from_args(args)
    source_url = args.source or f"sqlite:///{settings.data_dir / DB_FILENAME}"
    target_url = args.target or settings.database_url
    if not target_url or target_url == source_url:
        print("runnerd: copy needs a target: --to URL, or the database_url setting",
              file=sys.stderr)  # fmt: skip
        return 2
    from runnerd.store.audit_key import audit_key_of

    # Both chained under this data dir's audit key: the copy verifies as the source did.
    key, folder = audit_key_of(settings), settings.data_dir
    source = Store(
        source_url, migrate=source_url.startswith("sqlite:"), audit_key=key, audit_dir=folder
    )
    try:
        target = Store(target_url, migrate=True, audit_key=key, audit_dir=folder)
        try:
            counts = copy_store(source, target)
            checked, broken = target.verify_audit()
            where = target.db.where
        finally:
            target.close()
    finally:
        source.close()
    if broken is not None:
        print(f"runnerd: the copy's audit chain breaks at entry {broken}", file=sys.stderr)
        return 1
    return output(
        args,
        {"to": where, "rows": counts, "auditEntries": checked},
        lambda: print(
            f"copied {sum(counts.values()):,} rows into {where} "
            f"({counts['runs']:,} runs, {counts['ledger']:,} ledger rows, "
            f"{checked:,} audit entries, chain intact)"
        ),
    )


def cmd_backup(args: argparse.Namespace) -> int:
    from runnerd.store.backup import backup

    settings = settings_from_args(args)
    if not _sqlite_only(settings, "backup"):
        return 2
    target = Path(args.to).resolve()
    try:
        size = backup(settings.data_dir, target)
    except BackupError as exc:
        print(f"runnerd: {exc}", file=sys.stderr)
        return 1
    return output(
        args,
        {"backup": str(target), "bytes": size},
        lambda: print(
            f"backed up {settings.data_dir} to {target} ({size:,} bytes); keep "
            f"{settings.secrets_key_path.name} and {settings.audit_key_path.name} apart from "
            "it, and safe: secrets need the one, `audit verify` the other"
        ),
    )


def cmd_restore(args: argparse.Namespace) -> int:
    from runnerd.store.backup import restore

    settings = settings_from_args(args)
    if not _sqlite_only(settings, "restore"):
        return 2
    try:
        kept = restore(Path(args.source).resolve(), settings.data_dir)
    except BackupError as exc:
        print(f"runnerd: {exc}", file=sys.stderr)
        return 1
    return output(
        args,
        {"restored": str(settings.data_dir), "previous": str(kept) if kept else None},
        lambda: print(
            f"restored {args.source} into {settings.data_dir}"
            + (f"; the database it replaced is {kept}" if kept else "")
        ),
    )


def cmd_rotate_key(args: argparse.Namespace) -> int:
    from runnerd.vault import Vault, new_key, write_key_file

    settings = settings_from_args(args)
    if settings.secrets_key:
        print(
            "runnerd: secrets_key is set in the config or environment; rotate it there "
            "(this command rotates the key file)",
            file=sys.stderr,
        )
        return 2
    store = _store(args)
    old = Vault.from_settings(None, settings.secrets_key_path)
    key = new_key()
    new = Vault(key)
    resealed = []
    for install_id, name, kid, nonce, ct in store.sealed_secrets():
        value = old.open(install_id, name, kid, nonce, ct)
        resealed.append((install_id, name, *new.seal(install_id, name, value)))
    # The new key is safe on disk before any row needs it; rows switch in one transaction.
    pending = settings.secrets_key_path.with_name(settings.secrets_key_path.name + ".new")
    write_key_file(pending, key)
    store.reseal_all(resealed, new.key_id)
    os.replace(pending, settings.secrets_key_path)
    return output(
        args,
        {"keyId": new.key_id, "secrets": len(resealed)},
        lambda: print(
            f"rotated the secrets key to {new.key_id}: {len(resealed)} secrets re-encrypted"
        ),
    )


# --- parser -----------------------------------------------------------------------------------


def register_admin(
    groups: Any, common: argparse.ArgumentParser, group_parser: Callable[..., Any]
) -> None:
    """Add service, openapi, admin, ledger and audit to the CLI's parser."""
    service = groups.add_parser("service", help="install runnerd as a systemd service")
    service_commands = service.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = service_commands.add_parser(
        "install", parents=[common], help="write the unit and /etc/runnerd/runnerd.toml"
    )
    p.add_argument("--root", help="install under this folder instead of / (packaging, tests)")
    p.add_argument("--bootstrap-email", help="also create the first workspace and its admin")
    p.add_argument("--workspace", default="Default", help="the first workspace's name")
    p.set_defaults(func=cmd_service_install)
    groups.add_parser("openapi", parents=[common], help="print the OpenAPI document").set_defaults(
        func=cmd_openapi
    )

    admin = group_parser("admin", "people, roles and keys (local, on the data dir)")
    boot = admin.add_parser(
        "bootstrap", parents=[common], help="create a workspace, its admin and a personal API key"
    )
    boot.add_argument("--workspace", required=True, help="the workspace's name")
    boot.add_argument("--email", required=True, help="the admin's email")
    boot.set_defaults(func=cmd_bootstrap)
    for name, fn, text in (
        ("add-person", cmd_add_person, "add a person to a workspace"),
        ("set-role", cmd_set_role, "change a role or Apps access"),
    ):
        p = admin.add_parser(name, parents=[common], help=text)
        p.add_argument("--workspace", required=True, help="workspace id")
        p.add_argument("--email", required=True)
        p.add_argument(
            "--role", choices=ROLES[::-1], default=None if name == "set-role" else "member"
        )
        p.add_argument(
            "--apps-access",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="access to the Apps module",
        )
        p.add_argument(
            "--approver",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="may approve write calls from relays",
        )
        if name == "add-person":
            p.add_argument("--key", action="store_true", help="also create a personal key")
        p.set_defaults(func=fn)
    p = admin.add_parser("create-key", parents=[common], help="a personal API key")
    p.add_argument("--email", required=True)
    p.add_argument("--name")
    p.set_defaults(func=cmd_create_key)
    p = admin.add_parser("token", parents=[common], help="a scoped token of a person")
    p.add_argument("--email", required=True)
    p.add_argument("--scope", action="append", choices=SCOPES, required=True)
    p.add_argument("--name")
    p.set_defaults(func=cmd_token)
    p = admin.add_parser(
        "workspace-key",
        parents=[common],
        help="a workspace API key (deploy and publish; never runs tools)",
    )
    p.add_argument("--workspace", required=True)
    p.add_argument("--name")
    p.set_defaults(func=cmd_workspace_key)
    p = admin.add_parser(
        "login-link", parents=[common], help="a one-time sign-in link for the Manage page"
    )
    p.add_argument("--email", required=True)
    p.add_argument("--url", help="the daemon's address as browsers reach it (default: host:port)")
    p.set_defaults(func=cmd_login_link)
    p = admin.add_parser(
        "migrate", parents=[common], help="bring the database's schema forward (the one step)"
    )
    p.set_defaults(func=cmd_migrate)
    p = admin.add_parser(
        "copy", parents=[common],
        help="copy a whole store into a new database (SQLite into PostgreSQL)",
    )  # fmt: skip
    p.add_argument("--from", dest="source", metavar="URL",
                   help="sqlite:///PATH or postgresql://… (default: the data dir's)")  # fmt: skip
    p.add_argument("--to", dest="target", metavar="URL",
                   help="an empty database (default: the database_url setting, which keeps "
                        "a password off the command line)")  # fmt: skip
    p.set_defaults(func=cmd_copy)
    p = admin.add_parser(
        "backup", parents=[common], help="a consistent copy of the store (live or not)"
    )
    p.add_argument("--to", required=True, metavar="FILE")
    p.set_defaults(func=cmd_backup)
    p = admin.add_parser(
        "restore", parents=[common], help="put a backup back (no daemon may be serving)"
    )
    p.add_argument("--from", dest="source", required=True, metavar="FILE")
    p.set_defaults(func=cmd_restore)
    p = admin.add_parser("revoke-key", parents=[common], help="revoke an API key")
    p.add_argument("key_id")
    p.set_defaults(func=cmd_revoke_key)

    p = admin.add_parser(
        "rotate-secrets-key", parents=[common], help="re-encrypt every secret under a new key file"
    )
    p.set_defaults(func=cmd_rotate_key)

    ledger = group_parser("ledger", "the usage ledger (local, on the data dir)")
    p = ledger.add_parser("export", parents=[common], help="ledger rows as CSV or JSON")
    p.add_argument("--month", help="YYYY-MM")
    p.add_argument("--format", choices=("csv", "json"), default="csv")
    p.add_argument("--workspace")
    p.add_argument("--install")
    p.set_defaults(func=cmd_ledger_export)

    audit = group_parser("audit", "the audit trail (local, on the data dir)")
    p = audit.add_parser(
        "verify", parents=[common], help="check the keyed hash chain; exit 1 at the first break"
    )
    p.add_argument(
        "--checkpoint",
        metavar="SEQ:HASH",
        help="a checkpoint an earlier verify printed: the entry must still be there, unchanged",
    )
    p.set_defaults(func=cmd_audit_verify)
