"""Client ID Metadata Documents: a client whose ``client_id`` is an https URL publishes
its metadata (name, redirect URIs) as JSON at that URL, and runnerd fetches it.

The fetch reaches only public addresses: the name is resolved first, every address it
has must be a global one, and the request goes to the address that was checked (the
Host header and TLS name stay the URL's), so a name that resolves again differently
reaches nothing else. No redirect is followed; the answer must come within
``OAUTH_FETCH_TIMEOUT_S`` and be at most ``OAUTH_MAX_DOCUMENT_BYTES``. With
``oauth_allow_loopback_clients`` a document may also come from a loopback address over
plain http (tests; a client on this host).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import weakref
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import msgspec

from runnerd.limits import OAUTH_FETCH_TIMEOUT_S, OAUTH_MAX_DOCUMENT_BYTES, OAUTH_MAX_FETCHES
from runnerd.run.addresses import address_refusal

__all__ = [
    "DocumentRefused",
    "fetch_document",
    "is_url_id",
]


class DocumentRefused(Exception):
    """The client's document could not be used; the message says why (safe to show)."""


def is_url_id(client_id: str) -> bool:
    """Whether ``client_id`` names a metadata document (an http(s) URL with a path)."""
    parts = urlsplit(client_id)
    return (
        parts.scheme in ("https", "http") and bool(parts.hostname) and parts.path not in ("", "/")
    )


def _allowed(address: str, loopback: bool) -> bool:
    """A public address by egress's rules (run/addresses.py: an IPv6 address that carries
    an IPv4 one, NAT64, 6to4, Teredo or mapped, is judged as each it may stand for), or
    with ``loopback`` a loopback one."""
    ip = ipaddress.ip_address(address)
    if loopback and (ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None
                                         and ip.ipv4_mapped.is_loopback)):  # fmt: skip
        return True
    return address_refusal(ip, ()) is None


async def _address(host: str, port: int, loopback: bool) -> str:
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise DocumentRefused(f"the client's host {host!r} does not resolve") from None
    addresses = sorted({str(info[4][0]) for info in found})
    if not addresses or not all(_allowed(a, loopback) for a in addresses):
        raise DocumentRefused(f"the client's host {host!r} is not a public address")
    return addresses[0]


_tls: list[ssl.SSLContext] = []  # the fetches' one TLS context, once made
# Fetches at once, per event loop (a daemon has one): the rest wait their turn.
_fetching: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


async def _tls_context() -> ssl.SSLContext:
    """The TLS context of every fetch, made once off the event loop (loading the CA
    store takes tens of ms: per fetch, a flood of requests would stall the daemon)."""
    if not _tls:
        _tls.append(await asyncio.to_thread(ssl.create_default_context))
    return _tls[0]


async def fetch_document(client_id: str, *, allow_loopback: bool) -> dict[str, Any]:
    """The metadata document at ``client_id``, checked: a JSON object whose client_id is
    that URL, with redirect URIs. DocumentRefused otherwise. At most
    ``OAUTH_MAX_FETCHES`` at once on a node."""
    loop = asyncio.get_running_loop()
    gate = _fetching.setdefault(loop, asyncio.Semaphore(OAUTH_MAX_FETCHES))
    async with gate:
        return await _fetch(client_id, allow_loopback=allow_loopback)


async def _fetch(client_id: str, *, allow_loopback: bool) -> dict[str, Any]:
    parts = urlsplit(client_id)
    host = parts.hostname or ""
    if parts.scheme != "https" and not (allow_loopback and parts.scheme == "http"):
        raise DocumentRefused("a client_id URL must be https")
    if parts.username or parts.password or parts.fragment:
        raise DocumentRefused("a client_id URL has no user, password or fragment")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = await _address(host, port, allow_loopback)
    if parts.scheme == "http" and not ipaddress.ip_address(address).is_loopback:
        raise DocumentRefused("a client_id URL must be https")
    pinned = f"[{address}]" if ":" in address else address
    target = urlunsplit(parts._replace(netloc=f"{pinned}:{port}"))
    try:
        async with (
            httpx.AsyncClient(
                timeout=OAUTH_FETCH_TIMEOUT_S,
                follow_redirects=False,
                trust_env=False,
                verify=await _tls_context(),
            ) as client,
            asyncio.timeout(OAUTH_FETCH_TIMEOUT_S),
            client.stream(
                "GET",
                target,
                headers={"Host": parts.netloc.rpartition("@")[2], "Accept": "application/json"},
                extensions={"sni_hostname": host},
            ) as response,
        ):
            if response.status_code != 200:
                raise DocumentRefused(f"the client's document answered {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > OAUTH_MAX_DOCUMENT_BYTES:
                    raise DocumentRefused("the client's document is too large")
    except (httpx.HTTPError, TimeoutError):
        raise DocumentRefused("the client's document could not be fetched") from None
    try:
        document = msgspec.json.decode(bytes(body))
    except msgspec.DecodeError:
        raise DocumentRefused("the client's document is not JSON") from None
    if not isinstance(document, dict) or document.get("client_id") != client_id:
        raise DocumentRefused("the client's document must name its own URL as client_id")
    uris = document.get("redirect_uris")
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise DocumentRefused("the client's document has no redirect_uris")
    if document.get("token_endpoint_auth_method", "none") != "none":
        raise DocumentRefused("a client known by its document authenticates with none")
    for secret in ("client_secret", "client_secret_expires_at"):
        if secret in document:
            raise DocumentRefused("a client's document holds no secret")
    return document
