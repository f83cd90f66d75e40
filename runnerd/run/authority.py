"""What a connection through the egress proxy names, checked against what it was granted.

A grant names a host (or an IP address) and a port; the proxy connects to that address.
What reaches the server behind it may still name another site it serves: the ``Host``
header or the absolute URI of an HTTP request, or the server name (SNI) of a TLS
ClientHello. This module reads those, and nothing else: request heads and the framing of
their bodies (so that every request on a connection is seen), and the ClientHello's
record and handshake headers and its server_name extension (TLS is never decrypted).

Every refusal is an ``AuthorityRefused`` with an HTTP status, a short reason and a detail
that names the field at fault; nothing it carries is a payload byte.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from runnerd.egress import Destination, EgressError, parse
from runnerd.limits import MAX_CLIENT_HELLO_BYTES, PROXY_CHUNK_BYTES

__all__ = [
    "ALERT_DECODE_ERROR",
    "AUTHORITY_MISMATCH",
    "CHUNKED",
    "AuthorityRefused",
    "Request",
    "check_request",
    "check_server_name",
    "forward_body",
    "is_token_start",
    "read_client_hello",
    "read_head",
    "tls_alert",
]

AUTHORITY_MISMATCH = "authority mismatch"
CHUNKED = -1  # Request.body: a chunked body, read chunk by chunk

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # all but HTAB
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")
_VERSIONS = (b"HTTP/1.1", b"HTTP/1.0")
# Dropped from a request the proxy forwards for a client (they are the proxy's own, or ask
# for a protocol switch, which ``Connection: close`` rules out).
_HOP_HEADERS = {b"proxy-authorization", b"proxy-connection", b"connection", b"keep-alive",
                b"upgrade", b"http2-settings"}  # fmt: skip
_EXT_SERVER_NAME = 0
_EXT_ENCRYPTED = (0xFE0D, 0xFFCE)  # encrypted ClientHello (ECH), and its draft (ESNI)
ALERT_UNRECOGNIZED_NAME, ALERT_ACCESS_DENIED, ALERT_DECODE_ERROR = 112, 49, 50

Send = Callable[[bytes], Awaitable[None]]


class AuthorityRefused(Exception):
    """A request or ClientHello that may not pass; ``alert`` is the TLS alert to send when
    the client is speaking TLS."""

    def __init__(self, status: int, reason: str, detail: str, alert: int = 0) -> None:
        self.status, self.reason, self.detail, self.alert = status, reason, detail, alert
        super().__init__(detail)


def _bad(detail: str) -> AuthorityRefused:
    return AuthorityRefused(400, "bad request", detail, ALERT_DECODE_ERROR)


@dataclass(frozen=True)
class Request:
    head: bytes  # what goes to the server, ending in an empty line
    body: int  # its body's length, or CHUNKED


def check_request(head: bytes, wanted: Destination, *, proxied: bool) -> Request:
    """Check one HTTP/1 request head (ending in CRLF CRLF) against ``wanted``, whose port
    is set: its target and its one ``Host`` must name ``wanted`` (a port in them must be
    ``wanted``'s; case and a trailing dot do not matter).

    ``proxied``: the head was sent to the proxy (absolute ``http://`` target); the head
    returned is origin-form, without the proxy's headers, with ``Connection: close`` (and
    a ``Host`` when it had none). Otherwise the head came inside a tunnel and goes on as it
    is. AuthorityRefused (400 for a head that is not strict HTTP/1, 403 ``authority
    mismatch``) when it may not pass."""
    lines = head[:-4].split(b"\r\n")
    if any(_CONTROL.search(line) for line in lines):
        raise _bad("a control character (a bare CR or LF?) in the request head")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or parts[2] not in _VERSIONS:
        raise _bad("the request line is not 'METHOD target HTTP/1.1'")
    method, target, version = parts
    headers: list[tuple[bytes, bytes, bytes]] = []  # name in lower case, value, the line
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise _bad("a header line is not 'Name: value' (no folded lines)")
        headers.append((name.lower(), value.strip(b" \t"), line))
    hosts = [value for name, value, _ in headers if name == b"host"]
    if len(hosts) > 1:
        raise _bad("the request has more than one Host header")

    path = target
    if proxied or not target.startswith(b"/"):
        if target == b"*" and method == b"OPTIONS" and not proxied:
            pass
        elif target[:7].lower() == b"http://" or (
            target[:8].lower() == b"https://" and not proxied
        ):
            rest = target.split(b"://", 1)[1]
            cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i != -1), default=-1)
            authority, path = (rest, b"/") if cut == -1 else (rest[:cut], rest[cut:])
            if path.startswith(b"?"):
                path = b"/" + path
            _same(authority, wanted, "the request's URL")
        else:
            raise _bad("send CONNECT host:port, or a plain http:// URL")
    if hosts:
        _same(hosts[0], wanted, "the Host header")
    elif not proxied or version == b"HTTP/1.1":
        raise _bad("the request has no Host header")
    body = _framing(headers)
    if not proxied:
        return Request(head, body)
    kept = [line for name, _, line in headers if name not in _HOP_HEADERS]
    if not hosts:
        kept.append(b"Host: " + str(wanted).encode())
    request = b"\r\n".join([method + b" " + path + b" " + version, *kept, b"Connection: close"])
    return Request(request + b"\r\n\r\n", body)


def _same(authority: bytes, wanted: Destination, field: str) -> None:
    try:
        named = parse(authority.decode("ascii"))
    except (UnicodeDecodeError, EgressError) as exc:
        detail = exc if isinstance(exc, EgressError) else "not ASCII"
        raise _bad(f"{field} is not a host[:port] ({detail})") from None
    if named.wildcard or named.host != wanted.host or named.port not in (None, wanted.port):
        raise AuthorityRefused(
            403,
            AUTHORITY_MISMATCH,
            f"{field} names {_shown(named)}, but this connection is to {wanted}",
            ALERT_UNRECOGNIZED_NAME,
        )


def _shown(named: Destination) -> str:
    return str(named)[:270]


def _framing(headers: list[tuple[bytes, bytes, bytes]]) -> int:
    codings = [value for name, value, _ in headers if name == b"transfer-encoding"]
    lengths = [value for name, value, _ in headers if name == b"content-length"]
    if codings:
        if lengths or len(codings) > 1 or codings[0].lower() != b"chunked":
            raise _bad("Transfer-Encoding is only 'chunked', once, and without Content-Length")
        return CHUNKED
    if not lengths:
        return 0
    if len(lengths) > 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
        raise _bad("Content-Length is one number")
    return int(lengths[0])


async def forward_body(reader: asyncio.StreamReader, body: int, send: Send) -> None:
    """Pass one request's body (``body``: its length, or CHUNKED) from ``reader`` to
    ``send``, and no byte past it. AuthorityRefused for a malformed chunk;
    IncompleteReadError when the client stops early."""
    if body != CHUNKED:
        await _exactly(reader, body, send)
        return
    while True:
        line = await reader.readuntil(b"\r\n")
        size = line[:-2].split(b";", 1)[0].strip(b" \t")
        if not _CHUNK_SIZE.fullmatch(size) or b"\r" in line[:-2] or b"\n" in line[:-2]:
            raise _bad("a chunk of the request body has no size")
        await send(line)
        length = int(size, 16)
        if length == 0:
            break
        await _exactly(reader, length, send)
        if await reader.readexactly(2) != b"\r\n":
            raise _bad("a chunk of the request body does not end in CRLF")
        await send(b"\r\n")
    while True:  # trailers, up to an empty line
        line = await reader.readuntil(b"\r\n")
        if b"\r" in line[:-2] or b"\n" in line[:-2]:
            raise _bad("a control character in the request's trailers")
        await send(line)
        if line == b"\r\n":
            return


async def _exactly(reader: asyncio.StreamReader, count: int, send: Send) -> None:
    while count > 0:
        data = await reader.read(min(count, PROXY_CHUNK_BYTES))
        if not data:
            raise asyncio.IncompleteReadError(b"", count)
        count -= len(data)
        await send(data)


async def read_client_hello(reader: asyncio.StreamReader, first: bytes) -> tuple[bytes, str | None]:
    """Read the TLS records that carry the first ClientHello (``first``: bytes already
    read), however they are split into records and segments. The bytes read, to be
    forwarded as they are, and the ClientHello's server name (None: it sends none).
    AuthorityRefused for anything else: another record or message first, a ClientHello
    past MAX_CLIENT_HELLO_BYTES, several names, or an encrypted ClientHello (the name it
    hides cannot be checked)."""
    seen = bytearray(first)
    message = bytearray()
    offset = 0  # where the next record starts in ``seen``

    async def need(count: int) -> None:
        while len(seen) < count:
            if len(seen) > 4 * MAX_CLIENT_HELLO_BYTES:
                raise _bad(f"the TLS ClientHello is larger than {MAX_CLIENT_HELLO_BYTES} bytes")
            seen.extend(await _more(reader))

    while True:
        await need(offset + 5)
        kind, length = seen[offset], int.from_bytes(seen[offset + 3 : offset + 5], "big")
        if kind != 22 or seen[offset + 1] != 3 or not 0 < length <= 16384:
            raise _bad("the tunnel's first TLS record is not a handshake record")
        await need(offset + 5 + length)
        message += seen[offset + 5 : offset + 5 + length]
        offset += 5 + length
        if message[0] != 1:
            raise _bad("the tunnel's first TLS message is not a ClientHello")
        if len(message) >= 4:
            size = int.from_bytes(message[1:4], "big")
            if size > MAX_CLIENT_HELLO_BYTES:
                raise _bad(f"the TLS ClientHello is larger than {MAX_CLIENT_HELLO_BYTES} bytes")
            if len(message) >= 4 + size:
                return bytes(seen), _server_name(bytes(message[4 : 4 + size]))


async def _more(reader: asyncio.StreamReader) -> bytes:
    data = await reader.read(16 * 1024)
    if not data:
        raise asyncio.IncompleteReadError(b"", None)
    return data


def _server_name(hello: bytes) -> str | None:
    """The host_name of a ClientHello body's server_name extension, or None."""
    try:
        at = 2 + 32  # legacy_version, random
        at += 1 + hello[at]  # session id
        at += 2 + int.from_bytes(hello[at : at + 2], "big")  # cipher suites
        at += 1 + hello[at]  # compression methods
        if at == len(hello):
            return None  # no extensions
        end = at + 2 + int.from_bytes(hello[at : at + 2], "big")
        at += 2
        if end != len(hello):
            raise IndexError
        found: str | None = None
        kinds = set()
        while at < end:
            kind = int.from_bytes(hello[at : at + 2], "big")
            size = int.from_bytes(hello[at + 2 : at + 4], "big")
            data = hello[at + 4 : at + 4 + size]
            if len(data) != size or kind in kinds:
                raise IndexError
            kinds.add(kind)
            at += 4 + size
            if kind in _EXT_ENCRYPTED:
                raise AuthorityRefused(
                    403,
                    AUTHORITY_MISMATCH,
                    "the TLS ClientHello is encrypted (ECH): the name it asks for cannot be "
                    "checked against the grant",
                    ALERT_ACCESS_DENIED,
                )
            if kind == _EXT_SERVER_NAME:
                found = _host_name(data)
        return found
    except IndexError:
        raise _bad("the TLS ClientHello is malformed") from None


def _host_name(data: bytes) -> str:
    if int.from_bytes(data[:2], "big") != len(data) - 2 or len(data) < 5:
        raise IndexError
    if data[2] != 0 or int.from_bytes(data[3:5], "big") != len(data) - 5:
        raise _bad("the TLS ClientHello's server_name is not one host name")
    try:
        return data[5:].decode("ascii")
    except UnicodeDecodeError:
        raise _bad("the TLS ClientHello's server name is not ASCII") from None


def check_server_name(name: str | None, wanted: Destination) -> None:
    """A ClientHello's server name must be ``wanted``'s host (case and a trailing dot do
    not matter); a grant of an IP address takes none (SNI cannot carry an address, and a
    name there picks a site the grant does not name). AuthorityRefused otherwise."""
    if wanted.ip:
        if name is None:
            return
        detail = f"the TLS ClientHello names {name[:260]!r}, but the grant is the address {wanted}"
    elif name is None:
        detail = f"the TLS ClientHello names no server, but this connection is to {wanted}"
    else:
        try:
            named = parse(name)
        except EgressError as exc:
            raise _bad(f"the TLS ClientHello's server name is not a host ({exc})") from None
        if not (named.wildcard or named.ip or named.port) and named.host == wanted.host:
            return
        detail = f"the TLS ClientHello names {_shown(named)}, but this connection is to {wanted}"
    raise AuthorityRefused(403, AUTHORITY_MISMATCH, detail, ALERT_UNRECOGNIZED_NAME)


def tls_alert(alert: int) -> bytes:
    """A fatal TLS alert record, what a TLS client understands as a refusal."""
    return bytes([21, 3, 3, 0, 2, 2, alert])


_REQUEST_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ [^ ]+ HTTP/1\.[01]\r\n")


def is_token_start(byte: int) -> bool:
    """Whether a tunnel whose first byte is ``byte`` may be speaking HTTP (a method's first
    character, or the CR or LF some servers skip before one)."""
    return bool(_TOKEN.fullmatch(bytes([byte]))) or byte in b"\r\n \t"


async def read_head(reader: asyncio.StreamReader, first: bytes, limit: int) -> bytes:
    """One request head from ``reader`` (``first``: its bytes already read), up to its
    empty line. AuthorityRefused at once when its first line is not an HTTP/1 request line,
    or when the head passes ``limit`` bytes."""
    line = first + await reader.readuntil(b"\r\n")
    if not _REQUEST_LINE.fullmatch(line):
        raise _bad("what the tunnel carries is neither TLS nor an HTTP/1 request")
    head = line
    while not head.endswith(b"\r\n\r\n"):
        head += await reader.readuntil(b"\r\n")
        if len(head) > limit:
            raise _bad(f"the request head is larger than {limit} bytes")
    return head
