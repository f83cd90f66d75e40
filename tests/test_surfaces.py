"""Surfaces proven, not declared (issue 26, part 4): the surface a run is recorded as comes
from its credential (api/surfaces.py), over real HTTP to a real daemon.

- each credential's run is recorded (the run row, the audit's ``tool.run``) as the surface
  it proves: a personal key, a session and the host CLI ``api``, the Manage page's test
  form ``test``, a relay's token ``relay``, a workflow's token ``workflow`` (made with
  ``runnerd admin token --surface``), a chat client's token ``chat``;
- a body naming a surface its credential does not prove is refused (403
  SURFACE_NOT_PROVEN, ``details.field`` ``surface``), audited, and runs nothing; so is an
  ``X-Runnerd-Frame`` header that does not verify;
- a relay's token never gets a write call run without its approval, whatever it claims;
- the keys API binds only tokens, only to relay, workflow or chat.

One test runs tools in real sandboxes (one run per credential); the rest start none."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from conftest import run_cli, write_app
from daemon import Daemon, envelope
from runnerd.api.frames import issue_frame_token

DAEMON_SETTINGS = {"approval_ttl_s": "600"}

ECHO = "def run(i):\n    return {'seen': i.get('n', 0)}\n"
SEND = "def run(i):\n    return {'sent': True}\n"  # a write tool: never runs here
SURFACES = ("app", "chat", "relay", "workflow", "api", "cli", "test")


@pytest.fixture(scope="module")
def install(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An install of ``surf``: ``echo`` (read) and ``send`` (write)."""
    app = write_app(tmp_path_factory.mktemp("surf"), "surf", {"echo": ECHO, "send": SEND},
                    docs={"send": {"effect": "write"}})  # fmt: skip
    return str(daemon.ship(app)["installId"])


