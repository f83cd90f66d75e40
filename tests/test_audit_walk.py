"""Every action attributed (issue 24, part 5): a walk through every state-changing HTTP
operation of a real daemon, and every ``runnerd admin`` command, checking the audit
entries each leaves: their actions, who did it (``actorUserId``), with which key
(``actorKeyId``) and in which workspace (``workspaceId``).

``WALK`` names each state-changing operation the daemon serves (its routes, and the
OpenAPI document in schemas/openapi.json) with the audit actions one call leaves and the
ways it is walked: with an API key, with the Manage page's session (cookie and CSRF
header; every operation the page's scripts call), with a workspace key, with a sign-in
link. A route the table does not name fails the walk: a new operation is walked, and its
entry decided, before it is served. ``ADMIN_WALK`` does the same for ``runnerd admin``.

Who an entry names:
- an API key: its person and its key id;
- a Manage-page session: its person, and the session's id (``ses_…``) as its key, which
  its ``session.create`` entry ties to the key it was signed in with, or to none (null)
  for a session signed in with a sign-in link;
- a workspace key: no person, its key id;
- the host's CLI: ``cli:<unix user>`` and no key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import pwd
import re
import secrets
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import msgspec
import pytest
from starlette.routing import BaseRoute, Mount, Route

from conftest import REPO, run_cli, write_app
from daemon import Daemon
from runnerd.cli.main import ADMIN_ORDER
from runnerd.config import load_settings
from runnerd.daemon.app import create_app
from runnerd.store import AuditEntry
from runnerd.upload.walk import read_app_dir

pytestmark = pytest.mark.jail  # three runs in real sandboxes
BACKENDS = ("sqlite", "postgresql")  # the trail is written alike on both stores
# The walk reads the trail after every call: more requests than the default burst allows.
DAEMON_SETTINGS = {
    "approval_ttl_s": "600",
    "rate_limit_burst": "1000",
    "git_deploy_allow_local": "true",  # the Git deploy's repository: a folder of the test
}

CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
STREAMS = "application/json, text/event-stream"
MCP_REVISION = "2025-11-25"
CLI = f"cli:{pwd.getpwuid(os.geteuid()).pw_name}"  # who the host's CLI acts as
# What must never be in the trail: secret values, and what went in and out of runs.
SECRET_BY_KEY = "s3cret-by-key-7f1e"
SECRET_BY_PAGE = "s3cret-by-page-93ab"
INPUT_MARK = "input-mark-5c2d"


@dataclass(frozen=True)
class Expect:
    """What one call of an operation leaves in its workspace's trail (``actions``, in any
    order; empty: nothing, and ``why``), and the ways the walk makes it."""

    actions: tuple[str, ...]
    ways: tuple[str, ...] = ("key",)
    why: str = ""


KEY, PAGE, WS_KEY, LINK = "key", "session", "workspace key", "sign-in link"
CLIENT = "OAuth client"  # a chat client at the OAuth endpoints: no key, no session
GIT_SERVER = "Git server"  # a push webhook: signed with the Git deploy's secret, no key
INSTALL = "/api/v2/apps/installs/{installId}"
MEMBERS = "/api/v2/workspaces/{workspaceId}/members"
KEYS = "/api/v2/workspaces/{workspaceId}/keys"
RULES = "/api/v2/workspaces/{workspaceId}/approval-rules/{appSlug}"
WEBHOOK = "/api/v2/workspaces/{workspaceId}/webhook"
GIT_DEPLOY = "/api/v2/workspaces/{workspaceId}/git-deploys/{appSlug}"

WALK: dict[tuple[str, str], Expect] = {
    ("POST", "/api/v2/apps/deploy"): Expect(("app.deploy",), (KEY, WS_KEY)),
    ("POST", "/api/v2/apps/{appSlug}/versions/{version}/publish"): Expect(
        ("app.publish",), (KEY, PAGE, WS_KEY)
    ),
    ("POST", "/api/v2/apps/installs"): Expect(("app.install",), (KEY, PAGE)),
    ("POST", f"{INSTALL}/switch"): Expect(("app.switch",), (KEY, PAGE)),
    ("POST", f"{INSTALL}/rollback"): Expect(("app.rollback",), (KEY, PAGE)),
    ("POST", f"{INSTALL}/frame"): Expect(("app.open",), (KEY, PAGE)),
    # runnerd app dev: the person's pages held in the node's memory (app.dev when none was).
    ("PUT", f"{INSTALL}/dev-pages"): Expect(("app.dev",), (KEY, PAGE)),
    ("DELETE", f"{INSTALL}/dev-pages"): Expect(
        (), (KEY, PAGE), why="drops the person's dev pages from the node's memory: none stored"
    ),
    ("PUT", f"{INSTALL}/egress"): Expect(("install.egress",)),
    ("PUT", f"{INSTALL}/secrets/{{name}}"): Expect(("secret.set",), (KEY, PAGE)),
    ("DELETE", f"{INSTALL}/secrets/{{name}}"): Expect(("secret.delete",), (KEY, PAGE)),
    ("PUT", f"{INSTALL}/budget"): Expect(("budget.set",), (KEY, PAGE)),
    ("POST", f"{INSTALL}/tools/{{toolName}}/check"): Expect(
        (), (KEY, PAGE), why="checks an input against the schema: nothing runs or changes"
    ),
    # A read tool runs (tool.run); a write tool called from chat is held (approval.request).
    ("POST", f"{INSTALL}/tools/{{toolName}}/run"): Expect(("tool.run",), (KEY, PAGE)),
    ("POST", "/api/v2/apps/tools/{appSlug}/{toolName}/run"): Expect(("approval.request",)),
    ("POST", "/api/v2/audit/verify"): Expect(
        (), (KEY, PAGE), why="reads the chain: a POST only because it is work, not a query"
    ),
    # Approving releases the held run: its tool.run follows, attributed to who asked.
    ("POST", "/api/v2/approvals/{approvalId}/approve"): Expect(
        ("approval.approve", "tool.run"), (KEY, PAGE)
    ),
    ("POST", "/api/v2/approvals/{approvalId}/deny"): Expect(("approval.deny",), (KEY, PAGE)),
    ("PUT", RULES): Expect(("approval_rule.set",), (KEY, PAGE)),
    ("DELETE", RULES): Expect(("approval_rule.delete",), (KEY, PAGE)),
    ("PUT", WEBHOOK): Expect(("webhook.set",), (KEY, PAGE)),
    ("DELETE", WEBHOOK): Expect(("webhook.delete",), (KEY, PAGE)),
    ("PUT", GIT_DEPLOY): Expect(("git_deploy.set",)),
    ("DELETE", GIT_DEPLOY): Expect(("git_deploy.delete",)),
    # A signed push deploys the pushed commit: no person, no key, the workspace's trail.
    ("POST", "/api/v2/apps/{appSlug}/git-webhook"): Expect(("app.deploy",), (GIT_SERVER,)),
    ("POST", "/api/v2/session"): Expect(("session.create",), (KEY, LINK)),
    ("DELETE", "/api/v2/session"): Expect(("session.end",), (PAGE,)),
    ("PUT", MEMBERS): Expect(("member.set",), (KEY, PAGE)),
    ("DELETE", f"{MEMBERS}/{{userId}}"): Expect(("member.remove",), (KEY, PAGE)),
    ("POST", KEYS): Expect(("key.create",), (KEY, PAGE)),
    ("DELETE", f"{KEYS}/{{keyId}}"): Expect(("key.revoke",), (KEY, PAGE)),
    # MCP: tools/call of a write tool is held like any chat call; the handshake and its
    # notifications leave nothing (walked too).
    ("POST", "/mcp"): Expect(("approval.request",)),
    # OAuth: a client registers (filed in no workspace: it belongs to none), asks, the
    # person consents; the code becomes tokens, which the client may revoke.
    ("POST", "/oauth/register"): Expect(
        (), (CLIENT,), why="a client registered belongs to no workspace (the store's trail)"
    ),
    ("POST", "/oauth/authorize"): Expect(
        (), (CLIENT,), why="an authorization request waits for consent: nothing granted yet"
    ),
    ("POST", "/api/v2/oauth/requests/{requestId}/decision"): Expect(
        ("oauth.consent.grant",), (KEY, PAGE)
    ),
    ("POST", "/oauth/token"): Expect(("oauth.token.issue",), (CLIENT,)),
    ("POST", "/oauth/revoke"): Expect(("oauth.token.revoke",), (CLIENT,)),
    ("DELETE", "/mcp"): Expect((), why="ends an MCP session: transport, not an action"),
}

# ``runnerd admin``: what each command leaves (in the workspaces it concerns), or why not.
ADMIN_WALK: dict[str, Expect] = {
    "bootstrap": Expect(("workspace.create", "member.set", "key.create")),
    "add-person": Expect(("member.set", "key.create")),  # with --key
    "set-role": Expect(("member.set",)),
    "create-key": Expect(("key.create",)),
    "token": Expect(("key.create",)),
    "workspace-key": Expect(("key.create",)),
    "login-link": Expect(("login_link.create",)),
    "revoke-key": Expect(("key.revoke",)),
    "rotate-secrets-key": Expect(("secrets.rotate_key",)),  # no workspace: all of them
    "migrate": Expect((), why="the store's schema, no one's action in a workspace"),
    "backup": Expect((), why="a copy of the store; changes nothing"),
    "copy": Expect((), why="the store copied to another database, trail and all"),
    "restore": Expect((), why="puts back an older trail, on purpose (its checkpoint aside)"),
}
WALKED_ADMIN = ("migrate", "backup")  # store commands run to see they leave nothing


# --- what the daemon serves -------------------------------------------------------------------


def _changing(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    for route in routes:
        if isinstance(route, Route):
            for method in sorted((route.methods or set()) & CHANGES):
                yield method, prefix + route.path
        elif isinstance(route, Mount):
            if route.routes:
                yield from _changing(list(route.routes), prefix + route.path)
            else:  # a mounted app with no routes of its own: only the static files
                assert route.name == "static", route.path


def served_changes(d: Daemon) -> set[tuple[str, str]]:
    """Every state-changing (method, path) the daemon's app routes (nothing is opened
    until its lifespan starts: the app is only built)."""
    return set(_changing(create_app(load_settings(env=d.env)).routes))


def documented_changes() -> set[tuple[str, str]]:
    document = json.loads((REPO / "schemas" / "openapi.json").read_text())
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method.upper() in CHANGES
    }


CALL = re.compile(r"api\('(POST|PUT|PATCH|DELETE)',\s*(`[^`]*`|'[^']*'|\w+)")
PATH_OF = re.compile(r"const (\w+) = (?:\([^)]*\) => )?`([^`]*)`")  # a path made once


def page_changes() -> set[tuple[str, str]]:
    """The state-changing calls the Manage page's scripts make, as (method, path pattern)
    with each ``${…}`` as a wildcard; a path held in a ``const`` of the script (a string
    or an arrow function returning one) is read from its nearest definition before."""
    found = set()
    for script in (REPO / "runnerd" / "web" / "static").glob("*.js"):
        text = script.read_text()
        made = [(m.start(), m[1], m[2]) for m in PATH_OF.finditer(text)]
        for call in CALL.finditer(text):
            method, path = call[1], call[2]
            if path[0] not in "`'":
                before = [p for at, name, p in made if name == path and at < call.start()]
                assert before, f"{script.name}: api('{method}', {path}…): path not read"
                path = f"`{before[-1]}`"
            found.add((method, path[1:-1]))
    return found


def _matches(pattern: str, path: str) -> bool:
    """Whether the page's ``pattern`` (``${…}`` any text) is the route template ``path``."""
    parts = re.split(r"\$\{[^}]*\}", pattern)
    regex = ".+".join(re.escape(p) for p in parts)
    return re.fullmatch(regex, re.sub(r"\{[^}]*\}", "x", path)) is not None


