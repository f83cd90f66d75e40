"""The egress proxy: the only way out of a jail, for runs whose install was granted egress.

A jail's network namespace has only ``lo``. A run with a grant gets the proxy's Unix
socket bind-mounted into its jail, and the harness relays ``127.0.0.1:PORT`` (what
``HTTP_PROXY``/``HTTPS_PROXY`` name) to it. The proxy, in the daemon:

- knows the run by two things at once: the credential in ``Proxy-Authorization`` (a
  random token made for the run, dead when the run ends) and the outside uid of the
  connecting process (SO_PEERCRED; each live jail has a uid of its own). A connection
  from a uid without a live run is closed unread;
- allows ``CONNECT host:port`` (TLS stays end to end) and plain ``http://`` requests,
  only to destinations the grant covers;
- resolves names itself and connects to the address it checked: loopback, private,
  link-local, CGNAT, multicast, unspecified, reserved, IPv4-mapped, ULA, site-local and
  this host's own addresses are refused, but for the ranges in ``egress_allow_networks``
  (the rules: run/addresses.py);
- caps each run's connections and bytes, closes every tunnel when the run ends, and
  counts per destination the connections and bytes each way (never a payload, a request
  line or a header: they may hold secrets).

A refusal is an ordinary HTTP answer (403, the reason in the status line and the body),
so the tool's client raises an ordinary error and the run fails with it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import ipaddress
import logging
import os
import secrets
import socket
import struct
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runnerd.egress import Destination, EgressError, Network, covers, parse
from runnerd.limits import (
    GRANT_RECHECK_S,
    MAX_DESTINATION_CHARS,
    MAX_EGRESS_FIGURES,
    MAX_PROXY_HEAD_BYTES,
    PROXY_BACKLOG,
    PROXY_CHUNK_BYTES,
    PROXY_HEAD_TIMEOUT_S,
)
from runnerd.run.addresses import address_refusal, embedded_ipv4, is_this_host
from runnerd.run.authority import (
    ALERT_DECODE_ERROR,
    AUTHORITY_MISMATCH,
    AuthorityRefused,
    Request,
    check_request,
    check_server_name,
    forward_body,
    is_token_start,
    read_client_hello,
    read_head,
    tls_alert,
)
from runnerd.run.resolver import LookupFailed, Resolver

log = logging.getLogger("runnerd.egress")

__all__ = [
    "CAP_REACHED",
    "NOT_GRANTED",
    "PRIVATE_ADDRESS",
    "EgressPass",
    "EgressProxy",
]

NOT_GRANTED, PRIVATE_ADDRESS, CAP_REACHED = "not granted", "private address", "cap reached"
# Why a request was refused, as the audit counts them (any other reason counts as "other").
_REASONS = (NOT_GRANTED, PRIVATE_ADDRESS, CAP_REACHED, "bad request", "no credential",
            "no such host", "lookups busy", "cannot connect", AUTHORITY_MISMATCH,
            "grant unknown")  # fmt: skip
# An install's grant as stored now, by install id (None: the install is gone).
GrantReader = Callable[[str], Awaitable[tuple[str, ...] | None]]


@dataclass
class _Use:
    connections: int = 0
    sent: int = 0
    received: int = 0
    refusals: dict[str, int] = field(default_factory=dict)  # reason -> requests refused

    @property
    def refused(self) -> str | None:
        """The last refusal's reason (shown for a place never reached)."""
        return next(reversed(self.refusals), None)

    @refused.setter
    def refused(self, reason: str) -> None:
        """One more request refused for ``reason`` (it becomes the last one)."""
        self.refusals[reason] = self.refusals.pop(reason, 0) + 1


