"""What the CLI's command modules share: output in human or --json form, settings and
the store they name."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pwd
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from runnerd.checks.nesting import nesting_over
from runnerd.config import Settings, load_settings
from runnerd.errors import InvalidInput
from runnerd.limits import MAX_JSON_DEPTH

if TYPE_CHECKING:
    from runnerd.store import Store

__all__ = [
    "NEEDS_ROOT",
    "cli_actor",
    "egress_lines",
    "line_printer",
    "output",
    "printable",
    "problem_line",
    "read_input",
    "settings_from_args",
    "store_from_args",
]


# What serve, doctor and the quickstart say, in one line, when they are not run as root.
NEEDS_ROOT = (
    "runnerd serve needs root: each run is mapped to a uid of its own (sandbox_uid_base "
    "and up), which only root may do; run it as root (sudo), or install the systemd "
    "service (`sudo runnerd service install`)"
)


def cli_actor() -> str:
    """Who an action taken from the host's CLI (``runnerd admin …``, on the data dir) is
    filed under in the audit trail, as its ``actorUserId``: ``cli:`` and the Unix user
    running the command (its uid when the user has no name). No key acts: its
    ``actorKeyId`` is null."""
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return f"cli:{name}"


# Characters a terminal acts on instead of showing: C0 controls but newline and tab, DEL,
# C1 controls (ESC's 8-bit twins), and the invisible format characters that reorder or
# hide text (bidi overrides and isolates, zero-width marks).
_CONTROL = {
    c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
    for c in [
        *range(0x00, 0x20),
        *range(0x7F, 0xA0),
        *range(0x200B, 0x2010),
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
        0xFEFF,
    ]
    if c not in (0x0A, 0x09)
}


def printable(text: str) -> str:
    """``text`` safe to print to a terminal: what a tool wrote (logs, errors, output) or
    a file held can carry escape sequences; they are shown escaped (``\\x1b``), never
    sent. JSON output needs none of this: its encoder escapes them already."""
    return text.translate(_CONTROL)


def problem_line(file: str, line: int | None, message: str) -> str:
    """One problem as every command prints it, whether the CLI or the daemon found it:
    the file relative to the app folder (as the API's ``problems`` name it), its line
    when it has one, the message."""
    return f"{file}:{line}: {message}" if line else f"{file}: {message}"


def line_printer(rows: list[Any], fmt: Callable[[Any], str], empty: str) -> Callable[[], None]:
    """A human printer of one line per row, or ``empty``."""

    def show() -> None:
        for row in rows:
            print(fmt(row))
        if not rows:
            print(empty)

    return show


def output(args: argparse.Namespace, value: Any, human: Callable[[], None]) -> int:
    """``value`` as JSON with --json; else what ``human`` prints, made printable (it
    shows what tools and files said)."""
    if args.json:
        sys.stdout.write(msgspec.json.encode(value).decode() + "\n")
    else:
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            human()
        sys.stdout.write(printable(shown.getvalue()))
    return 0


def read_input(text: str) -> Any:
    """An --input value (JSON text, @FILE or - for stdin) decoded; InputRejected when it
    nests past the limit (checked before decoding, which recurses), ValueError when it
    is not JSON."""
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        text = Path(text[1:]).read_text()
    if nesting_over(text, MAX_JSON_DEPTH) is not None:
        raise InvalidInput(f"input is nested deeper than {MAX_JSON_DEPTH} levels, the limit")
    return json.loads(text)


def settings_from_args(args: argparse.Namespace, **flags: Any) -> Settings:
    return load_settings(config_file=args.config, flags={"data_dir": args.data_dir, **flags})


def store_from_args(args: argparse.Namespace, *, writes: bool = True, new: bool = False) -> Store:
    """The store the settings name: the data dir's SQLite file, or database_url's.
    Exits with what to fix when there is none there (a data dir with no store is not
    made one), and, for a command that ``writes`` (an audit entry, at least), when the
    trail's newest entry does not verify under the audit key this CLI has: its entries
    would break the chain for good. ``new``: the command makes the store (bootstrap)."""
    from runnerd.store import DB_FILENAME, Store

    settings = settings_from_args(args)
    if not new and not settings.database_url and not (settings.data_dir / DB_FILENAME).exists():
        raise SystemExit(
            f"runnerd: no runnerd store in {settings.data_dir}: give the daemon's data dir "
            "(--data-dir), or its settings (--config, RUNNERD_CONFIG) naming database_url"
        )
    store = Store.open(settings)
    if writes and not store.audit_key_matches():
        store.close()
        key = "the audit_key setting" if settings.audit_key else str(settings.audit_key_path)
        raise SystemExit(
            f"runnerd: the audit trail's newest entry does not verify under this command's "
            f"audit key ({key}): what it wrote would break the chain. Give it the nodes' "
            "key (audit_key or audit_key_file in its settings, or --data-dir of a node); "
            "`runnerd audit verify` says where the trail breaks"
        )
    return store


def egress_lines(figures: list[dict[str, Any]]) -> list[str]:
    """A run's egress figures as lines for people."""
    lines = []
    for use in figures:
        if use.get("refused"):
            lines.append(f"egress: {use['destination']} refused ({use['refused']})")
        else:
            lines.append(
                f"egress: {use['destination']} {use['connections']} connection(s), "
                f"{use['bytesSent']:,} B sent, {use['bytesReceived']:,} B received"
            )
    return lines
