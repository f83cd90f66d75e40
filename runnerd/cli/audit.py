"""``runnerd ledger export`` and ``runnerd audit verify``, on the data dir. The ledger
is read as the API reads it: the same month filter, the same CSV (with its own header)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from runnerd.cli.output import settings_from_args, store_from_args
from runnerd.errors import InvalidQuery

__all__ = ["register_audit"]


def cmd_ledger_export(args: argparse.Namespace) -> int:
    from runnerd.api.ledger import ledger_csv, ledger_month

    try:
        month = ledger_month(args.month)
    except InvalidQuery as exc:
        print(f"runnerd: {exc}", file=sys.stderr)
        return 2
    store = store_from_args(args, writes=False)
    rows = store.ledger(month=month, workspace_id=args.workspace, install_id=args.install)
    if args.json or args.format == "json":  # --json, as every command takes it
        sys.stdout.write(json.dumps(rows) + "\n")
    else:
        sys.stdout.write(ledger_csv(rows, header="columns", line_end="\n"))
    return 0


def store_key_source(args: argparse.Namespace) -> str:
    """Where this command's audit key comes from, for a message."""
    settings = settings_from_args(args)
    return "of the audit_key setting" if settings.audit_key else str(settings.audit_key_path)


def cmd_audit_verify(args: argparse.Namespace) -> int:
    checkpoint = None
    if args.checkpoint:
        seq, _, digest = args.checkpoint.partition(":")
        if not seq.isdigit() or len(digest) != 64:
            print("runnerd: --checkpoint is SEQ:HASH, as `audit verify` printed it",
                  file=sys.stderr)  # fmt: skip
            return 2
        checkpoint = (int(seq), digest.lower())
    store = store_from_args(args, writes=False)
    key = store_key_source(args)
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
              f"{found.problem} (checked under the audit key {key})")  # fmt: skip
    return 0 if found.first_break is None else 1


def register_audit(common: argparse.ArgumentParser, group_parser: Callable[..., Any]) -> None:
    """Add ledger and audit to the CLI's parser."""
    ledger = group_parser("ledger", "the usage ledger (local, on the data dir)")
    p = ledger.add_parser("export", parents=[common], help="ledger rows as CSV or JSON")
    p.add_argument("--month", help="YYYY-MM")
    p.add_argument(
        "--format", choices=("csv", "json"), default="csv", help="csv (default), or json as --json"
    )
    p.add_argument("--workspace")
    p.add_argument("--install")
    p.set_defaults(func=cmd_ledger_export)

    audit = group_parser("audit", "the audit trail (local, on the data dir)")
    p = audit.add_parser(
        "verify", parents=[common], help="check every keyed hash chain; exit 1 at the first break"
    )
    p.add_argument(
        "--checkpoint",
        metavar="SEQ:HASH",
        help="a checkpoint an earlier verify printed: the entry must still be there, unchanged",
    )
    p.set_defaults(func=cmd_audit_verify)