@dataclass(eq=False)
class EgressPass:
    """One run's right to the network: its credential, its grant, and what it used."""

    token: str
    grant: tuple[Destination, ...]
    install_id: str | None = None  # whose grant it is (None: a local ``tool test`` run)
    uid: int | None = None  # the jail's outside uid, set when the run takes its jail
    connections: int = 0
    bytes: int = 0
    capped: str | None = None  # "connections" or "bytes", once a cap was reached
    closed: bool = False
    uses: dict[str, _Use] = field(default_factory=dict)
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    # Each upstream connection the run opened, and where to (pruned once it is closed).
    tunnels: dict[asyncio.StreamWriter, Destination] = field(default_factory=dict)

    def use(self, destination: str) -> _Use:
        """The figures of ``destination`` (past MAX_EGRESS_FIGURES destinations, of
        "other"). The tool chooses the name: it is kept printable and at most
        MAX_DESTINATION_CHARS."""
        destination = _printable(destination, MAX_DESTINATION_CHARS)
        if destination not in self.uses and len(self.uses) >= MAX_EGRESS_FIGURES:
            destination = "other"
        return self.uses.setdefault(destination, _Use())

    def figures(self, clean: Callable[[str], str] = str) -> list[dict[str, Any]]:
        """What the run used: per destination, connections and bytes each way, or the
        reason it was refused (for a destination never reached). No payload, path or
        header. The destination is the tool's choice (a refused one, or any name under a
        wildcard entry): ``clean`` (the run's scrubber, Pipeline.run) is applied to it, then
        it is cut to MAX_DESTINATION_CHARS; destinations that become one are summed."""
        found: dict[str, dict[str, Any]] = {}
        refusals: dict[str, str] = {}
        for destination, use in self.uses.items():
            name = clean(destination)[:MAX_DESTINATION_CHARS]
            entry = found.setdefault(
                name, {"destination": name, "connections": 0, "bytesSent": 0, "bytesReceived": 0}
            )
            entry["connections"] += use.connections
            entry["bytesSent"] += use.sent
            entry["bytesReceived"] += use.received
            if use.refused:
                refusals[name] = use.refused
        for name, reason in refusals.items():
            if not found[name]["connections"]:
                found[name]["refused"] = reason
        return list(found.values())

    def summary(self) -> dict[str, Any]:
        """What the audit keeps of the run's egress, with no name the tool chose: per grant
        entry used, connections and bytes each way; per refusal reason, the requests
        refused; the cap reached, if one was."""
        granted: dict[str, dict[str, int]] = {}
        refused: dict[str, int] = {}
        for destination, use in self.uses.items():
            for reason, count in use.refusals.items():
                kind = reason if reason in _REASONS else "other"
                refused[kind] = refused.get(kind, 0) + count
            if use.connections or use.sent or use.received:
                figures = granted.setdefault(
                    self._entry_of(destination),
                    {"connections": 0, "bytesSent": 0, "bytesReceived": 0},
                )
                figures["connections"] += use.connections
                figures["bytesSent"] += use.sent
                figures["bytesReceived"] += use.received
        found: dict[str, Any] = {
            "granted": [{"entry": entry, **figures} for entry, figures in granted.items()],
            "refused": refused,
        }
        if self.capped:
            found["capped"] = self.capped
        return found

    def _entry_of(self, destination: str) -> str:
        """The grant entry that let the run reach ``destination`` ("other" if unknown)."""
        try:
            wanted = parse(destination)
        except EgressError:
            return "other"
        return next((str(g) for g in self.grant if covers(g, wanted)), "other")


def _destinations(entries: Iterable[str]) -> tuple[Destination, ...]:
    """A stored grant's entries as destinations (an entry that does not parse grants
    nothing)."""
    found = []
    for entry in entries:
        with contextlib.suppress(EgressError):
            found.append(parse(entry))
    return tuple(found)


class _Refusal(Exception):
    def __init__(self, status: int, reason: str, detail: str) -> None:
        self.status, self.reason, self.detail = status, reason, detail
        super().__init__(detail)


