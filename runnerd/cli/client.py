"""CLI commands that talk to a running daemon over its HTTP API: ``app deploy|publish|
install|switch|rollback|list|secrets|budget``, ``tools list|run``, ``approvals``,
``runs``. They read RUNNERD_URL, RUNNERD_API_KEY and RUNNERD_WORKSPACE (or flags)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from ruamel.yaml.error import YAMLError

from runnerd.cli.http import ApiClient
from runnerd.cli.output import (
    egress_lines,
    line_printer,
    output,
    printable,
    problem_line,
    read_input,
)
from runnerd.errors import ApiFailure, BundleRejected, GitSourceInvalid, InputRejected
from runnerd.limits import MANIFEST_NAME
from runnerd.model import Surface
from runnerd.upload.git import read_git_app
from runnerd.upload.walk import read_app_dir, read_manifest
from runnerd.upload.yamlfile import load_yaml

__all__ = ["register_client"]


# --- client commands --------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> ApiClient:
    url = args.url or os.environ.get("RUNNERD_URL") or "http://127.0.0.1:8686"
    key = args.api_key or os.environ.get("RUNNERD_API_KEY")
    return ApiClient(url, key)


def _workspace_arg(args: argparse.Namespace) -> str:
    ws = args.workspace or os.environ.get("RUNNERD_WORKSPACE")
    if not ws:
        raise SystemExit("runnerd: no workspace: pass --workspace or set RUNNERD_WORKSPACE")
    return ws


def _slug(args: argparse.Namespace) -> str:
    if args.app:
        return str(args.app)
    manifest = Path(args.dir) / MANIFEST_NAME
    if not manifest.is_file():
        raise SystemExit(f"runnerd: pass --app SLUG, or run in an app folder ({manifest})")
    try:
        doc = load_yaml((read_manifest(Path(args.dir)) or b"").decode())
        return str(doc["slug"])
    except (BundleRejected, YAMLError, UnicodeDecodeError, KeyError, TypeError):
        raise SystemExit(
            f"runnerd: {manifest} names no slug (check it with runnerd app validate), "
            "or pass --app SLUG"
        ) from None


def _failure(args: argparse.Namespace, exc: ApiFailure) -> int:
    if args.json:
        sys.stdout.write(
            json.dumps(
                {
                    "error": {
                        "status": exc.status,
                        "code": exc.code,
                        "message": str(exc),
                        "details": exc.details,
                    }
                }
            )
            + "\n"
        )
        return 1
    problems = exc.details.get("problems") or []
    # A refusal listing problems reads as the CLI's own checks print them (no envelope
    # code: the problems say it); any other failure names its code and reason.
    lines = [f"runnerd: {exc}" if problems else f"runnerd: {exc.code}: {exc}"]
    for problem in problems:
        if isinstance(problem, dict):  # a bundle's: {file, line?, message}
            where = str(problem.get("file") or problem.get("pointer") or "")
            lines.append(problem_line(where, problem.get("line"), str(problem.get("message", ""))))
    reason = exc.details.get("code")
    if reason and not problems:
        lines.append(f"  ({reason})")
    print(printable("\n".join(lines)), file=sys.stderr)
    return 1


def _client_command(
    fn: Callable[[argparse.Namespace, ApiClient], int],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args, _client(args))
        except ApiFailure as exc:
            return _failure(args, exc)

    return run


def _read_git(args: argparse.Namespace) -> tuple[dict[str, Any], str] | int:
    """The deploy body of ``--git`` (the files of the commit, its commit and ref) and where
    the problems' files are, or the exit code after saying why not."""
    if args.dir is not None:
        print("runnerd: pass DIR or --git, not both (--path names the folder)", file=sys.stderr)
        return 2
    try:
        got = read_git_app(args.git, ref=args.ref, path=args.path)
    except GitSourceInvalid as exc:
        flag = {"repository": "--git", "ref": "--ref", "path": "--path"}[exc.field]
        print(printable(f"runnerd: {flag}: {exc}"), file=sys.stderr)
        return 2
    body: dict[str, Any] = {
        "files": {p: base64.b64encode(d).decode() for p, d in got.files.items()},
        "commit": got.commit,
    }
    if got.ref:
        body["ref"] = got.ref
    return body, f"{got.commit[:12]}:{(args.path or '').strip('/') or '.'}"


