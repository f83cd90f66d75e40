"""MCP sessions, capped: per person (over all their keys) and per workspace, the least
recently used ended past a cap (idle ones first), so a client that leaks sessions loses
only its own and is never locked out, and another person still connects; 503
``MCP_SESSIONS_FULL`` only when every session of the workspace is in use. Idle sessions
expire. And the rate limit counts calls (``tools/call``), not transport messages.

The daemon's app in process (tests/inproc.py), raw HTTP and the official SDK's client."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER

from inproc import InProcess
from runnerd.mcp.endpoint import McpEndpoint
from runnerd.mcp.gateway import McpGateway
from runnerd.mcp.sessions import SessionGuard
from test_mcp_contract import (
    _client,
    _hold_the_stream,
    _mcp_path,
    _on_session,
    _open_session,
    _portal,
    _rpc_result,
    _run,
    _session_headers,
)
from test_mcp_transport import INIT

PER_PERSON = 3
PER_WORKSPACE = 6
BURST = 5
IDLE_S = 3
DAEMON_SETTINGS = {
    "mcp_sessions_per_person": str(PER_PERSON),
    "mcp_sessions_per_workspace": str(PER_WORKSPACE),
    "mcp_session_idle_s": str(IDLE_S),
    "rate_limit_burst": str(BURST),
    "rate_limit_per_second": "0.01",  # no token comes back within a test
}


def _gateway(d: InProcess) -> McpGateway:
    """The app's MCP gateway (the SDK is loaded: a test opened a session first)."""
    app, _ = _portal(d)
    endpoint = next(r.app for r in app.routes if getattr(r, "path", "") == "/mcp")
    assert isinstance(endpoint, McpEndpoint) and endpoint.loaded
    assert endpoint._gateway is not None
    return endpoint._gateway.result()


def _guard(d: InProcess) -> SessionGuard:
    return _gateway(d).guard


def _sdk_sessions(d: InProcess) -> int:
    """The sessions the SDK itself holds (its transports), not only the guard's records."""
    return len(_gateway(d).server.session_manager._server_instances)


def _alive(d: InProcess, key: str, session_id: str) -> bool:
    """Whether ``session_id`` still answers (a ping): 404 once it was ended."""
    answer = _on_session(d, key, session_id, "POST", "ping")
    assert answer.status_code in (200, 404), answer.text
    return bool(answer.status_code == 200)


def _user_id(d: InProcess, email: str) -> str:
    store = d.store()
    try:
        return store.ensure_user(email).id
    finally:
        store.close()


def test_past_the_persons_cap_their_least_recently_used_session_ends(
    app_daemon: InProcess,
) -> None:
    d = app_daemon
    email = "leaky@example.com"
    key = d.person(email)
    second_key = d.person(email)  # the same person's other key: one cap for both
    first, second, third = (_open_session(d, key) for _ in range(PER_PERSON))
    assert _alive(d, key, first)  # used again: now second is the least recently used
    fourth = _open_session(d, second_key)
    assert [_alive(d, key, s) for s in (first, second, third)] == [True, False, True]
    assert _alive(d, second_key, fourth)

    # A client that leaks sessions: it keeps opening, it keeps getting in, and the node
    # keeps no more than the cap of them.
    guard = _guard(d)
    before = guard.open_sessions, _sdk_sessions(d)
    latest = [_open_session(d, key if n % 2 else second_key) for n in range(20)]
    assert guard.sessions_of(_user_id(d, email)) == PER_PERSON
    # (fewer, when some of the first ones expired meanwhile)
    assert guard.open_sessions <= before[0] and _sdk_sessions(d) <= before[1]
    assert _alive(d, key if 19 % 2 else second_key, latest[-1])

    # Another person of the workspace is not held up: the SDK's client connects and lists.
    other = d.person("bystander@example.com")

    async def work() -> str:
        async with _client(d, other, mode="legacy") as client:
            await client.list_tools()
            return client.protocol_version

    assert _run(d, work) == "2025-11-25"


def test_past_the_persons_cap_an_idle_session_goes_before_a_streaming_one(
    app_daemon: InProcess,
) -> None:
    """Idle sessions end first; when all of the person's hold a stream, the least
    recently used one's stream is closed and its id is 404: never a refusal."""
    d = app_daemon
    key = d.person("streaming@example.com")
    sessions = [_open_session(d, key) for _ in range(PER_PERSON)]
    seen: list[list[str]] = []
    streams: list[Future[Any]] = []
    for session_id in sessions[:-1]:  # the oldest ones stream; the newest is idle
        seen.append([])
        streams.append(_hold_the_stream(d, key, session_id, seen[-1]))
    newer = _open_session(d, key)
    assert [_alive(d, key, s) for s in sessions] == [True, True, False]
    seen.append([])
    streams.append(_hold_the_stream(d, key, newer, seen[-1]))
    assert all(s == ["open 200"] for s in seen), seen

    assert _alive(d, key, sessions[0]) and _alive(d, key, sessions[1])  # used again

    newest = _open_session(d, key)  # every one streams: the least recently used goes
    streams[-1].result(timeout=10)
    assert seen[-1] == ["open 200", "ended"]
    assert not _alive(d, key, newer)
    assert [_alive(d, key, s) for s in (sessions[0], sessions[1], newest)] == [True] * 3
    for session_id in (sessions[0], sessions[1], newest):
        assert _on_session(d, key, session_id, "DELETE").status_code == 200
    for stream in streams[:-1]:
        stream.result(timeout=10)


