"""``runnerd admin`` for the store itself: migrate, copy, backup, restore and
rotate-secrets-key (the secrets key file)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runnerd.cli.output import cli_actor, output, settings_from_args, store_from_args
from runnerd.errors import BackupError
from runnerd.store import DB_FILENAME, Store

if TYPE_CHECKING:
    from runnerd.config import Settings

__all__ = ["ADMIN_COMMANDS"]


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


def _secrets_key_id(settings: Settings) -> str | None:
    """The id of the secrets key the settings give (secrets_key, else the key file), or
    None when there is none yet; never makes one."""
    import base64

    from runnerd.vault import key_id

    if settings.secrets_key:
        return key_id(base64.b64decode(settings.secrets_key))
    path = settings.secrets_key_path
    return key_id(base64.b64decode(path.read_text().strip())) if path.exists() else None


def cmd_restore(args: argparse.Namespace) -> int:
    """Put a backup in place; refused (1) when its secrets are sealed with a key the
    data dir does not have: the daemon could not open them, nor start."""
    from runnerd.store.backup import restore, sealed_with

    settings = settings_from_args(args)
    if not _sqlite_only(settings, "restore"):
        return 2
    source = Path(args.source).resolve()
    try:
        sealed = sealed_with(source)
        have = _secrets_key_id(settings)
        if sealed and have not in sealed:
            where = settings.secrets_key_path
            raise BackupError(
                f"{args.source}: its secrets are sealed with the secrets key "
                f"{', '.join(sorted(sealed))}, and "
                + (f"there is no {where.name} at {where}" if have is None
                   else f"this data dir's key is {have}")
                + f": put back the {where.name} kept with the backup (or set "
                "secrets_key_file to it), then restore; nothing was changed"
            )  # fmt: skip
        kept = restore(source, settings.data_dir)
    except BackupError as exc:
        print(f"runnerd: {exc}", file=sys.stderr)
        return 1
    key = settings.secrets_key_path.name
    return output(
        args,
        {"restored": str(settings.data_dir), "previous": str(kept) if kept else None},
        lambda: print(
            f"restored {args.source} into {settings.data_dir}"
            + (f"; the database it replaced is {kept}" if kept else "")
            + (f"; its secrets open with the {key} there" if sealed else "")
            + "; check its trail with `runnerd audit verify`"
        ),
    )


def cmd_rotate_key(args: argparse.Namespace) -> int:
    from runnerd.govern.approvals import sealed_name
    from runnerd.vault import Vault, new_key, write_key_file

    settings = settings_from_args(args)
    if settings.secrets_key:
        print(
            "runnerd: secrets_key is set in the config or environment; rotate it there "
            "(this command rotates the key file)",
            file=sys.stderr,
        )
        return 2
    store = store_from_args(args)
    old = Vault.from_settings(None, settings.secrets_key_path)
    key = new_key()
    new = Vault(key)
    resealed = []
    for install_id, name, kid, nonce, ct in store.sealed_secrets():
        value = old.open(install_id, name, kid, nonce, ct)
        resealed.append((install_id, name, *new.seal(install_id, name, value)))
    held = []  # the inputs of calls waiting for approval, sealed with the same key
    for approval_id, install_id, kid, nonce, ct in store.sealed_approvals():
        named = sealed_name(approval_id)
        value = old.open(install_id, named, kid, nonce, ct)
        held.append((approval_id, install_id, *new.seal(install_id, named, value)))
    hooks = []  # the webhooks' signing secrets
    for workspace_id, named, kid, nonce, ct in store.sealed_webhooks():
        value = old.open(workspace_id, named, kid, nonce, ct)
        hooks.append((workspace_id, *new.seal(workspace_id, named, value)))
    gits = []  # the Git deploys' signing secrets
    for workspace_id, slug, named, kid, nonce, ct in store.sealed_git_deploys():
        value = old.open(workspace_id, named, kid, nonce, ct)
        gits.append((workspace_id, slug, *new.seal(workspace_id, named, value)))
    # The new key is safe on disk before any row needs it; rows switch in one transaction.
    pending = settings.secrets_key_path.with_name(settings.secrets_key_path.name + ".new")
    write_key_file(pending, key)
    store.reseal_all(
        resealed, new.key_id, held, actor_user_id=cli_actor(), webhooks=hooks, git_deploys=gits
    )
    os.replace(pending, settings.secrets_key_path)
    return output(
        args,
        {"keyId": new.key_id, "secrets": len(resealed)},
        lambda: print(
            f"rotated the secrets key to {new.key_id}: {len(resealed)} secrets re-encrypted"
        ),
    )


# --- parser -----------------------------------------------------------------------------------


def _add_migrate(admin: Any, common: argparse.ArgumentParser) -> None:
    p = admin.add_parser(
        "migrate", parents=[common], help="bring the database's schema forward (the one step)"
    )
    p.set_defaults(func=cmd_migrate)


def _add_copy(admin: Any, common: argparse.ArgumentParser) -> None:
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


def _add_backup(admin: Any, common: argparse.ArgumentParser) -> None:
    p = admin.add_parser(
        "backup", parents=[common], help="a consistent copy of the store (live or not)"
    )
    p.add_argument("--to", required=True, metavar="FILE")
    p.set_defaults(func=cmd_backup)


def _add_restore(admin: Any, common: argparse.ArgumentParser) -> None:
    p = admin.add_parser(
        "restore", parents=[common], help="put a backup back (no daemon may be serving)"
    )
    p.add_argument("--from", dest="source", required=True, metavar="FILE")
    p.set_defaults(func=cmd_restore)


def _add_rotate_secrets_key(admin: Any, common: argparse.ArgumentParser) -> None:
    p = admin.add_parser(
        "rotate-secrets-key", parents=[common], help="re-encrypt every secret under a new key file"
    )
    p.set_defaults(func=cmd_rotate_key)


# Each ``runnerd admin`` command on the store, by name, and what adds its parser
# (cli/main.py adds them in the order the group's help lists them).
ADMIN_COMMANDS: dict[str, Callable[[Any, argparse.ArgumentParser], None]] = {
    "migrate": _add_migrate,
    "copy": _add_copy,
    "backup": _add_backup,
    "restore": _add_restore,
    "rotate-secrets-key": _add_rotate_secrets_key,
}