def cmd_deploy(args: argparse.Namespace, client: ApiClient) -> int:
    if args.git is None and (args.ref is not None or args.path is not None):
        print("runnerd: --ref and --path go with --git", file=sys.stderr)
        return 2
    root = Path(args.dir or ".")
    try:
        if args.git is not None:
            read = _read_git(args)
            if isinstance(read, int):
                return read
            body = read[0]
        else:
            files = read_app_dir(root)
            if MANIFEST_NAME not in files:
                print(f"runnerd: no {MANIFEST_NAME} in {root}", file=sys.stderr)
                return 2
            body = {"files": {p: base64.b64encode(d).decode() for p, d in files.items()}}
    except BundleRejected as exc:
        lines = [f"runnerd: {exc}"]
        lines += [problem_line(p.file, p.line, p.message) for p in exc.problems]
        print(printable("\n".join(lines)), file=sys.stderr)
        return 1
    result = client.call(
        "POST", "/api/v2/apps/deploy", query={"workspaceId": _workspace_arg(args)}, body=body
    )
    v = result["version"]

    def human() -> None:
        for w in result["warnings"]:
            print(f"warning: {w['file']}: {w['message']}")
        print(
            f"deployed {v['appSlug']} version {v['version']} ({v['versionId']}): "
            f"{len(v['tools'])} tool{'s' if len(v['tools']) != 1 else ''}: {', '.join(v['tools'])}"
        )
        if result.get("pages"):
            count = result["pages"]
            print(f"pages: {count} file{'s' if count != 1 else ''}")
        if v.get("commit"):
            print(f"from commit {v['commit']}" + (f" ({v['ref']})" if v.get("ref") else ""))

    return output(args, result, human)


def _print_git(g: dict[str, Any]) -> None:
    path = f" folder {g['path']}" if g["path"] else ""
    print(f"{g['appSlug']}: {g['repository']} {g['ref']}{path}")
    print(f"  webhook: POST {g['webhookUrl']}")


def cmd_git_set(args: argparse.Namespace, client: ApiClient) -> int:
    ws = _workspace_arg(args)
    body = {"repository": args.repository, "ref": args.ref, "path": args.path,
            "newSecret": args.new_secret}  # fmt: skip
    result = client.call("PUT", f"/api/v2/workspaces/{ws}/git-deploys/{_slug(args)}", body=body)

    def human() -> None:
        _print_git(result)
        if result.get("secret"):
            print(f"  secret (shown once; the webhook's HMAC-SHA256 key): {result['secret']}")

    return output(args, result, human)


def cmd_git_list(args: argparse.Namespace, client: ApiClient) -> int:
    result = client.call("GET", f"/api/v2/workspaces/{_workspace_arg(args)}/git-deploys")

    def human() -> None:
        for g in result["data"]:
            _print_git(g)

    return output(args, result, human)


def cmd_git_delete(args: argparse.Namespace, client: ApiClient) -> int:
    ws = _workspace_arg(args)
    result = client.call("DELETE", f"/api/v2/workspaces/{ws}/git-deploys/{_slug(args)}")
    return output(args, result, lambda: print("removed the Git deploy"))


def cmd_publish(args: argparse.Namespace, client: ApiClient) -> int:
    slug = _slug(args)
    result = client.call(
        "POST",
        f"/api/v2/apps/{slug}/versions/{args.version}/publish",
        query={"workspaceId": _workspace_arg(args)},
    )
    return output(
        args,
        result,
        lambda: print(f"published {slug} version {args.version} at {result['publishedAt']}"),
    )


def _print_install(i: dict[str, Any], verb: str) -> None:
    print(f"{verb} {i['appSlug']} version {i['version']}: install {i['installId']}")
    granted = i.get("egress") or []
    print(f"egress granted: {', '.join(granted)}" if granted else "egress granted: none")


def _print_egress(grant: dict[str, Any]) -> None:
    print(f"requested by the version: {', '.join(grant['requested']) or 'none'}")
    print(f"granted to the install:   {', '.join(grant['granted']) or 'none'}")


def cmd_egress_show(args: argparse.Namespace, client: ApiClient) -> int:
    grant = client.call("GET", f"/api/v2/apps/installs/{_install_id(args, client)}/egress")
    return output(args, grant, lambda: _print_egress(grant))


