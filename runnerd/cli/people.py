"""``runnerd admin`` for people and keys, on the data dir: bootstrap, add-person,
set-role, create-key, token, workspace-key, login-link and revoke-key. The rules are
govern/people.py's, the API's own; a refusal prints the API's message and exits 1. Each
action is audited as the host's (``cli:<unix user>``, output.cli_actor), in the
workspaces it concerns."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from runnerd.cli.output import cli_actor, output, settings_from_args, store_from_args
from runnerd.errors import InvalidEmail, InvalidScopes, LastAdmin, NotAMember, RunnerdError
from runnerd.govern.people import add_member, bootstrap, key_holder, key_surface, token_scopes
from runnerd.roles import BOUND_SURFACES, ROLES, SCOPES
from runnerd.store import Store

__all__ = ["ADMIN_COMMANDS"]


def _workspace(store: Store, workspace_id: str) -> str:
    if store.get_workspace(workspace_id) is None:
        raise SystemExit(f"runnerd: no workspace {workspace_id}")
    return workspace_id


def _refused(exc: RunnerdError) -> int:
    print(f"runnerd: {exc}", file=sys.stderr)
    return 1


def cmd_bootstrap(args: argparse.Namespace) -> int:
    made = bootstrap(
        store_from_args(args, new=True), args.workspace, args.email, actor_user_id=cli_actor()
    )
    result = {"workspaceId": made.workspace_id, "userId": made.user_id, "apiKey": made.api_key}
    sys.stdout.write(json.dumps(result) + "\n")  # JSON alone on stdout, for scripts
    print(
        f"runnerd: made workspace {args.workspace} ({made.workspace_id}) and its admin "
        f"{args.email}; keep this key (the JSON's apiKey): it is shown only once, signs in to "
        "the Manage page and is the CLI's RUNNERD_API_KEY",
        file=sys.stderr,
    )
    return 0


def _member(
    args: argparse.Namespace, *, members_only: bool = False
) -> tuple[Store, str, str, dict[str, Any]]:
    """The person of --email put in --workspace with the flags given (the others kept):
    the store, the workspace, their email and their membership as the commands print it.
    ``members_only`` (set-role): a person not in the workspace is refused, not added."""
    store = store_from_args(args)
    ws = _workspace(store, args.workspace)
    try:
        row = add_member(
            store, ws, args.email, role=args.role, apps_access=args.apps_access,
            approver=args.approver, actor_user_id=cli_actor(), members_only=members_only,
        )  # fmt: skip
    except InvalidEmail as exc:
        raise SystemExit(f"runnerd: --email: {exc}") from None
    except LastAdmin as exc:
        raise SystemExit(f"runnerd: {exc}") from None
    except NotAMember as exc:
        raise SystemExit(f"runnerd: {exc} (runnerd admin add-person)") from None
    member = {
        "userId": str(row["user_id"]),
        "role": row["role"],
        "appsAccess": bool(row["apps_access"]),
        "approver": bool(row["approver"]),
    }
    return store, ws, str(row["email"]), member


def cmd_add_person(args: argparse.Namespace) -> int:
    store, ws, email, member = _member(args)
    if args.key:
        _, member["apiKey"] = store.create_key(
            kind="personal",
            user_id=member["userId"],
            audit_workspace_id=ws,
            actor_user_id=cli_actor(),
        )
    return output(
        args,
        member,
        lambda: print(
            f"{email}: {member['role']} in {ws}, Apps "
            f"{'on' if member['appsAccess'] else 'off'}"
            + (f"\napi key (shown once): {member['apiKey']}" if "apiKey" in member else "")
        ),
    )


def cmd_set_role(args: argparse.Namespace) -> int:
    _, _, email, member = _member(args, members_only=True)
    return output(
        args,
        member,
        lambda: print(f"{email}: {member['role']}, Apps {'on' if member['appsAccess'] else 'off'}"),
    )


def _new_key(args: argparse.Namespace, store: Store, **kw: Any) -> int:
    record, key = store.create_key(name=args.name or "", actor_user_id=cli_actor(), **kw)
    return output(
        args,
        {
            "keyId": record.id,
            "apiKey": key,
            "kind": record.kind,
            "scopes": list(record.scopes),
            **({"surface": record.surface} if record.surface else {}),
        },
        lambda: print(
            f"{record.kind} key {record.id}"
            + (f" (surface {record.surface})" if record.surface else "")
            + f" (shown once): {key}"
        ),
    )


def cmd_create_key(args: argparse.Namespace) -> int:
    store = store_from_args(args)
    try:
        user_id = key_holder(store, None, args.email)
    except NotAMember as exc:
        return _refused(exc)
    return _new_key(args, store, kind="personal", user_id=user_id)


def cmd_token(args: argparse.Namespace) -> int:
    store = store_from_args(args)
    try:
        user_id = key_holder(store, None, args.email)
        scopes = token_scopes(args.scope)
    except (NotAMember, InvalidScopes) as exc:
        return _refused(exc)
    return _new_key(
        args,
        store,
        kind="token",
        user_id=user_id,
        scopes=scopes,
        surface=key_surface("token", args.surface),
    )


def cmd_workspace_key(args: argparse.Namespace) -> int:
    store = store_from_args(args)
    ws = _workspace(store, args.workspace)
    return _new_key(args, store, kind="workspace", workspace_id=ws)


def cmd_login_link(args: argparse.Namespace) -> int:
    """A one-time sign-in link for the Manage page (good once, for 10 minutes). The token
    is in the URL's fragment, which browsers never send: no server or proxy logs it."""
    from runnerd.limits import LOGIN_LINK_TTL_S

    settings = settings_from_args(args)
    store = store_from_args(args)
    user = store.find_user(args.email)
    if user is None:
        print(f"runnerd: no person with the email {args.email}", file=sys.stderr)
        return 1
    token = store.create_login_link(user.id, ttl_s=LOGIN_LINK_TTL_S, actor_user_id=cli_actor())
    # Where people reach the daemon: --url, else the CLI's RUNNERD_URL, else public_url
    # (which defaults to the bind address and port of the settings).
    base = args.url or os.environ.get("RUNNERD_URL") or settings.public_base
    link = f"{base.rstrip('/')}/login#token={token}"
    return output(
        args,
        {"url": link, "expiresInSeconds": LOGIN_LINK_TTL_S},
        lambda: print(f"{link}\n(good once, for {LOGIN_LINK_TTL_S // 60} minutes)"),
    )


