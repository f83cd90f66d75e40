"""``/mcp``, with the MCP SDK loaded at the first MCP request instead of at start.

The SDK and its protocol types are most of the daemon's memory and start-up time (about
30 MB of RSS and 0.4 s of imports here), and many installs never speak MCP. The SDK is
imported in a thread, so the event loop keeps answering meanwhile; its session manager
runs in a task of the daemon's lifespan (daemon/lifespan.py), which it must enter and leave.

Before the SDK sees a request, its body is checked as the API's are (api/reading.py): a
POST is JSON-RPC, so ``application/json``, bounded, at most MAX_JSON_DEPTH levels around
a tool's input, and no key twice in one object; a DELETE sends no body. The body read
for that is handed on to the SDK as it came.

First of all, the Host header and any Origin are checked (the MCP spec's DNS-rebinding
rule): a page of another site that renamed its host to 127.0.0.1 reaches nothing.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import msgspec
from starlette.datastructures import Headers
from starlette.types import Message, Receive, Scope, Send

from runnerd.api.errors import envelope, error_response
from runnerd.api.reading import refuse_repeated_keys, require_json
from runnerd.checks.nesting import nesting_over
from runnerd.errors import (
    BodyNotAllowed,
    BodyTooLarge,
    HostNotAllowed,
    InvalidBody,
    McpStopping,
    OriginNotAllowed,
    RunnerdError,
)
from runnerd.limits import DECODE_INLINE_BYTES, MAX_CALL_BODY_BYTES, MAX_JSON_DEPTH, MAX_MCP_DEPTH
from runnerd.mcp import RPC_METHOD

if TYPE_CHECKING:
    from runnerd.api.state import AppState
    from runnerd.config import Settings
    from runnerd.mcp.gateway import McpGateway

__all__ = ["McpEndpoint", "host_served", "served_hosts"]

_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def served_hosts(settings: Settings) -> frozenset[str]:
    """The host names /mcp answers under (lower case, no port): loopback, the bind
    address, public_url's host and allowed_hosts ("*" among them: any)."""
    names = set(_LOOPBACK) | {settings.host.lower().strip("[]")}
    if settings.public_url:
        names.add((urlsplit(settings.public_url).hostname or "").lower())
    names.update(h.lower().strip("[]") for h in settings.allowed_hosts)
    return frozenset(names)


def _host_name(authority: str) -> str | None:
    """The host of ``authority`` (host[:port], [v6][:port]), lower case; None when it is
    not one."""
    try:
        parts = urlsplit(f"//{authority}")
        name = parts.hostname
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return None
    return name.lower() if name else None


def host_served(headers: Headers, served: frozenset[str]) -> bool:
    """Whether the request has one Host header and it names a served host."""
    hosts = headers.getlist("host")
    host = _host_name(hosts[0]) if len(hosts) == 1 else None
    return host is not None and host in served


def _check_origin(scope: Scope, served: frozenset[str]) -> None:
    """HostNotAllowed unless one Host names a served host; OriginNotAllowed when an
    Origin is sent whose host is not one ("null" included), or two are (a proxy may read
    another one than this check)."""
    if "*" in served:
        return
    headers = Headers(scope=scope)
    if not host_served(headers, served):
        raise HostNotAllowed
    origins = headers.getlist("origin")
    if len(origins) > 1:
        raise OriginNotAllowed
    origin = origins[0] if origins else None
    if origin is not None:
        parts = urlsplit(origin)
        name = _host_name(parts.netloc) if parts.scheme in ("http", "https") else None
        if name is None or name not in served:
            raise OriginNotAllowed


class _Disconnected(Exception):
    """The client went away while sending its body: there is no one to answer."""


async def _read(receive: Receive, limit: int) -> bytes:
    """The request body, refused (400) once it is longer than ``limit`` bytes."""
    data = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        data += message.get("body", b"")
        if len(data) > limit:
            if limit == 0:
                raise BodyNotAllowed("this /mcp request takes no body; send none")
            raise BodyTooLarge(limit)
        if not message.get("more_body", False):
            return bytes(data)


