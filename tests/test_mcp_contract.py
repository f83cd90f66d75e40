"""MCP's contract in process: the official MCP SDK's client against the daemon's own app
(tests/inproc.py), for what runs no tool: the tool list, refusals before the SDK, sessions
bound to the key and the person that opened them, tools-changed events.

The client runs on the app's event loop and reaches it through a streaming ASGI transport
(an event stream stays open as it does over a port). Calls that run a tool, the stdio
bridge and the SDK's lazy load (a process's memory) are in tests/test_mcp.py, on a real
daemon."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import anyio.from_thread
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from daemon import Runnerd
from inproc import CLIENT, InProcess
from test_governance import audit
from test_mcp import EXAMPLE, HANDSHAKE, OFFER, ship_apps

# The tests run on both stores.
BACKENDS = ("sqlite", "postgresql")
STREAMS = "application/json, text/event-stream"


@pytest.fixture(scope="module")
def installs(app_daemon: InProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return ship_apps(app_daemon, tmp_path_factory)


# --- the SDK's client, in process -------------------------------------------------------------


class _Body(httpx2.AsyncByteStream):
    """An answer's body as the app writes it; closed, it tells the app its client left."""

    def __init__(self, chunks: asyncio.Queue[bytes | None], left: asyncio.Event) -> None:
        self._chunks = chunks
        self._left = left

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self._chunks.get()) is not None:
            yield chunk

    async def aclose(self) -> None:
        self._left.set()


class _Streaming(httpx2.AsyncBaseTransport):
    """httpx2's ASGI transport, streaming: an answer's head comes back when the app sends
    it, and its body as the app writes it (httpx2.ASGITransport waits for the whole
    answer, and an MCP event stream never ends). On the app's own event loop."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for (k, v) in request.headers.raw],
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port),
            "client": CLIENT,
            "root_path": "",
        }
        head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = (
            asyncio.get_running_loop().create_future()
        )
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        left = asyncio.Event()
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                head.set_result((message["status"], message.get("headers", [])))
            elif message["type"] == "http.response.body" and not left.is_set():
                if message.get("body"):
                    chunks.put_nowait(message["body"])
                if not message.get("more_body", False):
                    chunks.put_nowait(None)

        async def serve() -> None:
            try:
                await self._app(scope, receive, send)
            finally:
                if not head.done():
                    head.set_exception(
                        RuntimeError(f"no answer to {request.method} {scope['path']}")
                    )
                chunks.put_nowait(None)

        serving = asyncio.ensure_future(serve())
        try:
            status, headers = await head
        except BaseException:
            left.set()
            serving.cancel()
            raise
        return httpx2.Response(status, headers=headers, stream=_Body(chunks, left))


def _portal(d: InProcess) -> tuple[Any, anyio.from_thread.BlockingPortal]:
    """The app and the portal of its event loop. tests/inproc.py's transport holds them."""
    transport: Any = d._transport
    return transport._asgi.app, transport._portal


def _http(d: InProcess, key: str | None = None) -> httpx2.AsyncClient:
    """An httpx2 client of the in-process app with ``key`` (the admin's unless given),
    for the app's event loop."""
    app, _ = _portal(d)
    headers = {"Authorization": f"Bearer {key or d.admin_key}"}
    timeout = httpx2.Timeout(30, read=60)
    return httpx2.AsyncClient(
        transport=_Streaming(app), base_url=d.url, headers=headers, timeout=timeout
    )


def _client(d: InProcess, key: str | None = None, **kw: Any) -> Client:
    url = f"{d.url}/mcp?workspaceId={d.workspace_id}"
    return Client(streamable_http_client(url, http_client=_http(d, key)), **kw)


def _run(d: InProcess, work: Callable[[], Awaitable[Any]]) -> Any:
    """``work`` on the app's event loop, to its end."""
    return _portal(d)[1].call(work)


def _start(d: InProcess, work: Callable[[], Awaitable[Any]]) -> Future[Any]:
    """``work`` on the app's event loop, started; its outcome comes later."""
    return _portal(d)[1].start_task_soon(work)


