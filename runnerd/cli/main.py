"""The ``runnerd`` command line: the root parser, and ``main``.

Exit codes (docs/API.md, CLI): 0 success, 1 the thing checked or asked for was refused
(problems printed), 2 bad usage or configuration (or not root, for what needs it), 130
stopped by Ctrl-C, 141 its output was closed early (``| head``): it stops quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runnerd import __version__
from runnerd.cli import people, store_ops
from runnerd.cli.audit import register_audit
from runnerd.cli.client import register_client
from runnerd.cli.completion import register_completion
from runnerd.cli.dev import register_dev
from runnerd.cli.local import register_local
from runnerd.cli.serve import register_serve
from runnerd.cli.service import register_service
from runnerd.errors import ConfigError, DatabaseUnavailable, SandboxUnavailable, StoreUnavailable

__all__ = ["main"]

# ``runnerd admin``'s commands, in the order its help lists them (cli/people.py: people
# and keys; cli/store_ops.py: the store itself).
ADMIN_ORDER = (
    "bootstrap",
    "add-person",
    "set-role",
    "create-key",
    "token",
    "workspace-key",
    "login-link",
    "migrate",
    "copy",
    "backup",
    "restore",
    "revoke-key",
    "rotate-secrets-key",
)


# --- parser ---------------------------------------------------------------------------------

# What a usage error of a command adds, when the user likely meant another command.
_HINTS = {
    "runnerd tool": "`runnerd tool test` runs a tool from a local folder; the daemon's "
    "tools are `runnerd tools list` and `runnerd tools run REF`",
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with a hint after some usage errors (``_HINTS``)."""

    def error(self, message: str) -> Any:
        hint = _HINTS.get(self.prog)
        super().error(f"{message}\n{hint}" if hint else message)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        type=Path,
        help="data folder (default $RUNNERD_DATA_DIR or ~/.local/share/runnerd)",
    )
    common.add_argument("--config", type=Path, help="TOML config file ($RUNNERD_CONFIG)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts")

    parser: argparse.ArgumentParser = _Parser(
        prog="runnerd", description="Run code tools in sandboxes."
    )
    parser.add_argument("--version", action="version", version=f"runnerd {__version__}")
    groups = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")

    app = register_local(groups, common)

    def group_parser(name: str, text: str) -> Any:
        return groups.add_parser(name, help=text).add_subparsers(
            dest="command", required=True, metavar="COMMAND"
        )

    register_service(groups, common)
    register_serve(groups, common)
    groups.add_parser("openapi", parents=[common], help="print the OpenAPI document").set_defaults(
        func=_openapi
    )
    admin = group_parser("admin", "people, roles and keys (local, on the data dir)")
    commands = {**people.ADMIN_COMMANDS, **store_ops.ADMIN_COMMANDS}
    assert set(commands) == set(ADMIN_ORDER)
    for name in ADMIN_ORDER:
        commands[name](admin, common)
    register_audit(common, group_parser)
    register_client(groups, common, app, group_parser)
    register_dev(app, common)
    mcp = groups.add_parser(
        "mcp", parents=[common], help="a stdio MCP server for desktop agents, forwarding to /mcp"
    )
    mcp.add_argument("--url", help="the daemon ($RUNNERD_URL, default http://127.0.0.1:8686)")
    mcp.add_argument("--api-key", help="a personal API key or token ($RUNNERD_API_KEY)")
    mcp.add_argument("--workspace", help="the workspace id ($RUNNERD_WORKSPACE)")
    mcp.set_defaults(func=_mcp)
    bench = groups.add_parser(
        "bench",
        parents=[common],
        help="measure runnerd on this machine against bare nsjail and interpreters",
    )
    bench.add_argument("--quick", action="store_true", help="a short run (under 30 s)")
    bench.set_defaults(func=_bench)
    register_completion(groups, parser)
    return parser


def _bench(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print(
            "runnerd: bench needs root: it starts nsjail sandboxes that map runs to "
            "unprivileged uids (run it as root, e.g. with sudo)",
            file=sys.stderr,
        )
        return 2
    from runnerd.cli.bench import run_bench
    from runnerd.cli.output import settings_from_args

    settings = settings_from_args(args)
    say = (lambda _: None) if args.json else (lambda text: print(f"... {text}", file=sys.stderr))
    try:
        result = run_bench(settings, quick=args.quick, say=say)
    except SandboxUnavailable as exc:
        print(
            f"runnerd: bench cannot start a sandbox: {exc} (see `runnerd doctor`)", file=sys.stderr
        )
        return 1
    print(json.dumps(result.as_json(), indent=2) if args.json else result.report())
    return 0


def _openapi(args: argparse.Namespace) -> int:
    from runnerd.api.routes import api_document

    sys.stdout.write(json.dumps(api_document(), indent=2, sort_keys=True) + "\n")
    return 0


def _mcp(args: argparse.Namespace) -> int:
    from runnerd.cli.mcp_bridge import cmd_mcp  # the MCP SDK only for this command

    return cmd_mcp(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result: int = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
    except ConfigError as exc:
        print(f"runnerd: {exc}", file=sys.stderr)
        return 2
    except (StoreUnavailable, DatabaseUnavailable) as exc:
        print(f"runnerd: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `runnerd … | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere
        return 141  # as a command killed by SIGPIPE
    except KeyboardInterrupt:
        print(file=sys.stderr)  # past the ^C the terminal echoed
        return 130
    return result
