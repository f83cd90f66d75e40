"""Who may talk MCP, and the sessions they open: the HTTP guard in front of the SDK's
streamable HTTP endpoint (``/mcp?workspaceId=…``).

- Who: a personal API key or token (``Authorization: Bearer …`` or ``X-API-Key``), checked
  on every HTTP request before MCP sees it, and again by each handler (``authorize``);
  workspace keys are refused, as on the API. The request acts in the workspace of the
  ``workspaceId`` query parameter.
- A session (``Mcp-Session-Id``, the 2025 handshake era) is bound to the key and the
  workspace that opened it: any other key, or another workspace, gets 404 before the SDK
  sees the request.
- When the key is revoked or its person leaves the workspace, its sessions are ended and
  its open streams closed (checked every ``MCP_REVOCATION_CHECK_S``).
- Sessions are capped per person (``mcp_sessions_per_person``, over all their keys and
  workspaces) and per workspace (``mcp_sessions_per_workspace``), on this node. A new
  session past the person's cap ends that person's least recently used one (idle ones
  first: no request or stream open): an agent that leaks sessions only ever loses its
  own, and is never locked out. Past the workspace's cap, the person's own least
  recently used session there is ended, else the workspace's least recently used idle
  one; when every session of the workspace is in use, 503 ``MCP_SESSIONS_FULL``. The
  SDK's shared limit (``MAX_MCP_SESSIONS``) stays behind them.
- The rate limit counts calls: only a ``tools/call`` spends a token. Notifications,
  responses, GET streams, DELETE, ``initialize``, ``ping`` and ``tools/list`` do not.
- ``tools_changed``: ``notifications/tools/list_changed`` on each 2025-era session's
  standalone channel (its GET stream); 2026-07-28 clients get theirs on
  ``subscriptions/listen`` (mcp/gateway.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import anyio
from mcp.server.session import ServerSession
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runnerd.api.auth import Caller, bearer_or_key, oauth_challenge
from runnerd.api.errors import envelope, error_response
from runnerd.errors import (
    DuplicateSessionId,
    InsufficientScope,
    InvalidApiKey,
    McpSessionsFull,
    MissingWorkspace,
    RunnerdError,
    Unauthenticated,
)
from runnerd.limits import MCP_NOTIFY_TIMEOUT_S, MCP_REVOCATION_CHECK_S
from runnerd.mcp import RPC_METHOD

if TYPE_CHECKING:
    from runnerd.api.state import AppState

__all__ = ["SPENDING_METHODS", "SessionGuard", "authorize"]

# The JSON-RPC requests that spend a rate-limit token: the calls. The API's limit is per
# call; a client's handshake, pings, tool lists, notifications and streams are not calls.
SPENDING_METHODS = frozenset({"tools/call"})

_NO_SESSION = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Session not found"}}'

log = logging.getLogger(__name__)


async def authorize(state: AppState, request: Request, *, spend: bool) -> tuple[Caller, str]:
    """The caller and workspace of an MCP request: 401, 403, or with ``spend`` (a call)
    429 as on the API. The guard spends, once per call; the handlers do not."""
    plaintext = bearer_or_key(request)
    if not plaintext:
        raise Unauthenticated("Send a personal API key as a Bearer token")
    key = await state.store.io(state.store.find_key, plaintext)
    if key is None:
        raise InvalidApiKey
    caller = Caller(key)
    caller.need_person()
    caller.need_scope("tools:run")
    workspace_id = request.query_params.get("workspaceId", "")
    if not workspace_id:
        raise MissingWorkspace
    await caller.member(state.store, workspace_id, role="viewer")
    if spend:
        state.limiter.take(key.rate_bucket)
    return caller, workspace_id


@dataclass(frozen=True)
class _Grant:
    """What a request or a session acts under: a key, in a workspace."""

    key_id: str
    workspace_id: str


@dataclass(eq=False)
class _Session:
    """A session opened over the handshake: whose it is, and how it is in use."""

    grant: _Grant
    person: str
    in_flight: int = 0
    used: float = field(default_factory=time.monotonic)
    streams: set[anyio.CancelScope] = field(default_factory=set)  # its requests served now
    # The SDK's session once the client said it is initialized: the channel that
    # tools/list_changed goes out on (the session's GET stream).
    notify: ServerSession | None = None
    evicted: bool = False  # ended at a cap

    def lru(self) -> tuple[bool, float]:
        """The order sessions are ended in at a cap: idle ones first, then the least
        recently used."""
        return (self.in_flight > 0, self.used)


class _Watched:
    """The ``send`` of one request, watched: its status, whether it finished."""

    def __init__(self, send: Send, opened: Callable[[str], None] | None = None) -> None:
        self._send = send
        self._opened = opened  # told of a session the answer opens, before it goes out
        self.status: int | None = None
        self.session_id: str | None = None  # the header the SDK set on its answer
        self.done = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            for name, value in message.get("headers", []):
                if name.lower() == MCP_SESSION_ID_HEADER.encode():
                    self.session_id = value.decode("latin-1")
            if self._opened is not None and self.session_id and self.status < 400:
                # Bound before the client can read the id: its next request may come
                # before this one's handler returns.
                self._opened(self.session_id)
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            self.done = True
        await self._send(message)


class SessionGuard:
    """The ASGI app in front of the SDK's ``endpoint``: who may talk MCP at all, the
    sessions bound to their key and workspace, and the watch (``watch``, a task of the
    gateway's) that ends those of revoked keys. ``idle_s``: the SDK's own session idle
    timeout, past which it has ended a session."""

    def __init__(self, state: AppState, endpoint: ASGIApp, idle_s: float | None) -> None:
        self.state = state
        self._endpoint = endpoint
        self._idle_s = idle_s
        self._per_person = state.settings.mcp_sessions_per_person
        self._per_workspace = state.settings.mcp_sessions_per_workspace
        self._sessions: dict[str, _Session] = {}  # Mcp-Session-Id: who opened it
        self._streams: dict[_Grant, set[anyio.CancelScope]] = {}  # requests being served
        # Handshakes under way, counted against the caps until their session is bound:
        # a token of each: (person, workspace).
        self._opening: dict[object, tuple[str, str]] = {}

    @property
    def open_sessions(self) -> int:
        """Sessions open on this node (the handshake era's; 2026-07-28 has none)."""
        return len(self._sessions)

    def sessions_of(self, person: str) -> int:
        return sum(1 for s in self._sessions.values() if s.person == person)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        method = scope.get(RPC_METHOD)
        try:
            caller, workspace_id = await authorize(
                self.state, request, spend=method in SPENDING_METHODS
            )
            session_id = _session_id(request)
        except RunnerdError as exc:
            refused = envelope(exc)
            if refused.status == 401 or isinstance(exc, InsufficientScope):
                # Where to get a token, or a wider one (RFC 9728 §5.1, RFC 6750 §3.1).
                refused.headers["WWW-Authenticate"] = oauth_challenge(
                    self.state.settings, scope_missing=isinstance(exc, InsufficientScope)
                )
            await error_response(refused)(scope, receive, send)
            return
        grant = _Grant(caller.key.id, workspace_id)
        person = caller.need_person()
        session = None if session_id is None else self._sessions.get(session_id)
        if session_id is not None and (session is None or session.grant != grant):
            # Another key's session, or one of another workspace: as if it did not exist.
            await _session_not_found(send)
            return
        opening = object() if session_id is None and method == "initialize" else None
        if opening is not None:
            try:
                ended = self._make_room(person, workspace_id)
            except RunnerdError as exc:
                await error_response(envelope(exc))(scope, receive, send)
                return
            self._opening[opening] = (person, workspace_id)
            for victim in ended:
                await self._terminate(victim)
        opened = None if session_id is not None else partial(self._opened, grant, person, opening)
        watched = _Watched(send, opened)
        if session is not None:
            session.in_flight += 1
        try:
            await self._serve(grant, session, scope, receive, watched)
        finally:
            if opening is not None:
                self._opening.pop(opening, None)
            if session is not None:
                session.in_flight -= 1
                session.used = time.monotonic()
        if session_id is not None and (
            watched.status == 404 or (request.method == "DELETE" and (watched.status or 500) < 400)
        ):
            self._sessions.pop(session_id, None)  # ended by its owner, or by the SDK

    def _opened(self, grant: _Grant, person: str, opening: object, session_id: str) -> None:
        """The handshake opened ``session_id`` for ``grant``, a key of ``person``: it is
        counted as a session from now on, no longer as a handshake under way."""
        self._sessions.setdefault(session_id, _Session(grant, person))
        self._opening.pop(opening, None)

    def _make_room(self, person: str, workspace_id: str) -> list[str]:
        """Room for one more session of ``person`` in ``workspace_id``: the sessions ended
        for it, already forgotten here (the caller terminates them in the SDK), or
        McpSessionsFull when the workspace's are all in use."""
        ended: list[str] = []
        while True:
            mine = [(sid, s) for sid, s in self._sessions.items() if s.person == person]
            waiting = sum(1 for p, _ in self._opening.values() if p == person)
            if len(mine) + waiting < self._per_person:
                break
            if not mine:  # its cap's worth of handshakes at once: the last guard
                raise McpSessionsFull("person")
            ended.append(self._evict(min(mine, key=lambda found: found[1].lru())[0]))
        while True:
            there = [(sid, s) for sid, s in self._sessions.items()
                     if s.grant.workspace_id == workspace_id]  # fmt: skip
            waiting = sum(1 for _, w in self._opening.values() if w == workspace_id)
            if len(there) + waiting < self._per_workspace:
                return ended
            own = [found for found in there if found[1].person == person]
            idle = [found for found in there if not found[1].in_flight]
            pick = own or idle
            if not pick:
                raise McpSessionsFull("workspace")
            ended.append(self._evict(min(pick, key=lambda found: found[1].lru())[0]))

    def _evict(self, session_id: str) -> str:
        """Forget ``session_id`` (404 from now on) and cut its requests and streams."""
        session = self._sessions.pop(session_id)
        session.evicted = True
        for cancel in list(session.streams):
            cancel.cancel()
        log.info("an MCP session was ended at its person's or workspace's cap")
        return session_id

    async def _serve(
        self, grant: _Grant, session: _Session | None, scope: Scope, receive: Receive,
        send: _Watched,
    ) -> None:  # fmt: skip
        """Hand the request to the SDK, cancellable when its grant ends (``_end``) or its
        session is ended at a cap (``_evict``)."""
        with anyio.CancelScope() as cancel:
            streams = self._streams.setdefault(grant, set())
            streams.add(cancel)
            if session is not None:
                session.streams.add(cancel)
            try:
                await self._endpoint(scope, receive, send)
            finally:
                streams.discard(cancel)
                if session is not None:
                    session.streams.discard(cancel)
                if not streams:
                    self._streams.pop(grant, None)
        if not cancel.cancelled_caught or send.done:
            return
        if send.status is None and session is not None and session.evicted:
            await _session_not_found(send)  # as any ended session: the client opens another
        elif send.status is None:
            ended = Unauthenticated("The key was revoked, or left the workspace")
            await error_response(envelope(ended))(scope, receive, send)
        else:  # a stream: end it cleanly
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def watch(self) -> None:
        """Every ``MCP_REVOCATION_CHECK_S``: end the sessions and streams whose key was
        revoked (here, on another node, or by ``runnerd admin revoke-key``) or whose person
        left the workspace, and forget sessions the SDK has let go idle."""
        while True:
            await anyio.sleep(MCP_REVOCATION_CHECK_S)
            state = self.state
            grants = {s.grant for s in self._sessions.values()} | set(self._streams)
            if not grants:
                continue
            pairs = [(g.key_id, g.workspace_id) for g in grants]
            try:
                live = await state.store.io(state.store.live_grants, pairs)
            except Exception as exc:
                # The database is away (PostgreSQL down, SQLite locked): try again next
                # time. Raising would end the task group, and every MCP session with it.
                log.warning("MCP sessions not checked against revoked keys: %r", exc)
                continue
            for grant in grants:
                if (grant.key_id, grant.workspace_id) not in live:
                    await self._end(grant)
            self._forget_idle()

    async def _end(self, grant: _Grant) -> None:
        """End everything ``grant`` holds: its sessions answer 404 from now on (and the
        SDK terminates them), its requests and streams are cut."""
        ended = [sid for sid, s in self._sessions.items() if s.grant == grant]
        for session_id in ended:
            del self._sessions[session_id]
        for cancel in list(self._streams.get(grant, ())):
            cancel.cancel()
        for session_id in ended:
            await self._terminate(session_id)

    async def _terminate(self, session_id: str) -> None:
        """Terminate a session in the SDK as its client would: a DELETE with its id."""
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "DELETE",
            "scheme": "http",
            "path": "/mcp",
            "raw_path": b"/mcp",
            "root_path": "",
            "query_string": b"",
            "headers": [(MCP_SESSION_ID_HEADER.encode(), session_id.encode())],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
        }

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            return None

        await self._endpoint(scope, receive, send)

    def listens(self, session_id: str, notify: ServerSession) -> None:
        """The client of ``session_id`` said it is initialized: tools/list_changed may
        go out to it on ``notify``'s channel."""
        session = self._sessions.get(session_id)
        if session is not None:
            session.notify = notify

    async def tools_changed(self) -> None:
        """Send notifications/tools/list_changed to every initialized 2025-era session,
        all at once, each given at most ``MCP_NOTIFY_TIMEOUT_S`` (a client that does
        not read its stream holds up no one)."""
        channels = [s.notify for s in self._sessions.values() if s.notify is not None]
        if channels:
            async with anyio.create_task_group() as tasks:
                for channel in channels:
                    tasks.start_soon(_tell_tools_changed, channel)

    def _forget_idle(self) -> None:
        """Forget sessions idle past the SDK's own timeout: it has ended them."""
        if self._idle_s is None:
            return
        now = time.monotonic()
        for session_id, session in list(self._sessions.items()):
            if not session.in_flight and now - session.used > self._idle_s + MCP_REVOCATION_CHECK_S:
                del self._sessions[session_id]


async def _tell_tools_changed(channel: ServerSession) -> None:
    with anyio.move_on_after(MCP_NOTIFY_TIMEOUT_S), contextlib.suppress(Exception):
        await channel.send_tool_list_changed()  # the SDK drops it when no stream is open


def _session_id(request: Request) -> str | None:
    """The request's ``Mcp-Session-Id``; 400 when it carries more than one."""
    found = request.headers.getlist(MCP_SESSION_ID_HEADER)
    if len(found) > 1:
        raise DuplicateSessionId(MCP_SESSION_ID_HEADER)
    return found[0] if found else None


async def _session_not_found(send: Send) -> None:
    """The SDK's own answer to an unknown session id: 404, a JSON-RPC error."""
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": _NO_SESSION, "more_body": False})