@pytest.fixture(scope="module")
def framed(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An install of ``framed``, an app with pages (``web/index.html``) and ``echo``."""
    root = write_app(tmp_path_factory.mktemp("framed"), "framed", {"echo": ECHO})
    (root / "agentserve.app.yaml").write_text(
        "slug: framed\nname: Framed\ntools: ./tools/*\npages: ./web\n"
    )
    (root / "web").mkdir()
    (root / "web" / "index.html").write_text("<!doctype html><title>framed</title>")
    return str(daemon.ship(root)["installId"])


@pytest.fixture(scope="module")
def person(daemon: Daemon) -> str:
    """A member's personal key (Apps access): the person every credential here is of."""
    return daemon.person("mia@example.com", role="member")


def _new_token(daemon: Daemon, surface: str | None, **body: Any) -> httpx.Response:
    """POST a new key of mia's through the keys API (the admin's key)."""
    return daemon.call(
        "POST",
        f"/api/v2/workspaces/{daemon.workspace_id}/keys",
        daemon.admin_key,
        json={"kind": "token", "email": "mia@example.com", "scopes": ["tools:run", "api:read"],
              **({"surface": surface} if surface else {}), **body},
    )  # fmt: skip


def _token(daemon: Daemon, surface: str | None) -> str:
    made = _new_token(daemon, surface)
    assert made.status_code == 201, made.text
    assert made.json()["key"].get("surface") == surface
    return str(made.json()["apiKey"])


@contextmanager
def _session(daemon: Daemon, key: str) -> Iterator[httpx.Client]:
    """A Manage-page session of ``key``'s person: a client with its cookie and CSRF token."""
    with daemon.client() as page:
        signed_in = page.post("/api/v2/session", json={"apiKey": key})
        assert signed_in.status_code == 200, signed_in.text
        page.headers["X-CSRF-Token"] = str(signed_in.json()["csrfToken"])
        yield page


def _run(
    daemon: Daemon,
    install: str,
    tool: str,
    *,
    key: str | None = None,
    page: httpx.Client | None = None,
    surface: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """A run of ``tool`` with ``key`` (or ``page``'s session), claiming ``surface`` or
    none: straight over HTTP, no helper choosing a credential."""
    body: dict[str, Any] = {"input": {"n": 1}, **({"surface": surface} if surface else {})}
    path = f"/api/v2/apps/installs/{install}/tools/{tool}/run"
    if page is not None:
        return page.post(path, json=body, headers=headers or {})
    assert key is not None
    return daemon.fresh("POST", path, json=body, headers={"X-API-Key": key, **(headers or {})})


def _audit(daemon: Daemon, action: str) -> list[dict[str, Any]]:
    found = daemon.call(
        "GET",
        "/api/v2/audit",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id, "action": action, "limit": 1000},
    )
    assert found.status_code == 200, found.text
    return list(found.json()["data"])


def _runs(daemon: Daemon, install: str) -> list[dict[str, Any]]:
    found = daemon.call(
        "GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key, params={"limit": 500}
    )
    assert found.status_code == 200, found.text
    return list(found.json()["data"])


def _approvals(daemon: Daemon) -> list[dict[str, Any]]:
    found = daemon.call(
        "GET", "/api/v2/approvals", daemon.admin_key, params={"workspaceId": daemon.workspace_id}
    )
    assert found.status_code == 200, found.text
    return list(found.json()["data"])


def _refused(response: httpx.Response, field: str = "surface") -> None:
    body = envelope(response, 403, "SURFACE_NOT_PROVEN")
    assert body["details"]["field"] == field, body


# --- each credential's surface ---------------------------------------------------------------


@pytest.mark.jail
def test_each_credential_records_the_surface_it_proves(
    daemon: Daemon, install: str, person: str
) -> None:
    """One run per credential, each recorded as the surface its credential proves, in its
    run row and in its ``tool.run`` entry; a claim of that same surface is accepted, and
    ``api`` (the body's default) is no claim at all."""
    made = run_cli(
        "admin", "token", "--email", "mia@example.com", "--scope", "tools:run",
        "--surface", "workflow", "--name", "nightly", "--json", env=daemon.env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["surface"] == "workflow"
    workflow = str(json.loads(made.stdout)["apiKey"])
    relay, chat, plain = _token(daemon, "relay"), _token(daemon, "chat"), _token(daemon, None)
    with _session(daemon, person) as page:
        session_runs = [
            _run(daemon, install, "echo", page=page),
            _run(daemon, install, "echo", page=page, surface="test"),
        ]
    ran: dict[str, str] = {}  # run id -> the surface it must be recorded as
    for response, surface in [
        (_run(daemon, install, "echo", key=person), "api"),
        (_run(daemon, install, "echo", key=person, surface="api"), "api"),
        (_run(daemon, install, "echo", key=plain), "api"),
        (session_runs[0], "api"),
        (session_runs[1], "test"),
        (_run(daemon, install, "echo", key=relay), "relay"),
        (_run(daemon, install, "echo", key=relay, surface="api"), "relay"),
        (_run(daemon, install, "echo", key=workflow, surface="workflow"), "workflow"),
        (_run(daemon, install, "echo", key=chat), "chat"),
    ]:
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "succeeded", response.text
        ran[response.json()["runId"]] = surface
    # The host CLI authenticates with a personal key, like any program: its runs are api.
    by_cli = run_cli(
        "tools", "run", "surf/echo", "--input", '{"n": 2}', "--json",
        env=daemon.client_env(person),
    )  # fmt: skip
    assert by_cli.returncode == 0, by_cli.stderr
    ran[json.loads(by_cli.stdout)["runId"]] = "api"

    for run_id, surface in ran.items():
        assert daemon.ended_run(run_id)["run"]["surface"] == surface, run_id
    entries = {e["detail"]["runId"]: e for e in _audit(daemon, "tool.run") if e.get("detail")}
    assert {run_id: entries[run_id]["surface"] for run_id in ran} == ran
    # The history's surface filter finds them by the proven surface.
    relay_runs = daemon.call(
        "GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key,
        params={"surface": "relay"},
    ).json()["data"]  # fmt: skip
    assert {r["runId"] for r in relay_runs} == {i for i, s in ran.items() if s == "relay"}


@pytest.mark.jail
def test_the_app_bridge_proves_app_for_its_install_and_person_only(
    daemon: Daemon, install: str, framed: str, person: str
) -> None:
    """A frame the person opened (its token, from POST …/frame) with their session
    proves ``app``, for that install: the run row and its ``tool.run`` entry say app.
    The same token on another install, with another person's session, with a key
    instead of a session, or a token no daemon signed, proves nothing: refused, naming
    the header; and a frame's call may not claim test."""
    header = "X-Runnerd-Frame"
    with _session(daemon, person) as page:
        opened = page.post(f"/api/v2/apps/installs/{framed}/frame")
        assert opened.status_code == 201, opened.text
        token = str(opened.json()["token"])
        ran = _run(daemon, framed, "echo", page=page, headers={header: token})
        assert ran.status_code == 200 and ran.json()["status"] == "succeeded", ran.text
        claimed = _run(daemon, framed, "echo", page=page, surface="app", headers={header: token})
        assert claimed.status_code == 200, claimed.text
        runs_before = len(_runs(daemon, install)) + len(_runs(daemon, framed))
        _refused(_run(daemon, install, "echo", page=page, headers={header: token}), header)
        _refused(_run(daemon, framed, "echo", page=page, surface="test", headers={header: token}))
        forged, _ = issue_frame_token(
            b"k" * 32, framed, page.get("/api/v2/session").json()["userId"]
        )
        _refused(_run(daemon, framed, "echo", page=page, headers={header: forged}), header)
    _refused(_run(daemon, framed, "echo", key=person, headers={header: token}), header)
    with _session(daemon, daemon.admin_key) as other:
        _refused(_run(daemon, framed, "echo", page=other, headers={header: token}), header)
    assert len(_runs(daemon, install)) + len(_runs(daemon, framed)) == runs_before

    for run_id in (ran.json()["runId"], claimed.json()["runId"]):
        assert daemon.ended_run(run_id)["run"]["surface"] == "app"
        [entry] = [e for e in _audit(daemon, "tool.run") if e["detail"].get("runId") == run_id]
        assert (entry["surface"], entry["installId"]) == ("app", framed)


# --- claims not proven -----------------------------------------------------------------------


def test_a_claim_the_credential_does_not_prove_is_refused_and_audited(
    daemon: Daemon, install: str, person: str
) -> None:
    """A personal key may claim only api; a session api or test; a bound token api or its
    own surface. Every other claim is 403 SURFACE_NOT_PROVEN naming the field, a
    ``tool.refuse`` entry with the reason, and no run."""
    relay, workflow = _token(daemon, "relay"), _token(daemon, "workflow")
    runs_before = len(_runs(daemon, install))
    seq_before = max((e["seq"] for e in _audit(daemon, "tool.refuse")), default=0)
    count = 0
    for key, proves in [(person, "api"), (relay, "relay"), (workflow, "workflow")]:
        for claim in SURFACES:
            if claim in ("api", proves):
                continue
            _refused(_run(daemon, install, "echo", key=key, surface=claim))
            count += 1
    with _session(daemon, person) as page:
        for claim in ("app", "chat", "relay", "workflow", "cli"):
            _refused(_run(daemon, install, "echo", page=page, surface=claim))
            count += 1
    # The route by reference takes the same rule.
    by_reference = daemon.fresh(
        "POST", "/api/v2/apps/tools/surf/echo/run", params={"workspaceId": daemon.workspace_id},
        json={"input": {}, "surface": "app"}, headers={"X-API-Key": person},
    )  # fmt: skip
    _refused(by_reference)
    count += 1
    # The CLI's claim is the body's: refused, with the API's reason.
    by_cli = run_cli(
        "tools", "run", "surf/echo", "--input", "{}", "--surface", "app",
        env=daemon.client_env(person),
    )  # fmt: skip
    assert by_cli.returncode == 1 and "SURFACE_NOT_PROVEN" in by_cli.stderr, by_cli.stderr
    count += 1

    assert len(_runs(daemon, install)) == runs_before  # nothing ran
    mine = [e for e in _audit(daemon, "tool.refuse") if e["seq"] > seq_before]
    assert [e["reason"] for e in mine] == ["SURFACE_NOT_PROVEN"] * count, mine
    assert {e["installId"] for e in mine} == {install}
    assert {e["tool"] for e in mine} == {"echo"}


def test_a_frame_header_that_does_not_verify_is_refused(
    daemon: Daemon, install: str, person: str
) -> None:
    """``X-Runnerd-Frame`` proves ``app`` only as the app bridge sends it: once, with the
    person's Manage-page session, verified for this install and person. A key with it, a
    token that is no frame's, or two of them, are refused naming the header."""
    header = "X-Runnerd-Frame"
    runs_before = len(_runs(daemon, install))
    _refused(_run(daemon, install, "echo", key=person, headers={header: "x"}), header)
    _refused(
        _run(daemon, install, "echo", key=_token(daemon, "relay"), headers={header: "x"}), header
    )
    with _session(daemon, person) as page:
        _refused(_run(daemon, install, "echo", page=page, headers={header: "not-a-frame"}), header)
        _refused(
            _run(daemon, install, "echo", page=page, surface="app",
                 headers={header: "a.b.c"}), header,
        )  # fmt: skip
        two = page.post(
            f"/api/v2/apps/installs/{install}/tools/echo/run",
            json={"input": {}},
            headers=[(header, "one"), (header, "two")],  # type: ignore[arg-type]
        )
        _refused(two, header)
    assert len(_runs(daemon, install)) == runs_before


# --- the approval is not bypassable ----------------------------------------------------------


def test_a_relay_tokens_write_call_always_waits_for_its_approval(
    daemon: Daemon, install: str, person: str
) -> None:
    """A relay's token calling a write tool: held for approval as a relay call, with no
    surface or with ``api``; claiming any other surface (app, workflow, cli, test: the
    ones whose write calls run at once) is refused and holds nothing; it cannot sign in
    to become a session; and no run starts."""
    relay = _token(daemon, "relay")
    held_before = {a["approvalId"] for a in _approvals(daemon)}
    held: list[str] = []
    for claim in (None, "api", "relay"):
        answer = _run(daemon, install, "send", key=relay, surface=claim)
        assert answer.status_code == 202, answer.text
        held.append(answer.json()["approvalId"])
    by_reference = daemon.fresh(
        "POST", "/api/v2/apps/tools/surf/send/run", params={"workspaceId": daemon.workspace_id},
        json={"input": {}}, headers={"X-API-Key": relay},
    )  # fmt: skip
    assert by_reference.status_code == 202, by_reference.text
    held.append(by_reference.json()["approvalId"])
    for claim in ("app", "workflow", "cli", "test", "chat"):
        _refused(_run(daemon, install, "send", key=relay, surface=claim))
    _refused(
        _run(daemon, install, "send", key=relay, headers={"X-Runnerd-Frame": "x"}),
        "X-Runnerd-Frame",
    )
    # A token cannot sign in: no session of it could claim test.
    envelope(daemon.fresh("POST", "/api/v2/session", json={"apiKey": relay}), 403,
             "PERSONAL_KEY_REQUIRED")  # fmt: skip

    approvals = {a["approvalId"]: a for a in _approvals(daemon)}
    assert set(approvals) - held_before == set(held)
    assert {approvals[a]["surface"] for a in held} == {"relay"}
    assert {approvals[a]["status"] for a in held} == {"pending"}
    assert [r for r in _runs(daemon, install) if r["tool"] == "send"] == []


def _over_mcp(daemon: Daemon, key: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One ``tools/call`` over /mcp with ``key`` (a 2025-11-25 session that offers no
    elicitation): its JSON-RPC result."""
    mcp = f"/mcp?workspaceId={daemon.workspace_id}"
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"}
    with daemon.client(headers=headers) as client:
        opened = client.post(mcp, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "surfaces", "version": "1"}}})  # fmt: skip
        assert opened.status_code == 200, opened.text
        client.headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
        client.headers["Mcp-Protocol-Version"] = "2025-11-25"
        client.post(mcp, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"name": tool, "arguments": arguments}
        called = client.post(
            mcp, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}
        )
        assert called.status_code == 200, called.text
    if called.headers["content-type"].startswith("application/json"):
        return dict(called.json()["result"])
    [line] = [x for x in called.text.splitlines() if x.startswith("data: ") and '"id":2' in x]
    return dict(json.loads(line[6:])["result"])


def test_over_mcp_a_relay_token_is_still_a_relay(daemon: Daemon, install: str, person: str) -> None:
    """MCP's calls are chat calls (the asker approves), but a relay's token stays a relay
    there: its write call is held for the app's approvers, with surface relay, and the
    client is not asked to confirm it. A personal key over MCP is chat, as before."""
    held = _over_mcp(daemon, _token(daemon, "relay"), "surf__send", {})
    meta = held["_meta"]["runnerd/approval"]
    assert held["isError"] is True and meta["status"] == "pending_approval", held
    by_key = _over_mcp(daemon, person, "surf__send", {})
    mine = by_key["_meta"]["runnerd/approval"]
    approvals = {a["approvalId"]: a for a in _approvals(daemon)}
    assert approvals[meta["approvalId"]]["surface"] == "relay"
    assert approvals[mine["approvalId"]]["surface"] == "chat"


# --- binding a token ------------------------------------------------------------------------


def test_only_a_token_is_bound_and_only_to_relay_workflow_or_chat(
    daemon: Daemon, person: str
) -> None:
    """The keys API binds a token to a surface (listed with it, in the key.create entry);
    a personal key with one, or a surface a credential proves otherwise (app, api, cli,
    test), is a 400 that makes no key."""
    keys_before = daemon.call(
        "GET", f"/api/v2/workspaces/{daemon.workspace_id}/keys", daemon.admin_key
    ).json()["data"]
    envelope(_new_token(daemon, "relay", kind="personal", scopes=[]), 400, "INVALID_BODY")
    for surface in ("app", "api", "cli", "test", "telepathy"):
        envelope(_new_token(daemon, surface), 400, "INVALID_BODY")
    keys = daemon.call(
        "GET", f"/api/v2/workspaces/{daemon.workspace_id}/keys", daemon.admin_key
    ).json()["data"]
    assert len(keys) == len(keys_before)

    made = _new_token(daemon, "relay", name="slack relay")
    assert made.status_code == 201, made.text
    key_id = made.json()["key"]["keyId"]
    listed = {
        k["keyId"]: k
        for k in daemon.call(
            "GET", f"/api/v2/workspaces/{daemon.workspace_id}/keys", daemon.admin_key
        ).json()["data"]
    }
    assert listed[key_id]["surface"] == "relay"
    [entry] = [e for e in _audit(daemon, "key.create") if e["detail"]["keyId"] == key_id]
    assert entry["detail"]["surface"] == "relay"
    # The host's CLI refuses what the API refuses.
    refused = run_cli(
        "admin", "token", "--email", "mia@example.com", "--scope", "tools:run",
        "--surface", "app", env=daemon.env,
    )  # fmt: skip
    assert refused.returncode == 2 and "--surface" in refused.stderr