def cmd_revoke_key(args: argparse.Namespace) -> int:
    done = store_from_args(args).revoke_key(args.key_id, actor_user_id=cli_actor())
    if not done:
        print(f"runnerd: no live key {args.key_id}", file=sys.stderr)
        return 1
    return output(args, {"revoked": args.key_id}, lambda: print(f"revoked {args.key_id}"))


# --- parser -----------------------------------------------------------------------------------


def _add_bootstrap(admin: Any, common: argparse.ArgumentParser) -> None:
    boot = admin.add_parser(
        "bootstrap", parents=[common], help="create a workspace, its admin and a personal API key"
    )
    boot.add_argument("--workspace", required=True, help="the workspace's name")
    boot.add_argument("--email", required=True, help="the admin's email")
    boot.set_defaults(func=cmd_bootstrap)


def _member_parser(
    name: str, fn: Callable[[argparse.Namespace], int], text: str
) -> Callable[[Any, argparse.ArgumentParser], None]:
    def add(admin: Any, common: argparse.ArgumentParser) -> None:
        p = admin.add_parser(name, parents=[common], help=text)
        p.add_argument("--workspace", required=True, help="workspace id")
        p.add_argument("--email", required=True)
        p.add_argument(
            "--role", choices=ROLES[::-1], default=None if name == "set-role" else "member"
        )
        p.add_argument(
            "--apps-access",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="access to the Apps module, which running tools and MCP need (a person "
            "new to the workspace has none unless given: --apps-access)",
        )
        p.add_argument(
            "--approver",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="may approve write calls from relays (of apps without an approval rule)",
        )
        if name == "add-person":
            p.add_argument("--key", action="store_true", help="also create a personal key")
        p.set_defaults(func=fn)

    return add


def _add_create_key(admin: Any, common: argparse.ArgumentParser) -> None:
    p = admin.add_parser("create-key", parents=[common], help="a personal API key")
    p.add_argument("--email", required=True)
    p.add_argument("--name")
    p.set_defaults(func=cmd_create_key)


def _add_token(admin: Any, common: argparse.ArgumentParser) -> None:
    p = admin.add_parser("token", parents=[common], help="a scoped token of a person")
    p.add_argument("--email", required=True)
    p.add_argument("--scope", action="append", choices=SCOPES, required=True)
    p.add_argument(
        "--surface",
        choices=BOUND_SURFACES,
        help="bind the token to a surface: its runs are recorded as it whatever a body "
        "says (a relay's or chat's write calls wait for approval)",
    )
    p.add_argument("--name")
    p.set_defaults(func=cmd_token)


def _add_workspace_key(admin: Any, common: argparse.ArgumentParser) -> None:
    p = admin.add_parser(
        "workspace-key",
        parents=[common],
        help="a workspace API key (deploy and publish; never runs tools)",
    )
    p.add_argument("--workspace", required=True)
    p.add_argument("--name")
    p.set_defaults(func=cmd_workspace_key)


def _add_login_link(admin: Any, common: argparse.ArgumentParser) -> None:
    p = admin.add_parser(
        "login-link", parents=[common], help="a one-time sign-in link for the Manage page"
    )
    p.add_argument("--email", required=True)
    p.add_argument("--url", help="the daemon's address as browsers reach it (default: host:port)")
    p.set_defaults(func=cmd_login_link)


def _add_revoke_key(admin: Any, common: argparse.ArgumentParser) -> None:
    p = admin.add_parser("revoke-key", parents=[common], help="revoke an API key")
    p.add_argument("key_id")
    p.set_defaults(func=cmd_revoke_key)


# Each ``runnerd admin`` command of people and keys, by name, and what adds its parser
# (cli/main.py adds them in the order the group's help lists them).
ADMIN_COMMANDS: dict[str, Callable[[Any, argparse.ArgumentParser], None]] = {
    "bootstrap": _add_bootstrap,
    "add-person": _member_parser("add-person", cmd_add_person, "add a person to a workspace"),
    "set-role": _member_parser("set-role", cmd_set_role, "change a role or Apps access"),
    "create-key": _add_create_key,
    "token": _add_token,
    "workspace-key": _add_workspace_key,
    "login-link": _add_login_link,
    "revoke-key": _add_revoke_key,
}