def test_past_the_workspaces_cap_an_idle_session_ends_then_503(app_daemon: InProcess) -> None:
    """At the workspace's cap a newcomer ends the least recently used idle session there;
    when every session holds a stream open, the newcomer gets 503 MCP_SESSIONS_FULL, and
    the open ones are untouched."""
    d = app_daemon
    guard = _guard(d)
    # The other tests' sessions are idle past mcp_session_idle_s soon: start from none.
    deadline = time.monotonic() + 3 * IDLE_S
    while guard.open_sessions and time.monotonic() < deadline:
        time.sleep(0.2)
    assert guard.open_sessions == 0
    people = [d.person(f"ws-cap-{n}@example.com") for n in range(3)]
    held: list[tuple[str, str]] = [
        (key, _open_session(d, key)) for key in people[:2] for _ in range(PER_WORKSPACE // 2)
    ]
    assert guard.open_sessions == PER_WORKSPACE
    oldest_key, oldest = held[0]
    newcomer = _open_session(d, people[2])
    assert not _alive(d, oldest_key, oldest)
    assert _alive(d, people[2], newcomer)

    # Every session of the workspace in use (a GET stream held open on each): 503.
    streams: list[Future[Any]] = []
    seen: list[list[str]] = []
    for key, session_id in [*held[1:], (people[2], newcomer)]:
        seen.append([])
        streams.append(_hold_the_stream(d, key, session_id, seen[-1]))
    assert all(s == ["open 200"] for s in seen), seen
    third_person = d.person("ws-cap-late@example.com")
    refused = d.fresh(
        "POST",
        _mcp_path(d),
        json=INIT,
        headers={
            "Authorization": f"Bearer {third_person}",
            "Accept": "application/json, text/event-stream",
        },
    )
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "5"
    error = refused.json()["error"]
    assert error["details"] == {"code": "MCP_SESSIONS_FULL", "scope": "workspace"}, error
    assert MCP_SESSION_ID_HEADER not in refused.headers
    assert all(s == ["open 200"] for s in seen), seen  # no stream was cut for it
    for key, session_id in [*held[1:], (people[2], newcomer)]:
        assert _on_session(d, key, session_id, "DELETE").status_code == 200
    for stream in streams:
        stream.result(timeout=10)


def test_an_idle_session_expires(app_daemon: InProcess) -> None:
    d = app_daemon
    key = d.person("idle@example.com")
    session_id = _open_session(d, key)
    assert _alive(d, key, session_id)
    time.sleep(IDLE_S + 2)  # mcp_session_idle_s, and the SDK's reaping
    assert not _alive(d, key, session_id)


def test_the_rate_limit_counts_calls_not_messages(app_daemon: InProcess) -> None:
    """Pings, tool lists, notifications, handshakes, a GET stream and DELETEs spend
    nothing; the (BURST + 1)th tools/call is 429."""
    d = app_daemon
    key = d.person("chatty@example.com")
    for _ in range(3):  # handshakes, and the initialized notifications
        _on_session(d, key, _open_session(d, key), "DELETE")
    session_id = _open_session(d, key)
    for _ in range(4 * BURST):
        assert _on_session(d, key, session_id, "POST", "ping").status_code == 200
        assert _on_session(d, key, session_id, "POST", "tools/list").status_code == 200
        cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": 99}}  # fmt: skip
        sent = d.fresh("POST", _mcp_path(d), json=cancelled,
                       headers=_session_headers(key, session_id))  # fmt: skip
        assert sent.status_code == 202, sent.text
    seen: list[str] = []
    stream = _hold_the_stream(d, key, session_id, seen)
    assert seen == ["open 200"]

    def call() -> Any:
        body = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "runnerd.approval", "arguments": {"approvalId": "apr_none"}},
        }
        return d.fresh("POST", _mcp_path(d), json=body, headers=_session_headers(key, session_id))

    for _ in range(BURST):
        result = _rpc_result(call())
        assert result["isError"] is True and "APPROVAL_NOT_FOUND" in result["content"][0]["text"]
    limited = call()
    assert limited.status_code == 429, limited.text
    assert limited.json()["error"]["code"] == "RATE_LIMITED"
    assert "retry-after" in limited.headers
    # Still no token for anything else: pings and lists go on.
    assert _on_session(d, key, session_id, "POST", "ping").status_code == 200
    assert _on_session(d, key, session_id, "DELETE").status_code == 200
    stream.result(timeout=10)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("mcp_sessions_per_person", "0"),
        ("mcp_sessions_per_workspace", "10001"),
        ("mcp_session_idle_s", "0"),
        ("mcp_session_idle_s", "nan"),
    ],
)
def test_session_settings_are_bounded(name: str, value: str) -> None:
    from runnerd.config import load_settings
    from runnerd.errors import ConfigError

    with pytest.raises(ConfigError, match=f"invalid setting {name}"):
        load_settings(env={f"RUNNERD_{name.upper()}": value})


def test_the_defaults() -> None:
    from runnerd.config import Settings

    s = Settings()
    assert (s.mcp_sessions_per_person, s.mcp_sessions_per_workspace) == (100, 1000)
    assert s.mcp_session_idle_s == 1800
