"""The daemon's HTTP port against slow and many connections.

uvicorn's httptools protocol, with these limits (docs/SECURITY.md, "Limits that protect
the daemon"):

- a request head (request line and headers) must arrive whole within
  ``http_header_timeout_s`` of its first byte: of connecting, for a connection's first
  request; of the first byte after the answer, for the next one on a keep-alive
  connection (idle keep-alive connections close after uvicorn's 5 s, as before). Bytes
  that begin no request (blank lines) start the clock too. A head past the time is
  answered 408 and closed;
- a head holds at most ``MAX_REQUEST_HEAD_BYTES`` and ``MAX_REQUEST_HEAD_FIELDS`` fields:
  past that, 431 and closed;
- a body may pause at most ``http_body_timeout_s`` between two bytes (not counting the
  time the daemon itself stops reading, while the app has not taken what came): past it,
  408 (if nothing was answered yet) and closed. The same bound holds the other way: an
  answer the client stops reading (the socket's buffers full, uvicorn's transport paused
  for writing) is cut once it has stalled that long, whatever the connection is doing;
- connections per client address (an IPv6 /64 is one client; IPv4-mapped addresses are
  their IPv4 address) and in total are capped. At a cap, a new connection closes another
  of that client (or of all, at the total cap) that waits on its client or holds its
  slot for long: first a request under way (a head or a body not all here; the one that
  moved least recently: a head when it began, a body at its last byte), since a
  legitimate head comes in one piece; then an answer its client does not read (writes
  paused), the longest stalled; then an answer still streaming ``STREAM_GRACE_S`` after
  its head went out (an SSE stream, a long download), the oldest, which its client can
  open again; then a new connection that sent nothing yet (its request may be in
  flight), the oldest; then a kept-alive connection, the longest idle, which its client
  can open again at no cost. A connection whose answer has not begun (a run in its jail)
  or began less than ``STREAM_GRACE_S`` ago is never closed for room; only when all of
  them are such is the new connection refused with 503. Every local caller shares
  127.0.0.1 with a local attacker: refusing at the cap would let a slow client, or one
  holding streams open, lock all of them out.

Nothing here reads or records what a request carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from runnerd.api.errors import envelope, error_response
from runnerd.errors import RequestHeadTooLarge, RequestTimeout, RunnerdError, TooManyConnections
from runnerd.limits import (
    CUT_ANSWERS_PER_S,
    CUT_LOG_EVERY_S,
    MAX_REQUEST_HEAD_BYTES,
    MAX_REQUEST_HEAD_FIELDS,
    STREAM_GRACE_S,
)
from runnerd.metrics import METRICS

__all__ = ["ConnectionLimits", "client_key", "protocol_class"]

log = logging.getLogger("runnerd")

_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    per_client: int
    total: int


def client_key(host: str) -> str:
    """The client a connection counts against: its IPv4 address, or its IPv6 /64."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return f"{ipaddress.IPv6Address(int(ip) & ~((1 << 64) - 1))}/64"
    return str(ip)


_Queue = OrderedDict["LimitedHttpProtocol", None]


class _Pool:
    """One client's connections (or all of them): how many, and those that may be closed
    for room, in the order they go: requests under way (a head or a body not all here),
    the one that moved least recently first; then answers the client does not read, the
    longest stalled first; then answers streaming past ``STREAM_GRACE_S``, the oldest
    first; then new connections that sent nothing yet (their request may be in flight),
    oldest first; then kept-alive connections, the longest idle first."""

    __slots__ = ("count", "fresh", "idle", "stalled", "streaming", "unfinished")

    def __init__(self) -> None:
        self.count = 0
        self.unfinished: _Queue = OrderedDict()
        self.stalled: _Queue = OrderedDict()
        self.streaming: _Queue = OrderedDict()
        self.fresh: _Queue = OrderedDict()
        self.idle: _Queue = OrderedDict()

    def queues(self) -> tuple[_Queue, ...]:
        return (self.unfinished, self.stalled, self.streaming, self.fresh, self.idle)

    def victim(self) -> LimitedHttpProtocol | None:
        for queue in self.queues():
            for conn in queue:
                return conn
        return None


