"""CLI commands around the daemon: ``serve``, ``admin`` (local, on the data dir) and the
client commands (``app deploy|publish|install|switch|rollback|list``, ``tools list|run``)
that talk to a running daemon."""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from ruamel.yaml import YAML

from runnerd.bundle import read_app_dir
from runnerd.client import ApiClient, ApiFailure
from runnerd.config import Settings, load_settings
from runnerd.constants import MANIFEST_NAME
from runnerd.store import Store

__all__ = ["register"]

ROLES = ("admin", "builder", "member", "viewer")
SCOPES = ("api:read", "tools:run", "apps:write")


def _lines(rows: list[Any], fmt: Callable[[Any], str], empty: str) -> Callable[[], None]:
    """A human printer of one line per row, or ``empty``."""

    def show() -> None:
        for row in rows:
            print(fmt(row))
        if not rows:
            print(empty)

    return show


def _out(args: argparse.Namespace, value: Any, human: Callable[[], None]) -> int:
    if args.json:
        sys.stdout.write(msgspec.json.encode(value).decode() + "\n")
    else:
        human()
    return 0


def _settings(args: argparse.Namespace, **flags: Any) -> Settings:
    return load_settings(config_file=args.config, flags={"data_dir": args.data_dir, **flags})


# --- serve ------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from runnerd.api.app import create_app

    settings = _settings(args, host=args.host, port=args.port)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=30,
    )
    return 0