@dataclass(frozen=True)
class _Plan:
    """What the client may send on a connection the proxy opened for it."""

    wanted: Destination  # the destination, its port set
    body: int | None  # a plain request: its body's framing (nothing past it); None: a tunnel


class EgressProxy:
    """The daemon's forward proxy on a Unix socket (started on first use)."""

    def __init__(
        self,
        path: Path,
        *,
        allow_networks: tuple[Network, ...] = (),
        max_connections: int,
        max_bytes: int,
        connect_timeout_s: float,
    ) -> None:
        self.path = path
        self.allow_networks = allow_networks
        self.max_connections = max_connections
        self.max_bytes = max_bytes
        self.connect_timeout_s = connect_timeout_s
        self._server: asyncio.AbstractServer | None = None
        # Names resolve on the loop through c-ares, bounded per install (run/resolver.py).
        self._resolver = Resolver()
        # The install's grant as it is now (follow_grants); None: a run keeps its own.
        self._current_grant: GrantReader | None = None
        self._rechecking: asyncio.Future[None] | None = None
        self._starting = asyncio.Lock()
        self._by_token: dict[str, EgressPass] = {}
        self._by_uid: dict[int, EgressPass] = {}
        self._open_by_uid: dict[int, int] = {}

    async def ensure_started(self) -> None:
        async with self._starting:
            if self._server is not None:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
            _remove_stale(self.path.parent)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            # A small backlog: asyncio accepts up to that many connections in one turn of
            # the loop, so a flood of connects is taken in small bites (and a flooding
            # jail waits in connect) instead of stalling the daemon for one long turn.
            self._server = await asyncio.start_unix_server(
                self._serve, path=str(self.path), limit=MAX_PROXY_HEAD_BYTES, backlog=PROXY_BACKLOG
            )
            # Any jail uid may connect; it is then known by its uid and its credential.
            self.path.chmod(0o666)
            self._rechecking = asyncio.ensure_future(self._recheck_tunnels())

    async def close(self) -> None:
        if self._rechecking is not None:
            self._rechecking.cancel()
            self._rechecking = None
        for grant in list(self._by_token.values()):
            self.end_run(grant)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def open_run(self, grant: Iterable[str], install_id: str | None = None) -> EgressPass:
        """A credential for one run of ``install_id``, good for ``grant`` until end_run."""
        destinations = []
        for entry in grant:
            with contextlib.suppress(EgressError):
                destinations.append(parse(entry))
        token = secrets.token_urlsafe(24)
        granted = EgressPass(token=token, grant=tuple(destinations), install_id=install_id)
        self._by_token[token] = granted
        return granted

    def follow_grants(self, read: GrantReader) -> None:
        """Hold the runs of installs to their install's grant as it is now:
        ``read(install_id)`` gives it as stored (None once uninstalled). A run's new
        connection must be in it too (besides the grant the run started with), and its
        open connections to destinations it no longer covers close within
        GRANT_RECHECK_S. A run without an install (``tool test``) keeps its grant."""
        self._current_grant = read

    def bind(self, granted: EgressPass, uid: int) -> None:
        """The run has its jail: only that jail's uid may use the credential."""
        granted.uid = uid
        self._by_uid[uid] = granted

    def end_run(self, granted: EgressPass) -> None:
        """The run is over: its credential dies and its tunnels close (its figures stay on
        ``granted``)."""
        granted.closed = True
        self._by_token.pop(granted.token, None)
        if granted.uid is not None and self._by_uid.get(granted.uid) is granted:
            del self._by_uid[granted.uid]
        for writer in list(granted.writers):
            _abort(writer)
        granted.writers.clear()

    # --- one connection ------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = _peer_uid(writer)
        owner = self._by_uid.get(uid) if uid is not None else None
        if uid is None or owner is None or self._open_by_uid.get(uid, 0) >= self.max_connections:
            _abort(writer)  # no run of this jail may use the network now: nothing is read
            return
        self._open_by_uid[uid] = self._open_by_uid.get(uid, 0) + 1
        owner.writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PROXY_HEAD_TIMEOUT_S)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            except (ConnectionError, OSError):
                return
            try:
                upstream_reader, upstream, use, plan = await self._open(owner, head, writer)
            except _Refusal as refusal:
                await _answer(writer, refusal)
                return
            await self._pump(owner, use, plan, (reader, writer), (upstream_reader, upstream))
        except (ConnectionError, OSError):
            pass
        except Exception as exc:  # a bug here must not lose the daemon's loop; no content
            log.error("egress proxy: %s on a connection", type(exc).__name__)
        finally:
            owner.writers.discard(writer)
            if upstream is not None:
                owner.writers.discard(upstream)
                _abort(upstream)
            _abort(writer)
            left = self._open_by_uid.get(uid, 1) - 1
            if left:
                self._open_by_uid[uid] = left
            else:
                self._open_by_uid.pop(uid, None)

    async def _open(
        self, owner: EgressPass, head: bytes, client: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, _Use, _Plan]:
        """Check one request and connect to its destination; _Refusal if it may not go."""
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            raise _Refusal(400, "bad request", "not an HTTP proxy request")
        method, target = parts[0], parts[1].decode("ascii", "replace")
        headers = [line.split(b":", 1) for line in lines[1:]]
        if not self._authorized(owner, headers):
            raise _Refusal(
                407, "no credential", "the proxy credential is missing, wrong or expired"
            )
        tunnel = method == b"CONNECT"
        if tunnel:
            authority = target
        elif target.startswith("http://"):
            rest = target[len("http://") :]
            authority = rest[: min((i for i in (rest.find("/"), rest.find("?")) if i != -1),
                                   default=len(rest))]  # fmt: skip
        else:
            raise _Refusal(400, "bad request", "send CONNECT host:port, or a plain http:// URL")
        try:
            wanted = parse(authority)
        except EgressError as exc:
            raise _Refusal(400, "bad request", f"{_printable(authority)}: {exc}") from None
        port = wanted.port or (443 if tunnel else 80)
        wanted = Destination(wanted.host, port, wanted.wildcard, wanted.ip)
        where = str(wanted)
        if wanted.wildcard or not any(covers(g, wanted) for g in owner.grant):
            owner.use(where).refused = NOT_GRANTED
            raise _Refusal(403, NOT_GRANTED, f"{where} is not in this run's egress grant")
        request = None if tunnel else self._checked(owner, head, wanted, where)
        if owner.connections >= self.max_connections or owner.bytes >= self.max_bytes:
            owner.capped = owner.capped or (
                "connections" if owner.connections >= self.max_connections else "bytes"
            )
            owner.use(where).refused = CAP_REACHED
            raise _Refusal(403, CAP_REACHED, f"this run reached its egress {owner.capped} cap")
        owner.connections += 1  # every attempt counts: a resolution or a connect costs too
        await self._require_current_grant(owner, wanted, where)
        addresses = await self._addresses(owner, wanted, where)
        reader, upstream = await self._connect(addresses, port, where)
        try:  # again: the grant may have changed during the lookup and the connect
            await self._require_current_grant(owner, wanted, where)
        except _Refusal:
            _abort(upstream)
            raise
        use = owner.use(where)
        use.connections += 1
        owner.writers.add(upstream)
        owner.tunnels[upstream] = wanted
        if owner.closed:
            raise ConnectionAbortedError  # the run ended while this one connected
        if request is None:
            client.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            return reader, upstream, use, _Plan(wanted, None)
        self._count(owner, use, sent=len(request.head))
        upstream.write(request.head)
        return reader, upstream, use, _Plan(wanted, request.body)

    def _checked(self, owner: EgressPass, head: bytes, wanted: Destination, where: str) -> Request:
        """A plain request's head as it goes on; _Refusal unless it names ``wanted`` only."""
        try:
            return check_request(head, wanted, proxied=True)
        except AuthorityRefused as exc:
            owner.use(where).refused = exc.reason
            raise _Refusal(exc.status, exc.reason, exc.detail) from None

    def _authorized(self, owner: EgressPass, headers: list[list[bytes]]) -> bool:
        for header in headers:
            if len(header) == 2 and header[0].strip().lower() == b"proxy-authorization":
                scheme, _, value = header[1].strip().partition(b" ")
                if scheme.lower() != b"basic":
                    return False
                try:
                    _, _, token = base64.b64decode(value.strip(), validate=True).partition(b":")
                except ValueError:
                    return False
                return not owner.closed and hmac.compare_digest(token, owner.token.encode())
        return False

    async def _require_current_grant(
        self, owner: EgressPass, wanted: Destination, where: str
    ) -> None:
        """_Refusal unless the install's grant as stored now still covers ``wanted`` (one
        store read per connection, off the loop on PostgreSQL; see follow_grants)."""
        if owner.install_id is None or self._current_grant is None:
            return
        try:
            entries = await self._current_grant(owner.install_id)
        except Exception as exc:  # the database away: no grant is known, none is used
            log.warning("egress: cannot read an install's grant: %s", type(exc).__name__)
            raise _Refusal(
                502, "grant unknown", f"{where}: the install's grant cannot be read now"
            ) from None
        if entries is None or not any(covers(g, wanted) for g in _destinations(entries)):
            owner.use(where).refused = NOT_GRANTED
            raise _Refusal(403, NOT_GRANTED, f"{where} is no longer in this install's egress grant")

    async def _recheck_tunnels(self) -> None:
        """Every GRANT_RECHECK_S, close the open connections of install runs whose
        install's grant no longer covers their destination (one store read per install
        with connections open)."""
        while True:
            await asyncio.sleep(GRANT_RECHECK_S)
            try:
                await self._close_revoked()
            except Exception as exc:  # a bug here must not end the re-checks
                log.error("egress: re-checking grants failed: %s", type(exc).__name__)

    async def _close_revoked(self) -> None:
        """Close the open connections of install runs to destinations their install's
        grant no longer covers."""
        read = self._current_grant
        if read is None:
            return
        by_install: dict[str, list[EgressPass]] = {}
        for granted in list(self._by_token.values()):
            for upstream in [u for u in granted.tunnels if u not in granted.writers]:
                del granted.tunnels[upstream]  # closed already
            if granted.install_id is not None and granted.tunnels:
                by_install.setdefault(granted.install_id, []).append(granted)
        for install_id, passes in by_install.items():
            try:
                entries = await read(install_id)
            except Exception as exc:  # checked again next time
                log.warning("egress: cannot read an install's grant: %s", type(exc).__name__)
                continue
            grant = _destinations(entries or ())
            for granted in passes:
                for upstream, wanted in list(granted.tunnels.items()):
                    if not any(covers(g, wanted) for g in grant):
                        del granted.tunnels[upstream]
                        _abort(upstream)  # its pump ends, and the tool's end closes

    async def _addresses(self, owner: EgressPass, wanted: Destination, where: str) -> list[str]:
        """The addresses of ``wanted`` that egress may use; _Refusal when there is none."""
        if wanted.ip:
            found = [ipaddress.ip_address(wanted.host)]
        else:
            try:  # one install's slow names wait on that install's lookups only
                names = await self._resolver.resolve(
                    owner.install_id or "", wanted.host, wanted.port
                )
            except LookupFailed as failed:
                raise _Refusal(502, failed.reason, f"{where}: {failed.detail}") from None
            found = [ipaddress.ip_address(name) for name in names]
        usable = []
        refusals = []
        for address in found:
            why = address_refusal(address, self.allow_networks)
            if why is None and is_this_host(address):
                why = "an address of this host"
            for form, inner in embedded_ipv4(address) if why is None else ():
                if is_this_host(inner):
                    why = f"{form} of {inner}, an address of this host"
                    break
            if why is None:
                usable.append(str(address))
            else:
                refusals.append(f"{address} is {why}")
        if not usable:
            owner.use(where).refused = PRIVATE_ADDRESS
            raise _Refusal(403, PRIVATE_ADDRESS, f"{where}: " + "; ".join(refusals[:4]))
        return usable

    async def _connect(
        self, addresses: list[str], port: int, where: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        problem = "cannot connect"
        for address in addresses:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(address, port, limit=PROXY_CHUNK_BYTES),
                    self.connect_timeout_s,
                )
            except TimeoutError:
                problem = f"no answer within {self.connect_timeout_s:g} s"
            except OSError as exc:
                problem = exc.strerror or type(exc).__name__
        raise _Refusal(502, "cannot connect", f"{where}: {problem}")

    def _count(self, owner: EgressPass, use: _Use, *, sent: int = 0, received: int = 0) -> bool:
        """Count bytes; False once the run is past its byte cap."""
        use.sent += sent
        use.received += received
        owner.bytes += sent + received
        if owner.bytes > self.max_bytes:
            owner.capped = "bytes"
            return False
        return True

    async def _pump(
        self,
        owner: EgressPass,
        use: _Use,
        plan: _Plan,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        """Copy both ways until both ends close, the byte cap is passed, or the run ends
        (end_run aborts both connections). What the client sends is checked on the way
        (see _outbound); the answers are copied as they come."""

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, out: bool) -> None:
            while data := await src.read(PROXY_CHUNK_BYTES):
                if out:
                    within = self._count(owner, use, sent=len(data))
                else:
                    within = self._count(owner, use, received=len(data))
                if not within:
                    _abort(client[1])
                    _abort(upstream[1])
                    return
                dst.write(data)
                await dst.drain()
            with contextlib.suppress(OSError):
                if dst.can_write_eof():
                    dst.write_eof()

        async def send(data: bytes) -> None:
            if not self._count(owner, use, sent=len(data)):
                raise ConnectionAbortedError  # past the byte cap
            upstream[1].write(data)
            await upstream[1].drain()

        async def outbound() -> None:
            try:
                then = await _check_outbound(plan, client[0], send)
            except _InTunnel as refused:
                owner.use(str(plan.wanted)).refused = refused.exc.reason
                await _refuse_in_tunnel(client[1], refused)
                then = "abort"
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                then = "abort"
            if then == "raw":
                await copy(client[0], upstream[1], True)
            elif then == "abort":
                _abort(client[1])
                _abort(upstream[1])
            elif then == "eof":
                with contextlib.suppress(OSError):
                    if upstream[1].can_write_eof():
                        upstream[1].write_eof()
            # "done": the one plain request went whole; nothing past it is read.

        await asyncio.gather(
            outbound(), copy(upstream[0], client[1], False), return_exceptions=True
        )


