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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import anyio
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runnerd.api.auth import Caller, bearer_or_key
from runnerd.api.errors import envelope, error_response
from runnerd.errors import (
    DuplicateSessionId,
    InvalidApiKey,
    MissingWorkspace,
    RunnerdError,
    Unauthenticated,
)
from runnerd.limits import MCP_REVOCATION_CHECK_S

if TYPE_CHECKING:
    from runnerd.api.state import AppState

__all__ = ["SessionGuard", "authorize"]

_NO_SESSION = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Session not found"}}'

log = logging.getLogger(__name__)


async def authorize(state: AppState, request: Request, *, spend: bool = True) -> tuple[Caller, str]:
    """The caller and workspace of an MCP request: 401, 403 or 429 as on the API
    (one rate-limit token per HTTP request: the handlers do not spend another)."""
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
        state.limiter.take(key.id)
    return caller, workspace_id


@dataclass(frozen=True)
class _Grant:
    """What a request or a session acts under: a key, in a workspace."""

    key_id: str
    workspace_id: str


@dataclass
class _Session:
    """A session opened over the handshake: whose it is, and how it is in use."""

    grant: _Grant
    in_flight: int = 0
    used: float = field(default_factory=time.monotonic)


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
        self._sessions: dict[str, _Session] = {}  # Mcp-Session-Id: who opened it
        self._streams: dict[_Grant, set[anyio.CancelScope]] = {}  # requests being served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            caller, workspace_id = await authorize(self.state, request)
            session_id = _session_id(request)
        except RunnerdError as exc:
            await error_response(envelope(exc))(scope, receive, send)
            return
        grant = _Grant(caller.key.id, workspace_id)
        session = None if session_id is None else self._sessions.get(session_id)
        if session_id is not None and (session is None or session.grant != grant):
            # Another key's session, or one of another workspace: as if it did not exist.
            await _session_not_found(send)
            return
        watched = _Watched(send, None if session_id is not None else partial(self._opened, grant))
        if session is not None:
            session.in_flight += 1
        try:
            await self._serve(grant, scope, receive, watched)
        finally:
            if session is not None:
                session.in_flight -= 1
                session.used = time.monotonic()
        if session_id is not None and (
            watched.status == 404 or (request.method == "DELETE" and (watched.status or 500) < 400)
        ):
            self._sessions.pop(session_id, None)  # ended by its owner, or by the SDK

    def _opened(self, grant: _Grant, session_id: str) -> None:
        """The handshake opened ``session_id`` for ``grant``."""
        self._sessions.setdefault(session_id, _Session(grant))

    async def _serve(self, grant: _Grant, scope: Scope, receive: Receive, send: _Watched) -> None:
        """Hand the request to the SDK, cancellable when its grant ends (``_end``)."""
        with anyio.CancelScope() as cancel:
            streams = self._streams.setdefault(grant, set())
            streams.add(cancel)
            try:
                await self._endpoint(scope, receive, send)
            finally:
                streams.discard(cancel)
                if not streams:
                    self._streams.pop(grant, None)
        if not cancel.cancelled_caught or send.done:
            return
        if send.status is None:
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

    def _forget_idle(self) -> None:
        """Forget sessions idle past the SDK's own timeout: it has ended them."""
        if self._idle_s is None:
            return
        now = time.monotonic()
        for session_id, session in list(self._sessions.items()):
            if not session.in_flight and now - session.used > self._idle_s + MCP_REVOCATION_CHECK_S:
                del self._sessions[session_id]


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
