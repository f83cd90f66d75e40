"""What the CLI's command modules share: output in human or --json form, settings."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import msgspec

from runnerd.config import Settings, load_settings

__all__ = ["line_printer", "output", "settings_from_args"]


def line_printer(rows: list[Any], fmt: Callable[[Any], str], empty: str) -> Callable[[], None]:
    """A human printer of one line per row, or ``empty``."""

    def show() -> None:
        for row in rows:
            print(fmt(row))
        if not rows:
            print(empty)

    return show


def output(args: argparse.Namespace, value: Any, human: Callable[[], None]) -> int:
    if args.json:
        sys.stdout.write(msgspec.json.encode(value).decode() + "\n")
    else:
        human()
    return 0


def settings_from_args(args: argparse.Namespace, **flags: Any) -> Settings:
    return load_settings(config_file=args.config, flags={"data_dir": args.data_dir, **flags})