def cmd_openapi(args: argparse.Namespace) -> int:
    from runnerd.api.openapi import openapi_document

    sys.stdout.write(json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n")
    return 0


# --- admin (local) ----------------------------------------------------------------------------


def _store(args: argparse.Namespace) -> Store:
    return Store.in_data_dir(_settings(args).data_dir)


def _workspace(store: Store, workspace_id: str) -> str:
    if store.get_workspace(workspace_id) is None:
        raise SystemExit(f"runnerd: no workspace {workspace_id}")
    return workspace_id


def cmd_bootstrap(args: argparse.Namespace) -> int:
    store = _store(args)
    workspace = store.create_workspace(args.workspace)
    user = store.ensure_user(args.email)
    store.set_membership(workspace.id, user.id, role="admin", apps_access=True)
    _, key = store.create_key(
        kind="personal", user_id=user.id, name="bootstrap", audit_workspace_id=workspace.id
    )
    sys.stdout.write(
        json.dumps({"workspaceId": workspace.id, "userId": user.id, "apiKey": key}) + "\n"
    )
    return 0


def cmd_add_person(args: argparse.Namespace) -> int:
    store = _store(args)
    ws = _workspace(store, args.workspace)
    user = store.ensure_user(args.email)
    member = store.set_membership(
        ws, user.id, role=args.role, apps_access=args.apps_access, approver=args.approver
    )
    result: dict[str, Any] = {
        "userId": user.id,
        "role": member.role,
        "appsAccess": member.apps_access,
        "approver": member.approver,
    }
    if args.key:
        _, result["apiKey"] = store.create_key(
            kind="personal", user_id=user.id, audit_workspace_id=ws
        )
    return _out(
        args,
        result,
        lambda: print(
            f"{args.email}: {member.role} in {ws}, Apps "
            f"{'on' if member.apps_access else 'off'}"
            + (f"\napi key (shown once): {result['apiKey']}" if "apiKey" in result else "")
        ),
    )


def cmd_set_role(args: argparse.Namespace) -> int:
    store = _store(args)
    ws = _workspace(store, args.workspace)
    user = store.ensure_user(args.email)
    member = store.set_membership(
        ws, user.id, role=args.role, apps_access=args.apps_access, approver=args.approver
    )
    return _out(
        args,
        {
            "userId": user.id,
            "role": member.role,
            "appsAccess": member.apps_access,
            "approver": member.approver,
        },
        lambda: print(f"{args.email}: {member.role}, Apps {'on' if member.apps_access else 'off'}"),
    )


def _new_key(args: argparse.Namespace, **kw: Any) -> int:
    store = _store(args)
    record, key = store.create_key(name=args.name or "", **kw)
    return _out(
        args,
        {"keyId": record.id, "apiKey": key, "kind": record.kind, "scopes": list(record.scopes)},
        lambda: print(f"{record.kind} key {record.id} (shown once): {key}"),
    )


def cmd_create_key(args: argparse.Namespace) -> int:
    user = _store(args).ensure_user(args.email)
    return _new_key(args, kind="personal", user_id=user.id)


def cmd_token(args: argparse.Namespace) -> int:
    user = _store(args).ensure_user(args.email)
    return _new_key(args, kind="token", user_id=user.id, scopes=tuple(args.scope))


def cmd_workspace_key(args: argparse.Namespace) -> int:
    ws = _workspace(_store(args), args.workspace)
    return _new_key(args, kind="workspace", workspace_id=ws)


def cmd_revoke_key(args: argparse.Namespace) -> int:
    done = _store(args).revoke_key(args.key_id)
    if not done:
        print(f"runnerd: no live key {args.key_id}", file=sys.stderr)
        return 1
    return _out(args, {"revoked": args.key_id}, lambda: print(f"revoked {args.key_id}"))


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
    return str(YAML(typ="safe").load(manifest.read_text())["slug"])


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
    print(f"runnerd: {exc.code}: {exc}", file=sys.stderr)
    for problem in exc.details.get("problems", []):
        line = f":{problem['line']}" if problem.get("line") else ""
        print(f"{problem['file']}{line}: {problem['message']}", file=sys.stderr)
    reason = exc.details.get("code")
    if reason and not exc.details.get("problems"):
        print(f"  ({reason})", file=sys.stderr)
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


def cmd_deploy(args: argparse.Namespace, client: ApiClient) -> int:
    root = Path(args.dir)
    files = read_app_dir(root)
    if MANIFEST_NAME not in files:
        print(f"runnerd: no {MANIFEST_NAME} in {root}", file=sys.stderr)
        return 2
    body = {"files": {p: base64.b64encode(d).decode() for p, d in files.items()}}
    result = client.call(
        "POST", "/api/v2/apps/deploy", query={"workspaceId": _workspace_arg(args)}, body=body
    )
    v = result["version"]

    def human() -> None:
        for w in result["warnings"]:
            print(f"warning: {w['file']}: {w['message']}")
        print(
            f"deployed {v['appSlug']} version {v['version']} ({v['versionId']}): "
            f"{len(v['tools'])} tools: {', '.join(v['tools'])}"
        )

    return _out(args, result, human)


def cmd_publish(args: argparse.Namespace, client: ApiClient) -> int:
    slug = _slug(args)
    result = client.call(
        "POST",
        f"/api/v2/apps/{slug}/versions/{args.version}/publish",
        query={"workspaceId": _workspace_arg(args)},
    )
    return _out(
        args,
        result,
        lambda: print(f"published {slug} version {args.version} at {result['publishedAt']}"),
    )


def _print_install(i: dict[str, Any], verb: str) -> None:
    print(f"{verb} {i['appSlug']} version {i['version']}: install {i['installId']}")


def cmd_install(args: argparse.Namespace, client: ApiClient) -> int:
    result = client.call(
        "POST",
        "/api/v2/apps/installs",
        query={"workspaceId": _workspace_arg(args)},
        body={"appSlug": _slug(args), "version": args.version},
    )
    return _out(args, result, lambda: _print_install(result, "installed"))


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
    return _out(args, result, lambda: _print_install(result, "switched"))


def cmd_rollback(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    result = client.call("POST", f"/api/v2/apps/installs/{install_id}/rollback")
    return _out(args, result, lambda: _print_install(result, "rolled back"))


def cmd_app_list(args: argparse.Namespace, client: ApiClient) -> int:
    result = client.call("GET", "/api/v2/apps", query={"workspaceId": _workspace_arg(args)})

    def human() -> None:
        for app in result["data"]:
            print(f"{app['appSlug']} ({app['name']})")
            for v in app["versions"]:
                state = "published" if v["publishedAt"] else "draft"
                print(f"  {v['version']:<12} {state:<9} {v['createdAt']}  {', '.join(v['tools'])}")

    return _out(args, result, human)


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

    return _out(args, result, human)


def cmd_tools_run(args: argparse.Namespace, client: ApiClient) -> int:
    slug, sep, tool = args.reference.partition("/")
    if not sep or not slug or not tool:
        print("runnerd: REF is app-slug/tool_name, such as deal-desk/score_offer", file=sys.stderr)
        return 2
    try:
        value = json.loads(sys.stdin.read() if args.input == "-" else args.input)
    except ValueError as exc:
        print(f"runnerd: --input is not JSON: {exc}", file=sys.stderr)
        return 2
    result = client.call(
        "POST",
        f"/api/v2/apps/tools/{slug}/{tool}/run",
        query={"workspaceId": _workspace_arg(args)},
        body={"input": value, "surface": args.surface},
    )

    if result.get("status") == "pending_approval":
        return _out(
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

    _out(args, result, human)
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
    return _out(args, result, lambda: print(f"set {args.name} at {result['updatedAt']}"))


def cmd_secret_list(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    result = client.call("GET", f"/api/v2/apps/installs/{install_id}/secrets")
    return _out(
        args,
        result,
        _lines(result["data"], lambda x: f"{x['name']:<32} updated {x['updatedAt']}", "no secrets"),
    )


def cmd_secret_delete(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    result = client.call("DELETE", f"/api/v2/apps/installs/{install_id}/secrets/{args.name}")
    return _out(args, result, lambda: print(f"deleted {args.name}"))


def _print_budget(b: dict[str, Any]) -> None:
    limit = "unlimited" if b["monthlyMs"] is None else f"{b['monthlyMs']:,} ms"
    print(
        f"budget {limit}; {b['month']}: used {b['usedMs']:,} ms, reserved "
        f"{b['reservedMs']:,} ms; resets at {b['resetsAt']}"
    )


def cmd_budget_show(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    result = client.call("GET", f"/api/v2/apps/installs/{install_id}/budget")
    return _out(args, result, lambda: _print_budget(result))


def cmd_budget_set(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    monthly = None if args.unlimited else args.ms
    result = client.call(
        "PUT", f"/api/v2/apps/installs/{install_id}/budget", body={"monthlyMs": monthly}
    )
    return _out(args, result, lambda: _print_budget(result))


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

    return _out(args, result, _lines(result["data"], line, "no approvals"))


def _decide(args: argparse.Namespace, client: ApiClient, verb: str) -> int:
    result = client.call("POST", f"/api/v2/approvals/{args.approval_id}/{verb}")
    run = f"; run {result['runId']}" if result.get("runId") else ""
    return _out(args, result, lambda: print(f"{result['status']} {args.approval_id}{run}"))


def cmd_approve(args: argparse.Namespace, client: ApiClient) -> int:
    return _decide(args, client, "approve")


def cmd_deny(args: argparse.Namespace, client: ApiClient) -> int:
    return _decide(args, client, "deny")


def cmd_runs_list(args: argparse.Namespace, client: ApiClient) -> int:
    install_id = _install_id(args, client)
    result = client.call(
        "GET",
        f"/api/v2/apps/installs/{install_id}/runs",
        query={"tool": args.tool, "status": args.status, "limit": str(args.limit)},
    )

    def line(r: dict[str, Any]) -> str:
        return (
            f"{r['runId']}  {r['startedAt']}  {r['tool']:<24} v{r['version']:<8} "
            f"{r['status']:<10} {r['durationMs'] or 0:>6} ms  {r['surface']:<8} "
            f"{r['userEmail']}"
        )

    return _out(args, result, _lines(result["data"], line, "no runs"))


def cmd_runs_get(args: argparse.Namespace, client: ApiClient) -> int:
    result = client.call("GET", f"/api/v2/runs/{args.run_id}")

    def human() -> None:
        r = result["run"]
        print(f"{r['runId']}: {r['status']} in {r['durationMs']} ms ({r['tool']})")
        if result["outputAvailable"]:
            print(json.dumps(result["output"], indent=2, ensure_ascii=False))
            if result["error"]:
                print(f"error: {result['error']}")

    return _out(args, result, human)


def cmd_ledger_export(args: argparse.Namespace) -> int:
    import csv

    store = _store(args)
    rows = store.ledger(month=args.month, workspace_id=args.workspace, install_id=args.install)
    if args.format == "json":
        sys.stdout.write(json.dumps(rows) + "\n")
        return 0
    columns = [
        "id",
        "kind",
        "run_id",
        "sandbox_ms",
        "payer_kind",
        "payer_id",
        "workspace_id",
        "app_id",
        "install_id",
        "version_id",
        "tool",
        "user_id",
        "month",
        "created_at",
    ]
    writer = csv.DictWriter(sys.stdout, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return 0


def cmd_audit_verify(args: argparse.Namespace) -> int:
    checked, broken = _store(args).verify_audit()
    if args.json:
        sys.stdout.write(json.dumps({"entries": checked, "firstBroken": broken}) + "\n")
    elif broken is None:
        print(f"audit trail intact: {checked} entries")
    else:
        print(
            f"audit trail BROKEN at entry {broken} (of {checked} read): it or the one "
            "before it was edited or deleted"
        )
    return 0 if broken is None else 1


def cmd_rotate_key(args: argparse.Namespace) -> int:
    from runnerd.vault import Vault, new_key, write_key_file

    settings = _settings(args)
    if settings.secrets_key:
        print(
            "runnerd: secrets_key is set in the config or environment; rotate it there "
            "(this command rotates the key file)",
            file=sys.stderr,
        )
        return 2
    store = _store(args)
    old = Vault.from_settings(None, settings.secrets_key_path)
    key = new_key()
    new = Vault(key)
    resealed = []
    for install_id, name, kid, nonce, ct in store.sealed_secrets():
        value = old.open(install_id, name, kid, nonce, ct)
        resealed.append((install_id, name, *new.seal(install_id, name, value)))
    # The new key is safe on disk before any row needs it; rows switch in one transaction.
    pending = settings.secrets_key_path.with_name(settings.secrets_key_path.name + ".new")
    write_key_file(pending, key)
    store.reseal_all(resealed, new.key_id)
    os.replace(pending, settings.secrets_key_path)
    return _out(
        args,
        {"keyId": new.key_id, "secrets": len(resealed)},
        lambda: print(
            f"rotated the secrets key to {new.key_id}: {len(resealed)} secrets re-encrypted"
        ),
    )


# --- parser -----------------------------------------------------------------------------------


def register(
    groups: Any, common: argparse.ArgumentParser, app: Any, group_parser: Callable[..., Any]
) -> None:
    """Add serve, openapi, admin, and the client commands to the CLI's parser."""
    serve = groups.add_parser("serve", parents=[common], help="run the daemon")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8686)")
    serve.set_defaults(func=cmd_serve)
    groups.add_parser("openapi", parents=[common], help="print the OpenAPI document").set_defaults(
        func=cmd_openapi
    )

    admin = group_parser("admin", "people, roles and keys (local, on the data dir)")
    boot = admin.add_parser(
        "bootstrap", parents=[common], help="create a workspace, its admin and a personal API key"
    )
    boot.add_argument("--workspace", required=True, help="the workspace's name")
    boot.add_argument("--email", required=True, help="the admin's email")
    boot.set_defaults(func=cmd_bootstrap)
    for name, fn, text in (
        ("add-person", cmd_add_person, "add a person to a workspace"),
        ("set-role", cmd_set_role, "change a role or Apps access"),
    ):
        p = admin.add_parser(name, parents=[common], help=text)
        p.add_argument("--workspace", required=True, help="workspace id")
        p.add_argument("--email", required=True)
        p.add_argument("--role", choices=ROLES, default=None if name == "set-role" else "member")
        p.add_argument(
            "--apps-access",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="access to the Apps module",
        )
        p.add_argument(
            "--approver",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="may approve write calls from relays",
        )
        if name == "add-person":
            p.add_argument("--key", action="store_true", help="also create a personal key")
        p.set_defaults(func=fn)
    p = admin.add_parser("create-key", parents=[common], help="a personal API key")
    p.add_argument("--email", required=True)
    p.add_argument("--name")
    p.set_defaults(func=cmd_create_key)
    p = admin.add_parser("token", parents=[common], help="a scoped token of a person")
    p.add_argument("--email", required=True)
    p.add_argument("--scope", action="append", choices=SCOPES, required=True)
    p.add_argument("--name")
    p.set_defaults(func=cmd_token)
    p = admin.add_parser(
        "workspace-key",
        parents=[common],
        help="a workspace API key (deploy and publish; never runs tools)",
    )
    p.add_argument("--workspace", required=True)
    p.add_argument("--name")
    p.set_defaults(func=cmd_workspace_key)
    p = admin.add_parser("revoke-key", parents=[common], help="revoke an API key")
    p.add_argument("key_id")
    p.set_defaults(func=cmd_revoke_key)

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", help="the daemon ($RUNNERD_URL, default http://127.0.0.1:8686)")
    client.add_argument("--api-key", help="API key ($RUNNERD_API_KEY)")
    client.add_argument("--workspace", help="workspace id ($RUNNERD_WORKSPACE)")

    def with_app(p: argparse.ArgumentParser) -> None:
        p.add_argument("--app", help="app slug (default: the manifest in DIR)")
        p.add_argument("--dir", default=".", help="app folder (default .)")

    p = app.add_parser("deploy", parents=[common, client], help="upload the app as a new version")
    p.add_argument("dir", nargs="?", default=".")
    p.set_defaults(func=_client_command(cmd_deploy))
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
    p.add_argument("--input", required=True, help="the input as JSON, or - for stdin")
    p.add_argument(
        "--surface",
        default="cli",
        choices=("app", "chat", "relay", "workflow", "api", "cli", "test"),
    )
    p.set_defaults(func=_client_command(cmd_tools_run))

    p = admin.add_parser(
        "rotate-secrets-key", parents=[common], help="re-encrypt every secret under a new key file"
    )
    p.set_defaults(func=cmd_rotate_key)

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
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=_client_command(cmd_runs_list))
    p = runs.add_parser("get", parents=[common, client], help="one run")
    p.add_argument("run_id")
    p.set_defaults(func=_client_command(cmd_runs_get))

    ledger = group_parser("ledger", "the usage ledger (local, on the data dir)")
    p = ledger.add_parser("export", parents=[common], help="ledger rows as CSV or JSON")
    p.add_argument("--month", help="YYYY-MM")
    p.add_argument("--format", choices=("csv", "json"), default="csv")
    p.add_argument("--workspace")
    p.add_argument("--install")
    p.set_defaults(func=cmd_ledger_export)

    audit = group_parser("audit", "the audit trail (local, on the data dir)")
    p = audit.add_parser(
        "verify", parents=[common], help="check the hash chain; exit 1 at the first broken entry"
    )
    p.set_defaults(func=cmd_audit_verify)