def test_the_walk_covers_every_state_changing_operation(daemon: Daemon) -> None:
    served = served_changes(daemon)
    assert served == set(WALK), (
        f"not walked: {sorted(served - set(WALK))}; gone: {sorted(set(WALK) - served)}"
    )
    documented = documented_changes()
    assert documented <= served, sorted(documented - served)
    assert {op for op in served if op[1].startswith("/api/")} == documented
    for method, pattern in page_changes():
        walked = [op for op in WALK if op[0] == method and _matches(pattern, op[1])]
        assert walked, f"the Manage page calls {method} {pattern}: no operation has it"
        assert any(PAGE in WALK[op].ways or op == ("POST", "/api/v2/session")
                   for op in walked), (method, pattern)  # fmt: skip
    assert set(ADMIN_WALK) == set(ADMIN_ORDER)


# --- the walk ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Who:
    """A caller: how it sends requests, and what the trail must name for it."""

    way: str
    client: httpx.Client
    headers: dict[str, str]
    user_id: str | None
    key_id: str | None


@dataclass
class Walk:
    d: Daemon
    ws: str
    seen: int = 0  # the newest entry read
    done: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    def entries(self) -> list[dict[str, Any]]:
        """The workspace's entries after the last read (over the API)."""
        found: list[dict[str, Any]] = []
        while True:
            page = self.d.call("GET", "/api/v2/audit", self.d.admin_key, params={
                "workspaceId": self.ws, "limit": "1000", "cursor": str(self.seen)})  # fmt: skip
            assert page.status_code == 200, page.text
            data = page.json()["data"]
            found += data
            if data:
                self.seen = data[-1]["seq"]
            if page.json()["nextCursor"] is None:
                return found

    def do(
        self,
        op: tuple[str, str],
        who: Who,
        path: str,
        *,
        expect: tuple[str, ...] | None = None,
        settle: Callable[[httpx.Response], None] | None = None,
        attributed: tuple[str, ...] | None = None,
        **kw: Any,
    ) -> tuple[httpx.Response, list[dict[str, Any]]]:
        """Make ``op``'s call as ``who``; its new entries in the workspace, which are
        ``expect`` (the table's actions unless given), each naming ``who`` (those of
        ``attributed``; all of them unless given)."""
        assert op in WALK, op
        headers = {**who.headers, **kw.pop("headers", {})}
        response = who.client.request(op[0], path, headers=headers, **kw)
        assert response.is_success, response.text
        if settle is not None:
            settle(response)
        self.done.setdefault(op, set()).add(who.way)
        wanted = WALK[op].actions if expect is None else expect
        new = self.entries()
        assert sorted(e["action"] for e in new) == sorted(wanted), (op, who.way, new)
        for entry in new:
            if attributed is None or entry["action"] in attributed:
                assert entry.get("actorUserId") == who.user_id, (op, who.way, entry)
                assert entry.get("actorKeyId") == who.key_id, (op, who.way, entry)
                assert entry.get("workspaceId") == self.ws, (op, who.way, entry)
        return response, new

    def only(self, new: list[dict[str, Any]], action: str) -> dict[str, Any]:
        [entry] = [e for e in new if e["action"] == action]
        return entry


