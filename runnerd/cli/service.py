"""``runnerd service install``: the systemd unit, the config file and, when asked, the
first workspace and its admin."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from runnerd.cli.output import cli_actor, output
from runnerd.govern.people import bootstrap
from runnerd.store import Store

__all__ = ["register_service"]


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
        if store.has_workspace():
            print(
                f"runnerd: {data_dir} has a workspace already; not bootstrapping", file=sys.stderr
            )
        else:
            made = bootstrap(store, args.workspace, args.bootstrap_email, actor_user_id=cli_actor())
            result.update(workspaceId=made.workspace_id, userId=made.user_id, apiKey=made.api_key)
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


def register_service(groups: Any, common: argparse.ArgumentParser) -> None:
    """Add service to the CLI's parser."""
    service = groups.add_parser("service", help="install runnerd as a systemd service")
    service_commands = service.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = service_commands.add_parser(
        "install", parents=[common], help="write the unit and /etc/runnerd/runnerd.toml"
    )
    p.add_argument("--root", help="install under this folder instead of / (packaging, tests)")
    p.add_argument("--bootstrap-email", help="also create the first workspace and its admin")
    p.add_argument("--workspace", default="Default", help="the first workspace's name")
    p.set_defaults(func=cmd_service_install)