def _check_json_rpc(raw: bytes) -> str | None:
    """Refuse a body MCP must not read; the method it asks for (None for a notification,
    a response, or something that is no JSON-RPC request)."""
    if nesting_over(raw, MAX_MCP_DEPTH) is not None:
        raise InvalidBody(
            f"request body is nested deeper than {MAX_JSON_DEPTH} levels around the input"
        )
    # One reading for every reader: UTF-8 JSON, as the API takes (a UTF-16 or UTF-32 body,
    # a BOM, a lone surrogate: the SDK's parser reads them, and would read keys twice).
    try:
        message = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        raise InvalidBody(
            "request body is not JSON in UTF-8 (no byte order mark, no lone surrogate)"
        ) from None
    refuse_repeated_keys(raw)
    if isinstance(message, dict) and "id" in message and isinstance(message.get("method"), str):
        return str(message["method"])
    return None


async def _checked(scope: Scope, receive: Receive) -> Receive:
    """``receive`` for the SDK, once the request's body passed the checks: the body as
    it came, then whatever the client sends next (its disconnect)."""
    if scope["method"] not in ("POST", "DELETE"):
        return receive  # a GET is the event stream: it sends nothing, and reads on
    if scope["method"] == "POST":
        require_json(Headers(scope=scope))
        body = await _read(receive, MAX_CALL_BODY_BYTES)
        if len(body) <= DECODE_INLINE_BYTES:
            method = _check_json_rpc(body)
        else:
            method = await asyncio.to_thread(_check_json_rpc, body)
        scope[RPC_METHOD] = method  # what the session guard counts (mcp/sessions.py)
    else:
        body = await _read(receive, 0)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class McpEndpoint:
    """The ASGI endpoint of ``/mcp`` and the daemon's handle on MCP sessions."""

    def __init__(self) -> None:
        self.state: AppState | None = None  # set by the daemon's lifespan
        self._wanted = asyncio.Event()
        self._stop = asyncio.Event()
        self._gateway: asyncio.Future[McpGateway] | None = None
        self._served: frozenset[str] | None = None

    @property
    def loaded(self) -> bool:
        return self._gateway is not None and self._gateway.done()

    async def serve(self) -> None:
        """The lifespan's task: load the SDK when first asked, run its session manager
        until ``stop``."""
        await self._wanted.wait()
        if self._stop.is_set():
            return
        assert self._gateway is not None
        try:
            assert self.state is not None, "the daemon's lifespan sets the state first"
            module = await asyncio.to_thread(importlib.import_module, "runnerd.mcp.gateway")
            gateway: McpGateway = module.McpGateway(self.state)
        except Exception as exc:
            self._gateway.set_exception(exc)
            return
        async with gateway.run():
            self._gateway.set_result(gateway)
            await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()
        self._wanted.set()

    async def _loaded(self) -> McpGateway:
        if self._gateway is None:
            self._gateway = asyncio.get_running_loop().create_future()
            self._wanted.set()
        return await asyncio.shield(self._gateway)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._stop.is_set() and not self.loaded:  # the daemon is stopping
            await error_response(envelope(McpStopping()))(scope, receive, send)
            return
        try:
            if self._served is None and self.state is not None:
                self._served = served_hosts(self.state.settings)
            _check_origin(scope, self._served or _LOOPBACK)
            receive = await _checked(scope, receive)
        except RunnerdError as exc:
            await error_response(envelope(exc))(scope, receive, send)
            return
        except _Disconnected:
            return
        gateway = await self._loaded()
        await gateway(scope, receive, send)

    async def tools_changed(self) -> None:
        """Tell open MCP sessions that the tools changed (none before the SDK loads)."""
        if self.loaded:
            assert self._gateway is not None
            await self._gateway.result().tools_changed()