def walk_app(root: Path, slug: str, version: str) -> Path:
    """``echo`` (read) answers its input; ``send`` is a write tool; a page for its frame."""
    sources = {
        "echo": "def run(i):\n    return {'echo': i.get('text')}\n",
        "send": "def run(i):\n    return {'sent': i.get('to')}\n",
    }
    docs = {"echo": {"effect": "read"}, "send": {"effect": "write"}}
    app = write_app(root, slug, sources, version=version, docs=docs)
    with (app / "agentserve.app.yaml").open("a") as manifest:  # and pages, for its frame
        manifest.write("pages: ./web\n")
    (app / "web").mkdir()
    (app / "web" / "index.html").write_text("<p>walk</p>")
    return app


def files_of(app: Path) -> dict[str, str]:
    return {p: base64.b64encode(b).decode() for p, b in read_app_dir(app).items()}


def _mcp_result(response: httpx.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("application/json"):
        return dict(response.json()["result"])
    for line in response.text.splitlines():
        if line.startswith("data: ") and '"result"' in line:
            return dict(json.loads(line[6:])["result"])
    raise AssertionError(response.text)


def test_every_operation_leaves_its_entry_naming_who_did_it(daemon: Daemon, tmp_path: Path) -> None:
    d, ws = daemon, daemon.workspace_id
    w = Walk(d, ws)
    w.entries()  # what came before: the bootstrap (test_the_host_cli_is_attributed)
    admin_id = d.call("GET", "/api/v2/session", d.admin_key).json()["userId"]
    listed = d.call("GET", f"/api/v2/workspaces/{ws}/keys", d.admin_key).json()["data"]
    [admin_key_id] = [k["keyId"] for k in listed if d.admin_key.startswith(k["prefix"])]
    key = Who(KEY, d.http, {"X-API-Key": d.admin_key}, admin_id, admin_key_id)
    keys, members = f"/api/v2/workspaces/{ws}/keys", f"/api/v2/workspaces/{ws}/members"
    q = {"workspaceId": ws}

    # A workspace key (a CI pipeline's), and the Manage page signed in with the admin's key.
    made, new = w.do(("POST", KEYS), key, keys, json={"kind": "workspace", "name": "ci"})
    assert w.only(new, "key.create")["detail"]["kind"] == "workspace"
    ci = Who(WS_KEY, d.http, {"X-API-Key": made.json()["apiKey"]}, None,
             made.json()["key"]["keyId"])  # fmt: skip
    browser = d.client()
    signed, new = w.do(("POST", "/api/v2/session"), Who(KEY, browser, {}, admin_id, admin_key_id),
                       "/api/v2/session", json={"apiKey": d.admin_key})  # fmt: skip
    session_id = w.only(new, "session.create")["detail"]["sessionId"]
    assert session_id.startswith("ses_")
    page = Who(PAGE, browser, {"X-CSRF-Token": signed.json()["csrfToken"]}, admin_id, session_id)

    # Apps: deploy (a key, the workspace key), publish, install, switch, roll back, egress.
    a1, a2, b1 = (walk_app(tmp_path / n, s, v) for n, s, v in
                  (("a1", "walk", "1"), ("a2", "walk", "2"), ("b1", "walk-b", "1")))  # fmt: skip
    deploy = ("POST", "/api/v2/apps/deploy")
    w.do(deploy, key, "/api/v2/apps/deploy", params=q, json={"files": files_of(a1)})
    w.do(deploy, ci, "/api/v2/apps/deploy", params=q, json={"files": files_of(a2)})
    w.do(deploy, key, "/api/v2/apps/deploy", params=q, json={"files": files_of(b1)})
    publish = ("POST", "/api/v2/apps/{appSlug}/versions/{version}/publish")
    for who, (slug, version) in (
        (key, ("walk", "1")),
        (page, ("walk", "2")),
        (ci, ("walk-b", "1")),
    ):
        w.do(publish, who, f"/api/v2/apps/{slug}/versions/{version}/publish", params=q)
    installs = ("POST", "/api/v2/apps/installs")
    made, new = w.do(installs, key, "/api/v2/apps/installs", params=q,
                     json={"appSlug": "walk", "version": "1"})  # fmt: skip
    install = made.json()["installId"]
    assert w.only(new, "app.install")["installId"] == install
    w.do(installs, page, "/api/v2/apps/installs", params=q,
         json={"appSlug": "walk-b", "version": "1"})  # fmt: skip
    base = f"/api/v2/apps/installs/{install}"
    for who in (key, page):
        w.do(("POST", f"{INSTALL}/switch"), who, f"{base}/switch", json={"version": "2"})
        w.do(("POST", f"{INSTALL}/rollback"), who, f"{base}/rollback")
        w.do(("POST", f"{INSTALL}/frame"), who, f"{base}/frame")
        dev = {"files": {"index.html": base64.b64encode(b"<p>dev</p>").decode()}}
        w.do(("PUT", f"{INSTALL}/dev-pages"), who, f"{base}/dev-pages", json=dev)
        w.do(("DELETE", f"{INSTALL}/dev-pages"), who, f"{base}/dev-pages")
    w.do(("PUT", f"{INSTALL}/egress"), key, f"{base}/egress", json={"egress": []})

    # Secrets (never their values), budgets.
    secret = ("PUT", f"{INSTALL}/secrets/{{name}}")
    _, new = w.do(secret, key, f"{base}/secrets/API_TOKEN", json={"value": SECRET_BY_KEY})
    assert w.only(new, "secret.set")["detail"] == {"name": "API_TOKEN"}
    w.do(secret, page, f"{base}/secrets/OTHER_TOKEN", json={"value": SECRET_BY_PAGE})
    gone = ("DELETE", f"{INSTALL}/secrets/{{name}}")
    w.do(gone, key, f"{base}/secrets/OTHER_TOKEN")
    w.do(gone, page, f"{base}/secrets/API_TOKEN")
    w.do(("PUT", f"{INSTALL}/budget"), key, f"{base}/budget", json={"monthlyMs": 3_600_000})
    w.do(("PUT", f"{INSTALL}/budget"), page, f"{base}/budget", json={"monthlyMs": None})

    # Who approves an app's relay calls, and the approvals webhook (gone before any call
    # is held, so nothing is delivered).
    rules, hook = f"/api/v2/workspaces/{ws}/approval-rules/walk", f"/api/v2/workspaces/{ws}/webhook"
    for who, roles in ((key, ["builder"]), (page, ["admin"])):
        _, new = w.do(("PUT", RULES), who, rules, json={"roles": roles})
        assert w.only(new, "approval_rule.set")["detail"]["roles"] == roles
        w.do(("DELETE", RULES), who, rules)
    for who in (key, page):  # the entry has the URL's origin, never its path or secret
        made, new = w.do(("PUT", WEBHOOK), who, hook, json={"url": "http://127.0.0.1:9/h00k"})
        assert "h00k" not in json.dumps(new) and made.json()["secret"] not in json.dumps(new)
        w.do(("DELETE", WEBHOOK), who, hook)

    # A Git deploy (its entry names the repository, never the secret), and a signed push.
    repo = walk_app(tmp_path / "repo", "walk-git", "1")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}  # fmt: skip
    for args in (("init", "-q", "-b", "main"), ("add", "-A"), ("commit", "-q", "-m", "one")):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, env=env,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    git_deploy = f"/api/v2/workspaces/{ws}/git-deploys/walk-git"
    made, new = w.do(("PUT", GIT_DEPLOY), key, git_deploy, json={"repository": str(repo)})
    assert made.json()["secret"] not in json.dumps(new)
    assert w.only(new, "git_deploy.set")["detail"]["repository"] == str(repo)
    pushed = json.dumps({"ref": "refs/heads/main", "after": commit}).encode()
    mac = hmac.new(made.json()["secret"].encode(), pushed, hashlib.sha256).hexdigest()
    server = Who(GIT_SERVER, d.http, {"X-Hub-Signature-256": f"sha256={mac}",
                                      "Content-Type": "application/json"}, None, None)  # fmt: skip
    _, new = w.do(("POST", "/api/v2/apps/{appSlug}/git-webhook"), server,
                  "/api/v2/apps/walk-git/git-webhook", params=q, content=pushed)  # fmt: skip
    assert w.only(new, "app.deploy")["detail"]["commit"] == commit
    w.do(("DELETE", GIT_DEPLOY), key, git_deploy)

    # Tools: a check leaves nothing; a read tool runs; write tools from chat are held.
    check = ("POST", f"{INSTALL}/tools/{{toolName}}/check")
    for who in (key, page):
        w.do(check, who, f"{base}/tools/echo/check", json={"input": {"text": INPUT_MARK}})
    run = ("POST", f"{INSTALL}/tools/{{toolName}}/run")
    ran, new = w.do(run, key, f"{base}/tools/echo/run", json={"input": {"text": INPUT_MARK}})
    assert ran.json()["status"] == "succeeded", ran.text
    assert ran.json()["output"] == {"echo": INPUT_MARK}
    assert w.only(new, "tool.run")["surface"] == "api"
    ran, new = w.do(run, page, f"{base}/tools/echo/run",  # the page's test-run form
                    json={"input": {"text": INPUT_MARK}, "surface": "test"})  # fmt: skip
    assert w.only(new, "tool.run")["surface"] == "test"
    # A chat client's token (bound to chat: a session or a personal key proves no chat).
    chat_token = {"kind": "token", "scopes": ["tools:run"], "surface": "chat"}
    made, new = w.do(("POST", KEYS), page, keys, json=chat_token)
    assert w.only(new, "key.create")["detail"]["surface"] == "chat"
    chat = Who(KEY, d.client(), {"X-API-Key": made.json()["apiKey"]}, admin_id,
               made.json()["key"]["keyId"])  # fmt: skip
    held: dict[str, str] = {}  # who asked -> the approval

    def ask(op: tuple[str, str], who: Who, path: str, label: str) -> None:
        body = {"input": {"to": INPUT_MARK}, "surface": "chat"}
        answer, new = w.do(op, who, path, json=body, expect=("approval.request",))
        assert answer.status_code == 202, answer.text
        entry = w.only(new, "approval.request")
        assert entry["detail"]["approvalId"] == answer.json()["approvalId"]
        held[label] = answer.json()["approvalId"]

    ask(run, chat, f"{base}/tools/send/run", "chat")
    ask(("POST", "/api/v2/apps/tools/{appSlug}/{toolName}/run"), chat,
        "/api/v2/apps/tools/walk/send/run?workspaceId=" + ws, "by reference")  # fmt: skip
    ask(run, chat, f"{base}/tools/send/run", "chat again")

    # MCP: the handshake leaves nothing; a write tool's call is held for approval.
    mcp = f"/mcp?workspaceId={ws}"
    bearer = {"Authorization": f"Bearer {d.admin_key}", "Accept": STREAMS}
    agent = Who(KEY, d.client(), bearer, admin_id, admin_key_id)
    opened, _ = w.do(("POST", "/mcp"), agent, mcp, expect=(), json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": MCP_REVISION, "capabilities": {},
            "clientInfo": {"name": "audit-walk", "version": "1"}}})  # fmt: skip
    on = {"Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": MCP_REVISION}
    w.do(("POST", "/mcp"), agent, mcp, expect=(), headers=on,
         json={"jsonrpc": "2.0", "method": "notifications/initialized"})  # fmt: skip
    called, new = w.do(("POST", "/mcp"), agent, mcp, headers=on, json={
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "walk__send", "arguments": {"to": INPUT_MARK}}})  # fmt: skip
    assert _mcp_result(called)["isError"] is True  # waits for approval: no run
    entry = w.only(new, "approval.request")
    assert entry["surface"] == "chat"
    held["mcp"] = entry["detail"]["approvalId"]
    w.do(("DELETE", "/mcp"), agent, mcp, headers=on)

    # Decisions, each way; an approved call runs at once, attributed to who asked.
    def approve(who: Who, approval_id: str, asker: Who) -> None:
        def ended(answer: httpx.Response) -> None:
            assert d.ended_run(answer.json()["runId"])["run"]["status"] == "succeeded"

        _, new = w.do(("POST", "/api/v2/approvals/{approvalId}/approve"), who,
                      f"/api/v2/approvals/{approval_id}/approve", settle=ended,
                      attributed=("approval.approve",))  # fmt: skip
        assert w.only(new, "approval.approve")["detail"] == {"approvalId": approval_id}
        ran = w.only(new, "tool.run")
        assert (ran["actorUserId"], ran["actorKeyId"], ran["workspaceId"]) == (
            asker.user_id, asker.key_id, ws)  # fmt: skip

    approve(key, held["chat"], chat)
    approve(page, held["by reference"], chat)
    deny = ("POST", "/api/v2/approvals/{approvalId}/deny")
    w.do(deny, page, f"/api/v2/approvals/{held['chat again']}/deny")
    w.do(deny, key, f"/api/v2/approvals/{held['mcp']}/deny")
    for who in (key, page):
        w.do(("POST", "/api/v2/audit/verify"), who, "/api/v2/audit/verify", params=q)

    # People and keys: the person acted on is in detail.userId, never the actor.
    put = ("PUT", MEMBERS)
    _, new = w.do(put, key, members, json={"email": "p1@example.com", "role": "member"})
    p1 = w.only(new, "member.set")["detail"]["userId"]
    _, new = w.do(put, key, members, json={"email": "p2@example.com"})
    p2 = w.only(new, "member.set")["detail"]["userId"]
    _, new = w.do(put, page, members, json={"email": "p1@example.com", "role": "builder"})
    assert w.only(new, "member.set")["detail"]["role"] == "builder"
    made, new = w.do(("POST", KEYS), key, keys,
                     json={"kind": "personal", "email": "p1@example.com"})  # fmt: skip
    assert w.only(new, "key.create")["detail"]["userId"] == p1
    p1_key, p1_key_id = made.json()["apiKey"], made.json()["key"]["keyId"]
    made, new = w.do(("POST", KEYS), page, keys, json={"kind": "token", "scopes": ["api:read"]})
    assert w.only(new, "key.create")["detail"]["userId"] == admin_id
    token_id, token_key = made.json()["key"]["keyId"], made.json()["apiKey"]

    # Runs refused before the call (a token without tools:run, a workspace key) are
    # audited as every refusal of a call is, once the install is known; not a stranger's.
    stranger = d.store()
    try:
        nobody = stranger.ensure_user("stranger@example.com").id
        strange = stranger.create_key(kind="token", user_id=nobody, scopes=("api:read",))[1]
    finally:
        stranger.close()
    for plaintext, reason, by in (
        (token_key, "INSUFFICIENT_SCOPE", (admin_id, token_id)),
        (ci.headers["X-API-Key"], "WORKSPACE_KEY_NOT_ALLOWED", (None, ci.key_id)),
        (strange, "INSUFFICIENT_SCOPE", None),
    ):
        refused = d.call("POST", f"{base}/tools/echo/run", plaintext,
                         json={"input": {"text": INPUT_MARK}})  # fmt: skip
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["details"]["code"] == reason
        found = [(e["action"], e.get("reason"), e.get("actorUserId"), e.get("actorKeyId"),
                  e.get("installId"), e.get("tool")) for e in w.entries()]  # fmt: skip
        assert found == ([] if by is None else [("tool.refuse", reason, *by, install, "echo")])

    # Their sign-ins: with their key, and with a sign-in link (no key: null).
    theirs = Who(KEY, d.client(), {}, p1, p1_key_id)
    _, new = w.do(("POST", "/api/v2/session"), theirs, "/api/v2/session", json={"apiKey": p1_key})
    assert w.only(new, "session.create")["detail"]["via"] == "api_key"
    link = run_cli("admin", "login-link", "--email", "p1@example.com", "--json", env=d.env)
    assert link.returncode == 0, link.stderr
    made_link = w.entries()
    assert [(e["action"], e["actorUserId"], e.get("actorKeyId"), e["detail"]) for e in made_link
            ] == [("login_link.create", CLI, None, {"userId": p1})]  # fmt: skip
    token = json.loads(link.stdout)["url"].split("#token=", 1)[1]
    by_link = Who(LINK, d.client(), {}, p1, None)
    _, new = w.do(("POST", "/api/v2/session"), by_link, "/api/v2/session",
                  json={"loginToken": token})  # fmt: skip
    assert w.only(new, "session.create")["detail"]["via"] == "login_link"

    revoke = ("DELETE", f"{KEYS}/{{keyId}}")
    _, new = w.do(revoke, page, f"{keys}/{p1_key_id}")  # from the People page
    ended = w.only(new, "key.revoke")["detail"]
    assert ended["keyId"] == p1_key_id and len(ended["sessionsEnded"]) == 1
    w.do(revoke, key, f"{keys}/{token_id}")
    remove = ("DELETE", f"{MEMBERS}/{{userId}}")
    _, new = w.do(remove, key, f"{members}/{p2}")
    assert w.only(new, "member.remove")["detail"] == {"userId": p2}
    w.do(remove, page, f"{members}/{p1}")

    # OAuth: a chat client registers, asks (the authorize form, POSTed), the admin
    # consents by key and on the page; each code becomes tokens; the client revokes one.
    client = Who(CLIENT, d.client(follow_redirects=False), {}, None, None)
    callback = "http://127.0.0.1:9/callback"
    registered, _ = w.do(("POST", "/oauth/register"), client, "/oauth/register", json={
        "redirect_uris": [callback], "client_name": "walk", "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"]})  # fmt: skip
    client_id = registered.json()["client_id"]
    for consenting in (key, page):
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(
            hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")  # fmt: skip
        asked = client.client.post("/oauth/authorize", data={
            "response_type": "code", "client_id": client_id, "redirect_uri": callback,
            "code_challenge": challenge, "code_challenge_method": "S256", "state": "s",
            "scope": "api:read tools:run"})  # fmt: skip
        assert asked.status_code == 302, asked.text
        w.done.setdefault(("POST", "/oauth/authorize"), set()).add(CLIENT)
        assert w.entries() == []
        rid = parse_qs(urlsplit(asked.headers["location"]).fragment.split("?", 1)[1])
        decided, _ = w.do(
            ("POST", "/api/v2/oauth/requests/{requestId}/decision"), consenting,
            f"/api/v2/oauth/requests/{rid['request'][0]}/decision",
            json={"allow": True, "workspaceId": ws})  # fmt: skip
        code = parse_qs(urlsplit(decided.json()["redirectTo"]).query)["code"][0]
        issued, new = w.do(("POST", "/oauth/token"), client, "/oauth/token", data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": callback,
            "client_id": client_id, "code_verifier": verifier}, attributed=())  # fmt: skip
        entry = w.only(new, "oauth.token.issue")  # for the person who consented
        assert entry["actorUserId"] == admin_id and entry["workspaceId"] == ws, entry
    _, new = w.do(("POST", "/oauth/revoke"), client, "/oauth/revoke", data={
        "token": issued.json()["access_token"], "client_id": client_id},
        attributed=())  # fmt: skip
    assert w.only(new, "oauth.token.revoke")["workspaceId"] == ws

    # Signing out ends the session, by the session.
    _, new = w.do(("DELETE", "/api/v2/session"), page, "/api/v2/session")
    assert w.only(new, "session.end")["detail"] == {"sessionId": session_id}
    assert browser.get("/api/v2/session").status_code == 401

    walked = {op: ways for op, ways in w.done.items()}
    assert walked == {op: set(e.ways) for op, e in WALK.items()}, walked

    # Nothing secret, and nothing that went in or out of a run, is in the trail.
    trail = msgspec.json.encode(every_entry(d)).decode()
    for value in (SECRET_BY_KEY, SECRET_BY_PAGE, INPUT_MARK):
        assert value not in trail
    assert "echo" in trail  # the trail was read: the tool's name is there