class _Registry:
    """The open connections of one server, by client."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.all = _Pool()
        self.clients: dict[str, _Pool] = {}
        self.cuts: dict[str, int] = {}
        self.logged_at = time.monotonic()
        self.answers = float(CUT_ANSWERS_PER_S)  # a token bucket of answers to cut connections
        self.answers_at = self.logged_at

    def admit(self, conn: LimitedHttpProtocol) -> bool:
        """Make room for ``conn`` (closing another connection if at a cap) and count it;
        False if there is no room."""
        pool = self.clients.get(conn.key)
        if (
            pool is not None and pool.count >= self.limits.per_client and not self._evict(pool)
        ) or (self.all.count >= self.limits.total and not self._evict(self.all)):
            self.note("refused")
            return False
        pool = self.clients.get(conn.key)  # an eviction may have emptied and dropped it
        if pool is None:
            pool = self.clients[conn.key] = _Pool()
        for each in (pool, self.all):
            each.count += 1
            each.fresh[conn] = None
        conn.counted = True
        return True

    def _evict(self, pool: _Pool) -> bool:
        victim = pool.victim()
        if victim is None:
            return False
        self.remove(victim)
        self.note("evicted")
        # 503 to a request under way or a connection never served (its request may be in
        # flight); an idle kept-alive connection is closed without a word, as its timeout
        # would close it; a stalled or streaming answer is cut short (cut aborts it).
        victim.cut(503 if victim.request_started or victim.cycle is None else None)
        return True

    def _place(self, conn: LimitedHttpProtocol, name: str | None) -> None:
        """Move ``conn`` to the end of the queue ``name`` (None: in none, not closed for
        room). A stalled answer stays where it stalled, whatever its requests do, until
        its client reads again."""
        if not conn.counted:
            return
        if conn.write_stalled:
            name = "stalled"
        for pool in (self.clients[conn.key], self.all):
            if name == "stalled" and conn in pool.stalled:
                continue
            for queue in pool.queues():
                queue.pop(conn, None)
            if name is not None:
                getattr(pool, name)[conn] = None

    def unfinished(self, conn: LimitedHttpProtocol) -> None:
        """A request of ``conn`` is under way, and just moved (its head began, or a byte
        of its body came)."""
        self._place(conn, "unfinished")

    def idle(self, conn: LimitedHttpProtocol) -> None:
        """``conn`` has no request under way, from now on."""
        self._place(conn, "idle")

    def busy(self, conn: LimitedHttpProtocol) -> None:
        """The daemon is answering ``conn``; its answer has not begun, or began less than
        STREAM_GRACE_S ago: it is not closed for room."""
        self._place(conn, None)

    def streaming(self, conn: LimitedHttpProtocol) -> None:
        """``conn``'s answer is still going STREAM_GRACE_S after its head went out."""
        self._place(conn, "streaming")

    def stalled(self, conn: LimitedHttpProtocol) -> None:
        """``conn``'s client stopped reading (``conn.write_stalled`` is set)."""
        self._place(conn, "stalled")

    def remove(self, conn: LimitedHttpProtocol) -> None:
        if not conn.counted:
            return
        conn.counted = False
        pool = self.clients[conn.key]
        for each in (pool, self.all):
            each.count -= 1
            for queue in each.queues():
                queue.pop(conn, None)
        if pool.count == 0:
            del self.clients[conn.key]

    def may_answer(self) -> bool:
        """Whether a cut connection may still get its answer: a write to a socket costs
        ~0.1 ms of the event loop, and a flood of cuts would spend it on the attacker."""
        now = time.monotonic()
        self.answers = min(
            CUT_ANSWERS_PER_S, self.answers + (now - self.answers_at) * CUT_ANSWERS_PER_S
        )
        self.answers_at = now
        if self.answers < 1:
            return False
        self.answers -= 1
        return True

    def note(self, cut: str) -> None:
        """Count a cut; log the counts at most every CUT_LOG_EVERY_S (never per connection)."""
        self.cuts[cut] = self.cuts.get(cut, 0) + 1
        now = time.monotonic()
        if now - self.logged_at >= CUT_LOG_EVERY_S:
            counts = ", ".join(f"{kind} {n}" for kind, n in sorted(self.cuts.items()))
            log.warning(
                "http connections: %s in %.0f s (%d open, from %d client(s))",
                counts,
                now - self.logged_at,
                self.all.count,
                len(self.clients),
            )
            self.cuts.clear()
            self.logged_at = now