class _InTunnel(Exception):
    """A refusal of what a client sent after its connection was opened; ``tls``: the
    client speaks TLS, so the answer is a TLS alert."""

    def __init__(self, exc: AuthorityRefused, *, tls: bool) -> None:
        self.exc, self.tls = exc, tls
        super().__init__(exc.detail)


async def _check_outbound(
    plan: _Plan, reader: asyncio.StreamReader, send: Callable[[bytes], Awaitable[None]]
) -> str:
    """Pass on what a client sends until what follows may go as it is, checking every
    authority it names: a plain request's body and nothing past it ("done"); in a tunnel,
    a TLS ClientHello naming the destination ("raw" after it), every HTTP/1 request on
    the connection ("eof" when the client ends it), or a binary protocol, which names no
    site ("raw"). _InTunnel when something names another authority or is not what it
    claims to be; IncompleteReadError, LimitOverrunError or TimeoutError when the client
    stops or stalls."""
    if plan.body is not None:
        try:
            await forward_body(reader, plan.body, send)
        except AuthorityRefused as exc:
            raise _InTunnel(exc, tls=False) from None
        return "done"
    try:
        first = await reader.readexactly(1)
    except asyncio.IncompleteReadError:
        return "eof"
    if first == b"\x16":  # a TLS handshake record
        try:
            data, name = await asyncio.wait_for(
                read_client_hello(reader, first), PROXY_HEAD_TIMEOUT_S
            )
            check_server_name(name, plan.wanted)
        except AuthorityRefused as exc:
            raise _InTunnel(exc, tls=True) from None
        await send(data)
        return "raw"
    if 0x14 <= first[0] <= 0x18 or first[0] >= 0x80:
        # Another TLS record first, or an SSLv2-format ClientHello (no extensions, so no
        # SNI), which some servers still take: neither can be checked.
        detail = "the tunnel's first bytes are TLS but not a TLS 1.x ClientHello record"
        refused = AuthorityRefused(400, "bad request", detail, ALERT_DECODE_ERROR)
        raise _InTunnel(refused, tls=True)
    if not is_token_start(first[0]):
        await send(first)
        return "raw"
    while True:  # HTTP/1 in the tunnel: every request, however many the connection carries
        try:
            head = await asyncio.wait_for(
                read_head(reader, first, MAX_PROXY_HEAD_BYTES), PROXY_HEAD_TIMEOUT_S
            )
            request = check_request(head, plan.wanted, proxied=False)
            await send(request.head)
            await forward_body(reader, request.body, send)
        except AuthorityRefused as exc:
            raise _InTunnel(exc, tls=False) from None
        try:
            first = await reader.readexactly(1)
        except asyncio.IncompleteReadError:
            return "eof"