# --- the host's CLI -------------------------------------------------------------------------


def every_entry(d: Daemon, after: int = 0) -> list[AuditEntry]:
    """Every workspace's entries after seq ``after``, and those of none (the store)."""
    store = d.store()
    try:
        return store.audit_entries(after_seq=after, limit=100_000)
    finally:
        store.close()


def test_the_host_cli_is_attributed(daemon: Daemon, backend: str, tmp_path: Path) -> None:
    d, ws = daemon, daemon.workspace_id
    # The daemon's own bootstrap (``runnerd admin bootstrap``) opens its trail.
    first = d.call("GET", "/api/v2/audit", d.admin_key,
                   params={"workspaceId": ws, "limit": "3"}).json()["data"]  # fmt: skip
    assert [(e["action"], e["actorUserId"], e.get("actorKeyId"), e["workspaceId"])
            for e in first] == [(a, CLI, None, ws) for a in ADMIN_WALK["bootstrap"].actions
                                ]  # fmt: skip
    seen = every_entry(d)[-1].seq
    done: set[str] = set()

    def admin(
        command: str, *args: str, ok: bool = True, expect: tuple[str, ...] | None = None
    ) -> tuple[Any, list[AuditEntry]]:
        nonlocal seen
        ran = run_cli("admin", command, *args, "--json", env=d.env)
        assert (ran.returncode == 0) == ok, ran.stderr
        new = every_entry(d, seen)
        seen = new[-1].seq if new else seen
        if ok:
            done.add(command)
            wanted = ADMIN_WALK[command].actions if expect is None else expect
            assert {e.action for e in new} == set(wanted), (command, new)
        for e in new:
            assert (e.actor_user_id, e.actor_key_id) == (CLI, None), e
        return (json.loads(ran.stdout) if ok else ran), new

    def where(new: list[AuditEntry]) -> list[tuple[str, str | None]]:
        return sorted((e.action, e.workspace_id) for e in new)

    other, new = admin("bootstrap", "--workspace", "Other", "--email", "bo@example.com")
    there = other["workspaceId"]
    assert where(new) == sorted((a, there) for a in ADMIN_WALK["bootstrap"].actions)
    cy, new = admin("add-person", "--workspace", ws, "--email", "cy@example.com", "--key")
    assert where(new) == [("key.create", ws), ("member.set", ws)]
    assert [e.detail["userId"] for e in new] == [cy["userId"]] * 2
    _, new = admin("set-role", "--workspace", ws, "--email", "cy@example.com", "--role", "builder")
    assert where(new) == [("member.set", ws)] and new[0].detail["role"] == "builder"

    # set-role changes a person of the workspace only: a stranger is refused by name.
    refused, new = admin("set-role", "--workspace", ws, "--email", "nobody@example.com",
                         "--role", "admin", ok=False)  # fmt: skip
    assert refused.returncode == 1 and new == []
    assert "nobody@example.com is not a person of workspace" in refused.stderr, refused.stderr
    people = d.call("GET", f"/api/v2/workspaces/{ws}/members", d.admin_key).json()["data"]
    assert "nobody@example.com" not in {m["email"] for m in people}

    # A personal key acts in every workspace of its person: filed in each.
    admin("add-person", "--workspace", there, "--email", "cy@example.com", expect=("member.set",))
    made, new = admin("create-key", "--email", "cy@example.com")
    assert where(new) == sorted([("key.create", there), ("key.create", ws)])
    assert {e.detail["keyId"] for e in new} == {made["keyId"]}
    _, new = admin("token", "--email", "cy@example.com", "--scope", "api:read")
    assert where(new) == sorted([("key.create", there), ("key.create", ws)])
    ci, new = admin("workspace-key", "--workspace", ws)
    assert where(new) == [("key.create", ws)]
    _, new = admin("login-link", "--email", "cy@example.com")
    assert where(new) == sorted([("login_link.create", there), ("login_link.create", ws)])
    assert {e.detail["userId"] for e in new} == {cy["userId"]}
    _, new = admin("revoke-key", made["keyId"])
    assert where(new) == sorted([("key.revoke", there), ("key.revoke", ws)])
    _, new = admin("revoke-key", ci["keyId"])
    assert where(new) == [("key.revoke", ws)]
    _, new = admin("rotate-secrets-key")
    assert where(new) == [("secrets.rotate_key", None)]  # every workspace's secrets

    # The store's own commands leave nothing.
    admin("migrate")
    walked = set(WALKED_ADMIN)
    if backend == "sqlite":  # PostgreSQL's backups are its own (pg_dump)
        admin("backup", "--to", str(tmp_path / "backup.db"))
    else:
        walked.discard("backup")
    assert done == {*(c for c, e in ADMIN_WALK.items() if e.actions), *walked}