# What a cut connection is told, by status (the errors carry reason, message and headers).
_ANSWERS: dict[int, RunnerdError] = {
    408: RequestTimeout(),
    431: RequestHeadTooLarge(),
    503: TooManyConnections(),
}
_PHRASES = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
_BUILT: dict[int, bytes] = {}


def _answer(status: int) -> bytes:
    """A whole HTTP/1.1 answer in the error envelope, closing the connection; counted
    as a refusal. Built once (by error_response, which counts that first one): a flood
    is answered at the cost of a write."""
    built = _BUILT.get(status)
    if built is not None:
        METRICS.refusals.labels(str(_ANSWERS[status].reason)).inc()
        return built
    response = error_response(envelope(_ANSWERS[status]))
    head = [b"HTTP/1.1 %d %s\r\n" % (status, _PHRASES.get(status, b"Service Unavailable"))]
    head += [name + b": " + value + b"\r\n" for name, value in response.raw_headers]
    built = _BUILT[status] = b"".join([*head, b"connection: close\r\n\r\n", response.body])
    return built


class _HeadTooLarge(Exception):
    pass


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above (set by ``protocol_class``)."""

    registry: ClassVar[_Registry]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key = ""
        self.counted = False
        self.request_started = False  # a byte of the current request came (a 408 is due)
        self._in_head = True
        self._in_body = False
        self._head_bytes = 0
        self._head_fields = 0
        self._deadline: asyncio.TimerHandle | None = None
        self._last_byte = 0.0
        self.write_stalled = False  # the transport paused writing: the client reads nothing
        self._stall: asyncio.TimerHandle | None = None  # cuts a stalled answer
        self._streaming = False  # the answer went on past STREAM_GRACE_S
        self._answer_check: asyncio.TimerHandle | None = None

    # --- the connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.key = client_key(self.client[0]) if self.client else ""
        if not self.registry.admit(self):
            self.cut(503)
            return
        self._arm(self.registry.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_watching()
        self.registry.remove(self)
        super().connection_lost(exc)

    def cut(self, status: int | None) -> None:
        """Close the connection; first answer ``status`` if given, nothing was answered,
        and the answers' budget allows (in a flood of cuts, closing is all they get). An
        answer under way, or one its client does not read, is aborted: a close would wait
        for the client to read what is buffered, and hold the socket as long."""
        self._disarm()
        self._stop_watching()
        self.registry.remove(self)  # closing: it no longer counts, nor is closed for room
        cycle = self.cycle
        if self.write_stalled or (
            cycle is not None and cycle.response_started and not cycle.response_complete
        ):
            # A reset, not a FIN behind what the client never reads: the kernel frees the
            # socket and its buffers now, not when the client reads (never).
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            self.transport.abort()  # the app's answer, if any, goes nowhere
            return
        if self.transport.is_closing():
            return
        if self._in_body:  # the request's own cycle: answer if the app has not
            free = cycle is not None and not cycle.response_started
        else:  # the last request's cycle: answer once it was answered
            free = cycle is None or cycle.response_complete
        if status is not None and free and self.registry.may_answer():
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True  # the app's answer, if any, goes nowhere
                cycle.message_event.set()
            self.transport.write(_answer(status))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        idle = self._deadline is None and not self._answering() and not self._in_body
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self.registry.note("head too large")
                self.cut(431)
                return
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._in_body:  # the body is not all here
            self._last_byte = self.loop.time()
            if self._deadline is None:
                self._arm(self.registry.limits.body_timeout_s, self._body_timed_out)
            self.registry.unfinished(self)
        elif self._deadline is None and (self._in_head or (idle and not self._answering())):
            # A head not all here (or bytes that began none, such as blank lines, after
            # an answer): its clock starts with the first byte. Armed after the parser
            # ran, so a whole head in one piece costs no timer.
            self._arm(self.registry.limits.header_timeout_s, self._head_timed_out)

    # --- parser callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.request_started = True
        self._in_head = True
        self._head_bytes = self._head_fields = 0
        if not self._answering():
            self.registry.unfinished(self)

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        if self._head_bytes > MAX_REQUEST_HEAD_BYTES:
            raise _HeadTooLarge
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's own on_header, inlined: it runs for every header of every request.
        self._head_bytes += len(name) + len(value) + 4
        self._head_fields += 1
        if self._head_bytes > MAX_REQUEST_HEAD_BYTES or self._head_fields > MAX_REQUEST_HEAD_FIELDS:
            raise _HeadTooLarge
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._in_body = True
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self.request_started = self._in_body = False
        super().on_message_complete()
        if self._answering():
            self._settle()
            self._watch_answer()
        elif not self.pipeline:
            self.registry.idle(self)  # answered before its body ended

    def on_response_complete(self) -> None:
        queued = bool(self.pipeline)  # super() starts the next one: still answering
        super().on_response_complete()
        self._stop_watching(stall=False)  # an answer ended; a stall lasts until read
        if self.transport.is_closing():
            return
        if queued:
            self._watch_answer()
        self._settle()

    # --- the answer's way out ----------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if not self.write_stalled:
            self.write_stalled = True
            timeout = self.registry.limits.body_timeout_s
            self._stall = self.loop.call_later(timeout, self._write_timed_out)
            self.registry.stalled(self)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.write_stalled:
            self.write_stalled = False
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None
            if self.parser is not None:  # None once the connection is lost
                self._settle()

    def _write_timed_out(self) -> None:
        self._stall = None
        self.registry.note("answer stalled")
        self.cut(None)

    def _watch_answer(self) -> None:
        """Check every STREAM_GRACE_S, while answering, whether the answer is a stream."""
        if self._answer_check is None:
            self._answer_check = self.loop.call_later(STREAM_GRACE_S, self._check_answer)

    def _check_answer(self) -> None:
        self._answer_check = None
        cycle = self.cycle
        if not self._answering() or cycle is None:
            return
        if cycle.response_started:  # its head went out, and it still goes on
            self._streaming = True
            self.registry.streaming(self)
        else:  # not begun (a run in its jail): never closed for room
            self._watch_answer()

    def _stop_watching(self, *, stall: bool = True) -> None:
        self._streaming = False
        if self._answer_check is not None:
            self._answer_check.cancel()
            self._answer_check = None
        if stall and self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _settle(self) -> None:
        """Put the connection in the queue its state says (the registry keeps a stalled
        one among the stalled)."""
        if self._answering():
            if self._streaming:
                self.registry.streaming(self)
            else:
                self.registry.busy(self)
        elif self._in_head or self._in_body:
            self.registry.unfinished(self)  # its next request is on its way
        else:
            self.registry.idle(self)

    # --- helpers ----------------------------------------------------------------------------

    def _answering(self) -> bool:
        """A whole request came and its answer is not complete (or one waits in line)."""
        cycle = self.cycle
        return bool(self.pipeline) or (
            cycle is not None and not self._in_body and not cycle.response_complete
        )

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_timed_out(self) -> None:
        self._deadline = None
        self.registry.note("head timed out" if self.request_started else "idle closed")
        self.cut(408 if self.request_started else None)

    def _body_timed_out(self) -> None:
        self._deadline = None
        if not self._in_body:
            return
        timeout = self.registry.limits.body_timeout_s
        cycle = self.cycle
        if self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue):
            # The daemon stopped reading, or the client waits for its 100 Continue: the
            # pause is not the client's.
            self._arm(timeout, self._body_timed_out)
            return
        left = self._last_byte + timeout - self.loop.time()
        if left > 0:
            self._arm(left, self._body_timed_out)
            return
        self.registry.note("body timed out")
        self.cut(408)


def protocol_class(limits: ConnectionLimits) -> type[LimitedHttpProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` sharing one registry of
    connections (one per server)."""

    class HttpProtocol(LimitedHttpProtocol):
        registry = _Registry(limits)

    return HttpProtocol
