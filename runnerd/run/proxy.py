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
  this host's own addresses are refused, but for the ranges in ``egress_allow_networks``;
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
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runnerd.egress import Destination, EgressError, covers, parse

log = logging.getLogger("runnerd.egress")

__all__ = [
    "CAP_REACHED",
    "NOT_GRANTED",
    "PRIVATE_ADDRESS",
    "EgressPass",
    "EgressProxy",
    "address_refusal",
    "parse_networks",
]

NOT_GRANTED, PRIVATE_ADDRESS, CAP_REACHED = "not granted", "private address", "cap reached"
HEAD_LIMIT = 16 * 1024  # a request line and headers; more is not a proxy request
HEAD_TIMEOUT_S = 10.0  # to send them, once connected
RESOLVE_TIMEOUT_S = 5.0
RESOLVER_THREADS = 4
ACCEPT_BACKLOG = 8
CHUNK = 64 * 1024
MAX_FIGURES = 32  # destinations recorded per run; the rest are summed under "other"
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_HOP_HEADERS = {b"proxy-authorization", b"proxy-connection", b"connection", b"keep-alive"}
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# Never opened by egress_allow_networks: the host itself, cloud metadata, broadcast.
_NEVER = [
    ipaddress.ip_network(n)
    for n in ("127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128", "169.254.0.0/16", "fe80::/10",
              "224.0.0.0/4", "ff00::/8", "255.255.255.255/32", "::ffff:0:0/96")
]  # fmt: skip


def parse_networks(entries: Iterable[str]) -> tuple[_Network, ...]:
    """``egress_allow_networks`` as networks; ValueError naming the entry at fault."""
    found = []
    for entry in entries:
        try:
            network = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            raise ValueError(
                f"{entry!r} is not a network in CIDR form, such as 10.20.0.0/16"
            ) from None
        for never in _NEVER:
            if network.version == never.version and network.overlaps(never):
                raise ValueError(
                    f"{entry!r} overlaps {never}, which egress never reaches (this host, "
                    "link-local and cloud metadata, multicast, IPv4-mapped)"
                )
        found.append(network)
    return tuple(found)


def address_refusal(address: _Address, allowed: tuple[_Network, ...]) -> str | None:
    """Why ``address`` is no place for egress (a short phrase), or None if it may be used."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return "an IPv4-mapped address"
    for never in _NEVER:
        if address.version == never.version and address in never:
            return _kind(address)
    if any(address.version == net.version and address in net for net in allowed):
        return None
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.sixtofour or (address.teredo[1] if address.teredo else None)
        if embedded is not None and address_refusal(embedded, allowed):
            return "a 6to4 or Teredo address of a private one"
        if address.is_site_local:
            return "a site-local address"
    if address.is_multicast or not address.is_global or address in _CGNAT:
        return _kind(address)
    return None


def _kind(address: _Address) -> str:
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_multicast:
        return "a multicast address"
    if address.version == 4 and address in _CGNAT:
        return "a carrier-grade NAT address"
    return "a private or reserved address"


def _is_this_host(address: _Address) -> bool:
    """Whether ``address`` is one of this host's own (it can be bound to)."""
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


@dataclass
class _Use:
    connections: int = 0
    sent: int = 0
    received: int = 0
    refused: str | None = None  # the last refusal's reason, for a place never reached


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

    def use(self, destination: str) -> _Use:
        if destination not in self.uses and len(self.uses) >= MAX_FIGURES:
            destination = "other"
        return self.uses.setdefault(destination, _Use())

    def figures(self) -> list[dict[str, Any]]:
        """What the run used: per destination, connections and bytes each way, or the
        reason it was refused. No payload, path or header."""
        found = []
        for destination, use in self.uses.items():
            entry: dict[str, Any] = {
                "destination": destination,
                "connections": use.connections,
                "bytesSent": use.sent,
                "bytesReceived": use.received,
            }
            if use.refused and not use.connections:
                entry["refused"] = use.refused
            found.append(entry)
        return found


class _Refusal(Exception):
    def __init__(self, status: int, reason: str, detail: str) -> None:
        self.status, self.reason, self.detail = status, reason, detail
        super().__init__(detail)