# --- raw requests on a session ----------------------------------------------------------------


def _mcp_path(d: Runnerd, workspace_id: str | None = None) -> str:
    return f"/mcp?workspaceId={workspace_id or d.workspace_id}"


def _open_session(d: Runnerd, key: str) -> str:
    """An MCP session opened over the handshake with ``key``: its Mcp-Session-Id."""
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": HANDSHAKE,
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    headers = {"Authorization": f"Bearer {key}", "Accept": STREAMS}
    opened = d.fresh("POST", _mcp_path(d), json=init, headers=headers)
    assert opened.status_code == 200, opened.text
    session_id = opened.headers["mcp-session-id"]
    ready = _on_session(d, key, session_id, "POST", "notifications/initialized")
    assert ready.status_code == 202, ready.text
    return session_id


def _session_headers(key: str, session_id: str, accept: str = STREAMS) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {key}",
        "Accept": accept,
        "Mcp-Session-Id": session_id,
        "Mcp-Protocol-Version": HANDSHAKE,
    }


def _on_session(
    d: Runnerd,
    key: str,
    session_id: str,
    method: str,
    rpc: str = "tools/list",
    workspace_id: str | None = None,
) -> Any:
    body: dict[str, Any] | None = None
    if method == "POST":
        body = {"jsonrpc": "2.0", "method": rpc}
        if not rpc.startswith("notifications/"):
            body |= {"id": 2, "params": {}}
    headers = _session_headers(key, session_id)
    return d.fresh(method, _mcp_path(d, workspace_id), json=body, headers=headers)


def _rpc_result(response: Any) -> dict[str, Any]:
    """The JSON-RPC result of a POST answered as JSON or as an SSE stream."""
    assert response.status_code == 200, response.text
    if response.headers["content-type"].startswith("application/json"):
        return dict(response.json()["result"])
    for line in response.text.splitlines():
        if line.startswith("data: ") and '"result"' in line:
            return dict(json.loads(line[6:])["result"])
    raise AssertionError(response.text)


def _hold_the_stream(d: InProcess, key: str, session_id: str, seen: list[str]) -> Future[Any]:
    """The session's GET event stream, held open on the app's loop until the app ends it:
    ``seen`` gets "open STATUS" once it is open, "ended" once it ended."""

    async def hold() -> None:
        headers = _session_headers(key, session_id, "text/event-stream")
        async with _http(d, key) as http, http.stream("GET", _mcp_path(d), headers=headers) as got:
            seen.append(f"open {got.status_code}")
            async for _ in got.aiter_bytes():
                pass
        seen.append("ended")

    holding = _start(d, hold)
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen == ["open 200"]
    return holding


def _key_id(d: Runnerd, plaintext: str) -> str:
    listed = d.call("GET", f"/api/v2/workspaces/{d.workspace_id}/keys", d.admin_key).json()["data"]
    [found] = [k["keyId"] for k in listed if plaintext.startswith(k["prefix"])]
    return str(found)


# --- the tool list ----------------------------------------------------------------------------


@pytest.mark.smoke
def test_list_tools_names_annotations_and_schemas(
    app_daemon: InProcess, installs: dict[str, str]
) -> None:
    async def work() -> Any:
        async with _client(app_daemon) as client:
            return await client.list_tools()

    tools = {t.name: t for t in _run(app_daemon, work).tools}
    score = tools["deal-desk__score_offer"]
    assert score.title == "deal-desk/score_offer"
    assert score.input_schema["required"] == [
        "discountPct",
        "marginPct",
        "termMonths",
        "dealSize",
        "tier",
    ]
    assert score.output_schema and "decision" in score.output_schema["properties"]
    assert score.annotations.read_only_hint is True and not score.annotations.destructive_hint
    post = tools["ledger__post_entry"].annotations
    assert post.destructive_hint is True and post.read_only_hint is False
    assert "runnerd.approval" in tools