def cmd_egress_set(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    grant = client.call(
        "PUT", f"/api/v2/apps/installs/{install_id}/egress", body={"egress": args.destination}
    )
    return output(args, grant, lambda: _print_egress(grant))


def cmd_install(args: argparse.Namespace, client: ApiClient) -> int:
    result = client.call(
        "POST",
        "/api/v2/apps/installs",
        query={"workspaceId": _workspace_arg(args)},
        body={"appSlug": _slug(args), "version": args.version},
    )
    return output(args, result, lambda: _print_install(result, "installed"))


def _install_id(args: argparse.Namespace, client: ApiClient) -> str:
    if args.install:
        return str(args.install)
    slug = _slug(args)
    installs = client.call(
        "GET", "/api/v2/apps/installs", query={"workspaceId": _workspace_arg(args)}
    )["data"]
    for install in installs:
        if install["appSlug"] == slug:
            return str(install["installId"])
    raise SystemExit(f"runnerd: the workspace has no install of {slug}")


def cmd_switch(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    result = client.call(
        "POST", f"/api/v2/apps/installs/{install_id}/switch", body={"version": args.version}
    )
    return output(args, result, lambda: _print_install(result, "switched"))


def cmd_rollback(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    result = client.call("POST", f"/api/v2/apps/installs/{install_id}/rollback")
    return output(args, result, lambda: _print_install(result, "rolled back"))


def cmd_app_list(args: argparse.Namespace, client: ApiClient) -> int:
    result = client.call("GET", "/api/v2/apps", query={"workspaceId": _workspace_arg(args)})

    def human() -> None:
        for app in result["data"]:
            print(f"{app['appSlug']} ({app['name']})")
            for v in app["versions"]:
                state = "published" if v["publishedAt"] else "draft"
                git = f"  @{v['commit'][:12]}" if v.get("commit") else ""
                print(
                    f"  {v['version']:<12} {state:<9} {v['createdAt']}  "
                    f"{', '.join(v['tools'])}{git}"
                )

    return output(args, result, human)


def cmd_tools_list(args: argparse.Namespace, client: ApiClient) -> int:
    result = client.call(
        "GET",
        "/api/v2/apps/tools",
        query={"workspaceId": _workspace_arg(args), "installId": args.install},
    )

    def human() -> None:
        if not result["data"]:
            print("no tools: install an app first")
        for t in result["data"]:
            print(
                f"{t['reference']:<40} {t['language']:<10} {t['effect']:<5} "
                f"{t['timeoutMs']:>6} ms  v{t['version']}"
            )

    return output(args, result, human)


def cmd_tools_types(args: argparse.Namespace, client: ApiClient) -> int:
    """Type definitions of the installed tools' inputs and outputs, for the SDKs."""
    from runnerd.sdk.types import python_types, typescript_types

    result = client.call("GET", "/api/v2/apps/tools", query={"workspaceId": _workspace_arg(args)})
    tools = [t for t in result["data"] if args.app is None or t["appSlug"] == args.app]
    if not tools:
        print(
            "runnerd: no installed tools" + (f" of {args.app}" if args.app else ""), file=sys.stderr
        )
        return 1
    generate = typescript_types if args.lang == "ts" else python_types
    sys.stdout.write(generate(tools, bare_names=args.app is not None))
    return 0


def cmd_tools_run(args: argparse.Namespace, client: ApiClient) -> int:
    slug, sep, tool = args.reference.partition("/")
    if not sep or not slug or not tool:
        print("runnerd: REF is app-slug/tool_name, such as deal-desk/score_offer", file=sys.stderr)
        return 2
    try:
        value = read_input(args.input)
    except InputRejected as exc:
        print(f"refused ({exc.code}): {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"runnerd: --input is not JSON: {exc}", file=sys.stderr)
        return 2
    result = client.call(
        "POST",
        f"/api/v2/apps/tools/{slug}/{tool}/run",
        query={"workspaceId": _workspace_arg(args)},
        body={"input": value, **({"surface": args.surface} if args.surface else {})},
    )

    if result.get("status") == "pending_approval":
        return output(
            args,
            result,
            lambda: print(
                f"waiting for approval {result['approvalId']} (until {result['expiresAt']}): "
                f"runnerd approvals approve {result['approvalId']}"
            ),
        )

    def human() -> None:
        print(f"{result['status']} in {result['durationMs']} ms (run {result['runId']})")
        if result["output"] is not None:
            print(json.dumps(result["output"], indent=2, ensure_ascii=False))
        if result["error"]:
            print(f"error: {result['error']}")

    output(args, result, human)
    return 0 if result["status"] == "succeeded" else 1


# --- governance -------------------------------------------------------------------------------


def _read_secret_value(name: str) -> str:
    """The value from stdin when piped, else a hidden prompt: never from argv."""
    if not sys.stdin.isatty():
        value = sys.stdin.read()
        return value[:-1] if value.endswith("\n") else value
    import getpass

    return getpass.getpass(f"value of {name} (hidden): ")


def cmd_secret_set(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    value = _read_secret_value(args.name)
    result = client.call(
        "PUT", f"/api/v2/apps/installs/{install_id}/secrets/{args.name}", body={"value": value}
    )
    return output(args, result, lambda: print(f"set {args.name} at {result['updatedAt']}"))


def cmd_secret_list(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    result = client.call("GET", f"/api/v2/apps/installs/{install_id}/secrets")
    return output(
        args,
        result,
        line_printer(
            result["data"], lambda x: f"{x['name']:<32} updated {x['updatedAt']}", "no secrets"
        ),
    )


def cmd_secret_delete(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    result = client.call("DELETE", f"/api/v2/apps/installs/{install_id}/secrets/{args.name}")
    return output(args, result, lambda: print(f"deleted {args.name}"))


def _print_budget(b: dict[str, Any]) -> None:
    limit = "unlimited" if b["monthlyMs"] is None else f"{b['monthlyMs']:,} ms"
    print(
        f"budget {limit}; {b['month']}: used {b['usedMs']:,} ms, reserved "
        f"{b['reservedMs']:,} ms; resets at {b['resetsAt']}"
    )


def cmd_budget_show(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    result = client.call("GET", f"/api/v2/apps/installs/{install_id}/budget")
    return output(args, result, lambda: _print_budget(result))


def cmd_budget_set(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    monthly = None if args.unlimited else args.ms
    result = client.call(
        "PUT", f"/api/v2/apps/installs/{install_id}/budget", body={"monthlyMs": monthly}
    )
    return output(args, result, lambda: _print_budget(result))


def cmd_approvals_list(args: argparse.Namespace, client: ApiClient) -> int:
    result = client.call(
        "GET",
        "/api/v2/approvals",
        query={"workspaceId": _workspace_arg(args), "status": args.status},
    )

    def line(a: dict[str, Any]) -> str:
        return (
            f"{a['approvalId']}  {a['status']:<8} {a['tool']:<24} from {a['surface']:<5} "
            f"by {a['requestedBy']}  expires {a['expiresAt']}"
        )

    return output(args, result, line_printer(result["data"], line, "no approvals"))


def _decide(args: argparse.Namespace, client: ApiClient, verb: str) -> int:
    result = client.call("POST", f"/api/v2/approvals/{args.approval_id}/{verb}")
    run = f"; run {result['runId']}" if result.get("runId") else ""
    return output(args, result, lambda: print(f"{result['status']} {args.approval_id}{run}"))


def cmd_approve(args: argparse.Namespace, client: ApiClient) -> int:
    return _decide(args, client, "approve")


def cmd_deny(args: argparse.Namespace, client: ApiClient) -> int:
    return _decide(args, client, "deny")


def cmd_runs_list(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    result = client.call(
        "GET",
        f"/api/v2/apps/installs/{install_id}/runs",
        query={
            "tool": args.tool,
            "status": args.status,
            "surface": args.surface,
            "limit": str(args.limit),
        },
    )

    def line(r: dict[str, Any]) -> str:
        return (
            f"{r['runId']}  {r['startedAt']}  {r['tool']:<24} v{r['version']:<8} "
            f"{r['status']:<10} {r['durationMs'] or 0:>6} ms  {r['surface']:<8} "
            f"{r['userEmail']}"
        ) + "".join(f"\n    {e}" for e in egress_lines(r.get("egress") or []))

    return output(args, result, line_printer(result["data"], line, "no runs"))


def cmd_runs_get(args: argparse.Namespace, client: ApiClient) -> int:
    result = client.call("GET", f"/api/v2/runs/{args.run_id}")

    def human() -> None:
        r = result["run"]
        print(f"{r['runId']}: {r['status']} in {r['durationMs']} ms ({r['tool']})")
        for use in egress_lines(r.get("egress") or []):
            print(printable(use))
        if result["outputAvailable"]:
            print(json.dumps(result["output"], indent=2, ensure_ascii=False))
            if result["error"]:
                print(f"error: {result['error']}")

    return output(args, result, human)


# --- parser -----------------------------------------------------------------------------------


def register_client(
    groups: Any, common: argparse.ArgumentParser, app: Any, group_parser: Callable[..., Any]
) -> None:
    """Add the client commands to the CLI's parser."""
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", help="the daemon ($RUNNERD_URL, default http://127.0.0.1:8686)")
    client.add_argument("--api-key", help="API key ($RUNNERD_API_KEY)")
    client.add_argument("--workspace", help="workspace id ($RUNNERD_WORKSPACE)")

    def with_app(p: argparse.ArgumentParser) -> None:
        p.add_argument("--app", help="app slug (default: the manifest in DIR)")
        p.add_argument("--dir", default=".", help="app folder (default .)")

    p = app.add_parser("deploy", parents=[common, client], help="upload the app as a new version")
    p.add_argument("dir", nargs="?", default=None, help="the app folder (default .)")
    p.add_argument(
        "--git",
        metavar="URL-or-path",
        help="deploy the app folder of a commit of this repository (never a working tree's "
        "uncommitted changes)",
    )
    p.add_argument("--ref", help="with --git: a branch, tag or commit (default: HEAD)")
    p.add_argument("--path", help="with --git: the app's folder in the repository (default: root)")
    p.set_defaults(func=_client_command(cmd_deploy))
    git = app.add_parser(
        "git", help="the app's Git deploy: the repository a push webhook deploys from"
    ).add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    p = git.add_parser(
        "set",
        parents=[common, client],
        help="set the repository, refs and folder a push deploys (admins); prints a new "
        "signing secret once",
    )
    with_app(p)
    p.add_argument(
        "--repository",
        required=True,
        help="http(s):// or git:// URL; a local path or file:// only when the daemon has "
        "git_deploy_allow_local = true (RUNNERD_GIT_DEPLOY_ALLOW_LOCAL=1)",
    )
    p.add_argument("--ref", default="refs/heads/main", help="refs to deploy (refs/heads/main)")
    p.add_argument("--path", default="", help="the app's folder in the repository")
    p.add_argument("--new-secret", action="store_true", help="make a new signing secret")
    p.set_defaults(func=_client_command(cmd_git_set))
    p = git.add_parser("list", parents=[common, client], help="the workspace's Git deploys")
    p.set_defaults(func=_client_command(cmd_git_list))
    p = git.add_parser("delete", parents=[common, client], help="remove the app's Git deploy")
    with_app(p)
    p.set_defaults(func=_client_command(cmd_git_delete))
    p = app.add_parser("publish", parents=[common, client], help="publish a version")
    with_app(p)
    p.add_argument("--version", required=True)
    p.set_defaults(func=_client_command(cmd_publish))
    p = app.add_parser(
        "install", parents=[common, client], help="install a published version into the workspace"
    )
    with_app(p)
    p.add_argument("--version", required=True)
    p.set_defaults(func=_client_command(cmd_install))
    p = app.add_parser(
        "switch", parents=[common, client], help="switch the install to another published version"
    )
    with_app(p)
    p.add_argument("--install")
    p.add_argument("--version", required=True)
    p.set_defaults(func=_client_command(cmd_switch))
    p = app.add_parser(
        "rollback", parents=[common, client], help="roll the install back to its previous version"
    )
    with_app(p)
    p.add_argument("--install")
    p.set_defaults(func=_client_command(cmd_rollback))
    p = app.add_parser("list", parents=[common, client], help="apps and their versions")
    p.set_defaults(func=_client_command(cmd_app_list))

    tools = group_parser("tools", "the tools of the workspace's installs")
    p = tools.add_parser("list", parents=[common, client], help="list the tools you may run")
    p.add_argument("--install")
    p.set_defaults(func=_client_command(cmd_tools_list))
    p = tools.add_parser("run", parents=[common, client], help="run a tool by its reference")
    p.add_argument("reference", metavar="REF", help="app-slug/tool_name")
    p.add_argument(
        "--input",
        required=True,
        metavar="JSON",
        help="the tool's input, as its input schema asks: JSON text, @FILE, or - for stdin",
    )
    p.add_argument(
        "--surface",
        choices=get_args(Surface),
        help="the surface to claim; it must be the one the key proves (default: none "
        "claimed, the run is recorded as the key proves: api for a personal key, a "
        "token's bound surface)",
    )
    p.set_defaults(func=_client_command(cmd_tools_run))
    p = tools.add_parser(
        "types",
        parents=[common, client],
        help="type definitions of the installed tools' inputs and outputs, for the SDKs",
    )
    p.add_argument("--lang", choices=("ts", "py"), required=True)
    p.add_argument("--app", help="one app only (its tools also by bare name)")
    p.set_defaults(func=_client_command(cmd_tools_types))

    def install_args(p: argparse.ArgumentParser) -> None:
        with_app(p)
        p.add_argument("--install", help="install id (default: the workspace's install of the app)")

    secrets = app.add_parser("secrets", help="secrets of the app's install").add_subparsers(
        dest="subcommand", required=True, metavar="COMMAND"
    )
    p = secrets.add_parser(
        "set",
        parents=[common, client],
        help="set a secret; the value is read from stdin or a hidden prompt",
    )
    install_args(p)
    p.add_argument("name")
    p.set_defaults(func=_client_command(cmd_secret_set))
    p = secrets.add_parser("list", parents=[common, client], help="secret names")
    install_args(p)
    p.set_defaults(func=_client_command(cmd_secret_list))
    p = secrets.add_parser("delete", parents=[common, client], help="delete a secret")
    install_args(p)
    p.add_argument("name")
    p.set_defaults(func=_client_command(cmd_secret_delete))

    egress = app.add_parser(
        "egress", help="what the app's install may reach on the network"
    ).add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    p = egress.add_parser(
        "show", parents=[common, client], help="the destinations requested and granted"
    )
    install_args(p)
    p.set_defaults(func=_client_command(cmd_egress_show))
    p = egress.add_parser(
        "set",
        parents=[common, client],
        help="narrow the grant to these destinations (none: no network); never beyond what "
        "the installed version asks for",
    )
    install_args(p)
    p.add_argument("destination", nargs="*", help="such as api.stripe.com or *.slack.com:443")
    p.set_defaults(func=_client_command(cmd_egress_set))

    budget = app.add_parser("budget", help="monthly budget of the app's install").add_subparsers(
        dest="subcommand", required=True, metavar="COMMAND"
    )
    p = budget.add_parser("show", parents=[common, client], help="the budget and this month")
    install_args(p)
    p.set_defaults(func=_client_command(cmd_budget_show))
    p = budget.add_parser("set", parents=[common, client], help="set the monthly budget")
    install_args(p)
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument("--ms", type=int, help="milliseconds of sandbox time a month")
    amount.add_argument("--unlimited", action="store_true")
    p.set_defaults(func=_client_command(cmd_budget_set))

    approvals = group_parser("approvals", "write calls waiting for a person")
    p = approvals.add_parser("list", parents=[common, client], help="approvals")
    p.add_argument("--status", choices=("pending", "approved", "denied", "expired"))
    p.set_defaults(func=_client_command(cmd_approvals_list))
    for verb, decide in (("approve", cmd_approve), ("deny", cmd_deny)):
        p = approvals.add_parser(verb, parents=[common, client], help=f"{verb} a write call")
        p.add_argument("approval_id")
        p.set_defaults(func=_client_command(decide))

    runs = group_parser("runs", "run history")
    p = runs.add_parser("list", parents=[common, client], help="runs of the app's install")
    install_args(p)
    p.add_argument("--tool")
    p.add_argument("--status", choices=("running", "succeeded", "failed", "timed_out"))
    p.add_argument(
        "--surface", choices=get_args(Surface), help="only runs from this surface (app: pages)"
    )
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=_client_command(cmd_runs_list))
    p = runs.add_parser("get", parents=[common, client], help="one run")
    p.add_argument("run_id")
    p.set_defaults(func=_client_command(cmd_runs_get))