class EgressProxy:
    """The daemon's forward proxy on a Unix socket (started on first use)."""

    def __init__(
        self,
        path: Path,
        *,
        allow_networks: tuple[_Network, ...] = (),
        max_connections: int = 64,
        max_bytes: int = 64 * 1024 * 1024,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.path = path
        self.allow_networks = allow_networks
        self.max_connections = max_connections
        self.max_bytes = max_bytes
        self.connect_timeout_s = connect_timeout_s
        self._server: asyncio.AbstractServer | None = None
        # Names resolve in threads of the proxy's own: slow DNS never holds the daemon's.
        self._resolver = ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="egress-dns")
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
                self._serve, path=str(self.path), limit=HEAD_LIMIT, backlog=ACCEPT_BACKLOG
            )
            # Any jail uid may connect; it is then known by its uid and its credential.
            self.path.chmod(0o666)

    async def close(self) -> None:
        for grant in list(self._by_token.values()):
            self.end_run(grant)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._resolver.shutdown(wait=False, cancel_futures=True)

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

    def bind(self, granted: EgressPass, uid: int) -> None:
        """The run has its jail: only that jail's uid may use the credential."""
        granted.uid = uid
        self._by_uid[uid] = granted

    def end_run(self, granted: EgressPass) -> list[dict[str, Any]]:
        """The run is over: its credential dies and its tunnels close. Its figures."""
        granted.closed = True
        self._by_token.pop(granted.token, None)
        if granted.uid is not None and self._by_uid.get(granted.uid) is granted:
            del self._by_uid[granted.uid]
        for writer in list(granted.writers):
            _abort(writer)
        granted.writers.clear()
        return granted.figures()

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
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            except (ConnectionError, OSError):
                return
            try:
                upstream_reader, upstream, use = await self._open(owner, head, writer)
            except _Refusal as refusal:
                await _answer(writer, refusal)
                return
            await self._pump(owner, use, (reader, writer), (upstream_reader, upstream))
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
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, _Use]:
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
        path = b""
        if tunnel:
            authority = target
        elif target.startswith("http://"):
            rest = target[len("http://") :]
            slash = rest.find("/")
            authority, path = (rest, b"/") if slash == -1 else (rest[:slash], rest[slash:].encode())
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
        if owner.connections >= self.max_connections or owner.bytes >= self.max_bytes:
            owner.capped = owner.capped or (
                "connections" if owner.connections >= self.max_connections else "bytes"
            )
            owner.use(where).refused = CAP_REACHED
            raise _Refusal(403, CAP_REACHED, f"this run reached its egress {owner.capped} cap")
        owner.connections += 1  # every attempt counts: a resolution or a connect costs too
        addresses = await self._addresses(owner, wanted, where)
        reader, upstream = await self._connect(addresses, port, where)
        use = owner.use(where)
        use.connections += 1
        owner.writers.add(upstream)
        if owner.closed:
            raise ConnectionAbortedError  # the run ended while this one connected
        if tunnel:
            client.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            kept = [
                line
                for line in lines[1:]
                if line.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS
            ]
            request = b"\r\n".join(
                [method + b" " + path + b" " + parts[2], *kept, b"Connection: close", b"", b""]
            )
            self._count(owner, use, sent=len(request))
            upstream.write(request)
        return reader, upstream, use

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

    async def _addresses(self, owner: EgressPass, wanted: Destination, where: str) -> list[str]:
        """The addresses of ``wanted`` that egress may use; _Refusal when there is none."""
        if wanted.ip:
            found = [ipaddress.ip_address(wanted.host)]
        else:
            loop = asyncio.get_running_loop()
            try:
                infos = await asyncio.wait_for(
                    loop.run_in_executor(self._resolver, _resolve, wanted.host, wanted.port),
                    RESOLVE_TIMEOUT_S,
                )
            except (OSError, TimeoutError):
                raise _Refusal(502, "no such host", f"{where}: the name does not resolve") from None
            found = []
            for info in infos:
                address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
                if address not in found:
                    found.append(address)
        usable = []
        refusals = []
        for address in found:
            why = address_refusal(address, self.allow_networks)
            if why is None and _is_this_host(address):
                why = "an address of this host"
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
                    asyncio.open_connection(address, port, limit=CHUNK), self.connect_timeout_s
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
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        """Copy both ways until both ends close, the byte cap is passed, or the run ends
        (end_run aborts both connections)."""

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, out: bool) -> None:
            while data := await src.read(CHUNK):
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

        await asyncio.gather(
            copy(client[0], upstream[1], True),
            copy(upstream[0], client[1], False),
            return_exceptions=True,
        )


def _resolve(host: str, port: int | None) -> list[Any]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


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


def _printable(text: str, limit: int = 300) -> str:
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
