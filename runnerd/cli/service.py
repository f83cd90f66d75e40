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


# Where the unit cannot see what is there: ProtectHome=yes hides the first three,
# PrivateTmp=yes gives the service /tmp and /var/tmp of its own.
_HIDDEN_FROM_UNIT = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")
# Where `service install` puts a zipapp it found in one of those (the unit's ExecStart).
ZIPAPP_HOME = "/opt/runnerd/runnerd.pyz"


def _hidden_from_unit(path: Path, root: Path = Path("/")) -> str | None:
    """The folder of ``_HIDDEN_FROM_UNIT`` that holds ``path`` as the unit installed under
    ``root`` sees it, if one does."""
    if path.is_relative_to(root):
        path = Path("/") / path.relative_to(root)
    for hidden in _HIDDEN_FROM_UNIT:
        if path.is_relative_to(hidden):
            return hidden
    return None


def _copy_zipapp(entry: Path, root: Path) -> Path:
    """Copy the zipapp to ZIPAPP_HOME under ``root`` (atomically, 0644 in a 0755 folder,
    root's) and return where the unit finds it; never copies a file onto itself."""
    import shutil

    into = root / ZIPAPP_HOME.lstrip("/")
    if into.exists() and into.samefile(entry):
        return Path(ZIPAPP_HOME)
    into.parent.mkdir(parents=True, exist_ok=True)
    into.parent.chmod(0o755)
    partial = into.with_name(into.name + ".partial")
    shutil.copyfile(entry, partial)
    partial.chmod(0o644)
    partial.replace(into)
    return Path(ZIPAPP_HOME)


def cmd_service_install(args: argparse.Namespace) -> int:
    """Write the systemd unit (ExecStart: this runnerd) and /etc/runnerd/runnerd.toml;
    bootstrap the first workspace into /var/lib/runnerd when asked.

    The unit hides /home, /root and /run/user (ProtectHome=yes) and has a /tmp of its
    own: a zipapp there is copied to ZIPAPP_HOME first (and said so, one line on stderr);
    any other runnerd there is refused (exit 2, one line that says what to do), since a
    unit that cannot find its ExecStart fails only at `systemctl start`."""
    import shutil

    from runnerd.package_data import resource_dir

    root = Path(args.root or "/")
    entry = Path(sys.argv[0]).resolve()
    python = Path(sys.executable)
    if entry.suffix == ".pyz" and _hidden_from_unit(python):
        python = Path("/usr/bin/python3")  # the zipapp's own shebang finds this one too
    if entry.suffix == ".pyz":  # the zipapp: run by this Python
        if hidden := _hidden_from_unit(entry, root):
            entry = _copy_zipapp(entry, root)
            print(
                f"runnerd: the unit cannot see {hidden} (ProtectHome=yes, PrivateTmp=yes);"
                f" copied the zipapp to {root / ZIPAPP_HOME.lstrip('/')}, which the unit runs"
                " (run service install again from a new file to upgrade)",
                file=sys.stderr,
            )
        elif entry.is_relative_to(root):  # already under --root: name it as the unit sees it
            entry = Path("/") / entry.relative_to(root)
        runnerd = f"{python} {entry}"
    elif entry.name == "runnerd" and os.access(entry, os.X_OK):
        runnerd = str(entry)
    else:
        runnerd = shutil.which("runnerd") or str(entry)
    exe = Path(runnerd.split()[0])
    inside = args.root is not None and exe.is_relative_to(root)  # a runnerd of the --root image
    if hidden := _hidden_from_unit(Path("/") / exe.relative_to(root) if inside else exe):
        print(
            f"runnerd service install: {runnerd.split()[0]} is under {hidden}, which the unit"
            " cannot see (ProtectHome=yes, PrivateTmp=yes); install runnerd outside it"
            " (python3 -m venv /opt/runnerd && /opt/runnerd/bin/pip install runnerd) and run"
            " /opt/runnerd/bin/runnerd service install",
            file=sys.stderr,
        )
        # Refused for the unit that will run (no --root, or a runnerd inside the --root
        # image); a --root image naming a runnerd from outside it (tests) is only told.
        if args.root is None or inside:
            return 2
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