def test_switching_sends_tools_list_changed(
    app_daemon: InProcess, installs: dict[str, str], tmp_path: Path
) -> None:
    d = app_daemon
    v2 = tmp_path / "deal-desk"
    shutil.copytree(EXAMPLE, v2)
    manifest = v2 / "agentserve.app.yaml"
    manifest.write_text("version: 'mcp-2'\n" + manifest.read_text())
    answer = d.deploy(v2)
    assert answer.status_code == 201, answer.text
    deployed = answer.json()["version"]["version"]
    d.call(
        "POST",
        f"/api/v2/apps/deal-desk/versions/{deployed}/publish",
        d.admin_key,
        params={"workspaceId": d.workspace_id},
    )

    async def work() -> Any:
        async with _client(d) as client, client.listen(tools_list_changed=True) as events:
            switched = await asyncio.to_thread(
                d.call,
                "POST",
                f"/api/v2/apps/installs/{installs['deal-desk']}/switch",
                d.admin_key,
                json={"version": deployed},
            )
            assert switched.status_code == 200, switched.text
            return await asyncio.wait_for(events.__anext__(), 10)

    event = _run(d, work)
    assert type(event).__name__ == "ToolsListChanged"


# --- who may ask ------------------------------------------------------------------------------


def test_workspace_keys_and_bad_keys_are_refused(
    app_daemon: InProcess, installs: dict[str, str]
) -> None:
    d = app_daemon
    path = _mcp_path(d)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    workspace_key = d.key(kind="workspace", workspace_id=d.workspace_id)
    refused = d.fresh("POST", path, json=body, headers={"Authorization": f"Bearer {workspace_key}"})
    assert refused.status_code == 403
    assert refused.json()["error"]["details"]["code"] == "WORKSPACE_KEY_NOT_ALLOWED"
    assert d.fresh("POST", path, json=body).status_code == 401
    assert d.fresh("POST", path, json=body, headers={"X-API-Key": "rk_p_nope"}).status_code == 401
    other = d.fresh("POST", "/mcp", json=body, headers={"X-API-Key": d.admin_key})
    assert other.status_code == 400


# --- sessions follow their key and their person -----------------------------------------------


