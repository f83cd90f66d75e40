"""``runnerd serve``: run the daemon on the settings' address until a signal stops it.

Exit status (docs/API.md, CLI): 0 stopped by a signal (after the drain of
runnerd/daemon/server.py); 1 refused to start (another daemon on the data dir, a port
taken, the store or its keys), in one line that says what to do; 2 a bad setting or
flag, or not root.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from runnerd.cli.output import NEEDS_ROOT, settings_from_args

__all__ = ["register_serve"]


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT, then drain (runnerd/daemon/server.py); 0 once
    stopped. The daemon's modules load here, not with the rest of the CLI. Whatever
    keeps it from serving is found before a listener opens: one line, never a traceback."""
    settings = settings_from_args(args, host=args.host, port=args.port)
    if os.geteuid() != 0:
        print(f"runnerd: {NEEDS_ROOT}", file=sys.stderr)
        return 2
    from runnerd.daemon.app import create_app
    from runnerd.daemon.lifespan import check_store
    from runnerd.daemon.server import serve
    from runnerd.logs import configure as configure_logs

    configure_logs(settings.log_level, settings.log_format)
    check_store(settings)  # a lock, schema or key it cannot serve with: one line, then exit
    # Checks run in threads (runnerd.checks.pool); the event loop takes the GIL back from a
    # busy one within 1 ms instead of the default 5, so requests keep their latency.
    sys.setswitchinterval(0.001)
    serve(create_app(settings), settings)
    return 0


def register_serve(groups: Any, common: argparse.ArgumentParser) -> None:
    """Add ``serve`` to the CLI's parser."""
    serve = groups.add_parser("serve", parents=[common], help="run the daemon (as root)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8686)")
    serve.set_defaults(func=cmd_serve)