async def _refuse_in_tunnel(writer: asyncio.StreamWriter, refused: _InTunnel) -> None:
    exc = refused.exc
    if not refused.tls:
        await _answer(writer, _Refusal(exc.status, exc.reason, exc.detail))
        return
    with contextlib.suppress(OSError, ConnectionError):
        writer.write(tls_alert(exc.alert))
        await asyncio.wait_for(writer.drain(), 2)


def _peer_uid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


async def _answer(writer: asyncio.StreamWriter, refusal: _Refusal) -> None:
    """A refusal as an HTTP answer: the reason in the status line (clients show it for a
    failed CONNECT) and the body (they show it for a plain request)."""
    phrase = {400: "Bad Request", 403: "Forbidden", 407: "Proxy Authentication Required",
              502: "Bad Gateway"}.get(refusal.status, "Refused")  # fmt: skip
    text = _printable(f"runnerd egress refused ({refusal.reason}): {refusal.detail}")
    body = (text + "\n").encode()
    head = (
        f"HTTP/1.1 {refusal.status} {phrase} - {text}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"X-Runnerd-Egress-Refused: {refusal.reason}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(OSError, ConnectionError):
        writer.write(head + body)
        await asyncio.wait_for(writer.drain(), 2)


def _printable(text: str, limit: int = MAX_DESTINATION_CHARS) -> str:
    cleaned = "".join(c if " " <= c <= "~" else "?" for c in text)
    return cleaned[:limit]


def _abort(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.transport.abort()


def _remove_stale(folder: Path) -> None:
    """Remove the sockets of runnerd processes that are gone (killed before their close)."""
    for sock in folder.glob("*.sock"):
        if not sock.stem.isdigit():
            continue
        try:
            os.kill(int(sock.stem), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                sock.unlink()
        except OSError:
            pass


def socket_path(lock_dir: Path) -> Path:
    """This process's proxy socket: beside the uid locks, named by the process."""
    return lock_dir.parent / "egress" / f"{os.getpid()}.sock"