def test_an_mcp_session_answers_only_the_key_that_opened_it(
    app_daemon: InProcess, installs: dict[str, str]
) -> None:
    """Another person's key (an admin's too) with A's Mcp-Session-Id gets 404 on POST,
    GET and DELETE before the SDK sees it, and A's session still works after."""
    d = app_daemon
    alice = d.person("mcp-owner@example.com")
    bob = d.person("mcp-other@example.com")
    session_id = _open_session(d, alice)
    for key in (bob, d.admin_key):
        for method in ("POST", "GET", "DELETE"):
            refused = _on_session(d, key, session_id, method)
            assert refused.status_code == 404, (method, refused.text)
            assert refused.json()["error"]["message"] == "Session not found"
    # The same key in another workspace is another session: not this one.
    store = d.store()
    try:
        elsewhere = store.create_workspace("Elsewhere").id
        owner = store.find_key(alice)
        assert owner is not None and owner.user_id is not None
        store.set_membership(elsewhere, owner.user_id, role="member", apps_access=True)
    finally:
        store.close()
    moved = _on_session(d, alice, session_id, "POST", workspace_id=elsewhere)
    assert moved.status_code == 404
    doubled = d.fresh(
        "POST",
        _mcp_path(d),
        json={"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}},
        headers=[
            ("Authorization", f"Bearer {alice}"),
            ("Accept", STREAMS),
            ("Mcp-Session-Id", "not-hers"),
            ("Mcp-Session-Id", session_id),
        ],
    )
    assert doubled.status_code == 400
    assert doubled.json()["error"]["details"]["code"] == "DUPLICATE_SESSION_ID"

    tools = _rpc_result(_on_session(d, alice, session_id, "POST"))["tools"]
    assert "deal-desk__score_offer" in {t["name"] for t in tools}
    assert _on_session(d, alice, session_id, "DELETE").status_code == 200
    assert _on_session(d, alice, session_id, "POST").status_code == 404


def test_revoking_a_key_ends_its_mcp_sessions_and_streams(
    app_daemon: InProcess, installs: dict[str, str]
) -> None:
    """A session opened with a key, its open GET stream, and a 2026-era listen stream
    all end when an admin revokes the key; the session's next request is 401 (and the
    session id is gone for any key)."""
    d = app_daemon
    key = d.person("mcp-revoked@example.com")
    key_id = _key_id(d, key)
    session_id = _open_session(d, key)
    seen: list[str] = []
    holding = _hold_the_stream(d, key, session_id, seen)

    async def listen_then_revoke() -> str:
        async with _client(d, key) as client, client.listen(tools_list_changed=True) as events:
            revoked = await asyncio.to_thread(
                d.call,
                "DELETE",
                f"/api/v2/workspaces/{d.workspace_id}/keys/{key_id}",
                d.admin_key,
            )
            assert revoked.status_code == 200, revoked.text
            try:
                await asyncio.wait_for(events.__anext__(), 15)
            except StopAsyncIteration:
                return "ended"
            except TimeoutError:
                return "still open"
            except Exception as exc:  # the SDK's word for a stream cut by the server
                return f"ended: {type(exc).__name__}"
            return "an event"

    try:
        outcome = _run(d, listen_then_revoke)
    except Exception as exc:  # leaving the client may raise too, once the key is dead
        outcome = f"ended: {type(exc).__name__}"
    assert outcome.startswith("ended"), outcome
    holding.result(15)
    assert seen == ["open 200", "ended"]
    assert _on_session(d, key, session_id, "POST").status_code == 401
    assert _on_session(d, d.admin_key, session_id, "POST").status_code == 404
    [entry] = [e for e in audit(d, action="key.revoke") if e["detail"]["keyId"] == key_id]
    assert entry["actorUserId"] is not None


def test_mcp_rights_follow_the_person_at_once(
    app_daemon: InProcess, installs: dict[str, str]
) -> None:
    """Demoted to viewer: nothing to run, on an open session and a new client alike.
    Taken out of the workspace: the next request is 403, the session's stream ends, and
    the session is gone even once the person is back."""
    d = app_daemon
    base = f"/api/v2/workspaces/{d.workspace_id}"
    key = d.person("mcp-demoted@example.com")
    session_id = _open_session(d, key)
    listed = _rpc_result(_on_session(d, key, session_id, "POST"))["tools"]
    assert "deal-desk__score_offer" in {t["name"] for t in listed}

    def set_role(role: str) -> None:
        body = {"email": "mcp-demoted@example.com", "role": role, "appsAccess": True}
        assert d.call("PUT", f"{base}/members", d.admin_key, json=body).status_code == 200

    set_role("viewer")
    assert _rpc_result(_on_session(d, key, session_id, "POST"))["tools"] == []

    async def call() -> Any:
        async with _client(d, key) as client:
            return await client.call_tool("deal-desk__score_offer", OFFER)

    refused = _run(d, call)
    assert refused.is_error
    assert refused.meta["runnerd/error"]["reason"] == "INSUFFICIENT_WORKSPACE_ROLE"

    seen: list[str] = []
    holding = _hold_the_stream(d, key, session_id, seen)
    members = d.call("GET", f"{base}/members", d.admin_key).json()["data"]
    user_id = next(m["userId"] for m in members if m["email"] == "mcp-demoted@example.com")
    assert d.call("DELETE", f"{base}/members/{user_id}", d.admin_key).status_code == 200
    gone = _on_session(d, key, session_id, "POST")
    assert gone.status_code == 403
    assert gone.json()["error"]["details"]["code"] == "INSUFFICIENT_WORKSPACE_ROLE"
    holding.result(15)
    assert seen == ["open 200", "ended"]
    set_role("member")
    assert _on_session(d, key, session_id, "POST").status_code == 404
