"""The ``runnerd`` command line.

Exit codes: 0 success, 1 the thing checked or asked for was refused (problems printed),
2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from runnerd import __version__
from runnerd.bundle import Bundle, load_bundle, read_app_dir
from runnerd.config import ConfigError, Settings, load_settings
from runnerd.errors import BundleRejected, Problem
from runnerd.runtimes import find_node
from runnerd.toolchain import Toolchain, ToolchainError

__all__ = ["main"]


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        config_file=getattr(args, "config", None),
        flags={"data_dir": getattr(args, "data_dir", None)},
    )


def _toolchain(settings: Settings) -> Toolchain:
    return Toolchain(settings.toolchain_path, find_node(settings.node))


def _print_json(value: Any) -> None:
    sys.stdout.write(msgspec.json.encode(value).decode() + "\n")


def _problem_dicts(problems: Sequence[Problem]) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(p) for p in problems]


# --- app validate ---------------------------------------------------------------------------


def _tool_summary(bundle: Bundle) -> list[dict[str, Any]]:
    return [
        {
            "reference": f"{bundle.manifest.slug}/{t.name}",
            "name": t.name,
            "language": t.language,
            "effect": t.effect,
            "timeoutMs": t.timeout_ms,
            "packages": list(t.packages),
            "source": t.source_path,
        }
        for t in bundle.tools
    ]


def cmd_app_validate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    root = Path(args.dir)
    if not root.is_dir():
        print(f"runnerd: {root}: not a folder", file=sys.stderr)
        return 2
    try:
        bundle = load_bundle(read_app_dir(root), toolchain=_toolchain(settings))
    except BundleRejected as exc:
        if args.json:
            _print_json({"ok": False, "problems": _problem_dicts(exc.problems)})
        else:
            for problem in exc.problems:
                print(f"{_at(root, problem)}: {problem.message}")
            count = len(exc.problems)
            print(f"\n{count} problem{'s' if count != 1 else ''}; the app would be refused.")
        return 1
    manifest = bundle.manifest
    if args.json:
        _print_json(
            {
                "ok": True,
                "app": {"slug": manifest.slug, "name": manifest.name, "version": manifest.version},
                "tools": _tool_summary(bundle),
                "warnings": _problem_dicts(bundle.warnings),
                "contentHash": bundle.content_hash,
            }
        )
        return 0
    for warning in bundle.warnings:
        print(f"warning: {_at(root, warning)}: {warning.message}")
    version = f" version {manifest.version}" if manifest.version else ""
    count = len(bundle.tools)
    print(
        f"{manifest.slug} ({manifest.name}){version}: {count} tool{'s' if count != 1 else ''}, "
        "all checks passed"
    )
    width = max(len(t.name) for t in bundle.tools)
    for tool in bundle.tools:
        pkgs = f"  {', '.join(tool.packages)}" if tool.packages else ""
        print(
            f"  {tool.name:<{width}}  {tool.language:<10}  {tool.effect:<5}  "
            f"{tool.timeout_ms:>6} ms{pkgs}"
        )
    return 0


def _at(root: Path, problem: Problem) -> str:
    path = root / problem.file
    return f"{path}:{problem.line}" if problem.line else str(path)


# --- toolchain ------------------------------------------------------------------------------


def cmd_toolchain_install(args: argparse.Namespace) -> int:
    toolchain = _toolchain(_settings(args))
    try:
        toolchain.install()
    except ToolchainError as exc:
        print(f"runnerd: {exc}", file=sys.stderr)
        return 1
    print(f"toolchain ready in {toolchain.directory}")
    return 0


def cmd_toolchain_status(args: argparse.Namespace) -> int:
    settings = _settings(args)
    toolchain = _toolchain(settings)
    status = {
        "node": toolchain.node.path if toolchain.node else None,
        "nodeVersion": toolchain.node.version if toolchain.node else None,
        "toolchainDir": str(toolchain.directory),
        "installed": toolchain.is_installed(),
    }
    if args.json:
        _print_json(status)
    else:
        for key, value in status.items():
            print(f"{key}: {value}")
    return 0


# --- parser ---------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        type=Path,
        help="data folder (default $RUNNERD_DATA_DIR or ~/.local/share/runnerd)",
    )
    common.add_argument("--config", type=Path, help="TOML config file ($RUNNERD_CONFIG)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts")

    parser = argparse.ArgumentParser(prog="runnerd", description="Run code tools in sandboxes.")
    parser.add_argument("--version", action="version", version=f"runnerd {__version__}")
    groups = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")

    app = groups.add_parser("app", help="work with an app's tools").add_subparsers(
        dest="command", required=True, metavar="COMMAND"
    )
    validate = app.add_parser(
        "validate", parents=[common], help="check an app folder locally, with no daemon"
    )
    validate.add_argument("dir", nargs="?", default=".", help="the app folder (default .)")
    validate.set_defaults(func=cmd_app_validate)

    tc = groups.add_parser("toolchain", help="the JS/TS toolchain used at upload").add_subparsers(
        dest="command", required=True, metavar="COMMAND"
    )
    tc.add_parser(
        "install", parents=[common], help="install esbuild and the lexers with npm"
    ).set_defaults(func=cmd_toolchain_install)
    tc.add_parser("status", parents=[common], help="show Node and the toolchain").set_defaults(
        func=cmd_toolchain_status
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result: int = args.func(args)
    except ConfigError as exc:
        print(f"runnerd: {exc}", file=sys.stderr)
        return 2
    return result
