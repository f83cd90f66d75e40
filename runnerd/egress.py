"""Egress destinations: what an app may ask to reach, and what an install grants.

An entry is a host name (``api.stripe.com``), a wildcard subdomain (``*.slack.com``: any
name below slack.com, not slack.com itself), or an IP literal (``198.18.0.2``,
``[2001:db8::1]``), each optionally with a port (``crm.internal:8443``). Without a port
it means ports 443 and 80. Entries are kept in a normal form (lower case, IPv6 in
brackets, no default port), so two spellings of one destination are one entry.

The daemon's ``egress_allow_networks`` (parse_networks) opens private networks to egress,
never the networks in NEVER_NETWORKS.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from runnerd.limits import MAX_EGRESS_ENTRY_CHARS

__all__ = [
    "DEFAULT_PORTS",
    "NEVER_NETWORKS",
    "Destination",
    "EgressError",
    "Network",
    "covers",
    "parse",
    "parse_networks",
]

DEFAULT_PORTS = (443, 80)  # an entry without a port: HTTPS and HTTP
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# Never opened by egress_allow_networks: the host itself, cloud metadata, broadcast.
NEVER_NETWORKS = [
    ipaddress.ip_network(n)
    for n in ("127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128", "169.254.0.0/16", "fe80::/10",
              "224.0.0.0/4", "ff00::/8", "255.255.255.255/32", "::ffff:0:0/96",
              "::/96", "::ffff:0:0:0/96")
]  # fmt: skip
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_NUMERIC = re.compile(r"[0-9]+|0x[0-9a-f]*")  # a last label that makes a name an IPv4 (WHATWG)


class EgressError(ValueError):
    """An entry that is not a destination; the message says why."""


@dataclass(frozen=True)
class Destination:
    host: str  # a name, "*.domain", or an IP address (IPv6 without brackets)
    port: int | None  # None: DEFAULT_PORTS
    wildcard: bool = False
    ip: bool = False

    @property
    def ports(self) -> tuple[int, ...]:
        return DEFAULT_PORTS if self.port is None else (self.port,)

    def __str__(self) -> str:
        host = f"[{self.host}]" if self.ip and ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def parse(entry: str) -> Destination:
    """``entry`` as a Destination; EgressError saying what is wrong with it."""
    text = entry.strip().lower()
    if not text or len(text) > MAX_EGRESS_ENTRY_CHARS:
        raise EgressError(f"a destination is 1 to {MAX_EGRESS_ENTRY_CHARS} characters")
    if "://" in text or "/" in text or "@" in text or "?" in text:
        raise EgressError(
            "a destination is a host, *.domain or an IP address, with an optional :port "
            "(no scheme, path or user)"
        )
    host, port = _split_port(text)
    try:  # "169.254.169.254." is that address too, for every resolver and URL parser
        address = ipaddress.ip_address(host[:-1] if host.endswith(".") else host)
    except ValueError:
        address = None
    if address is not None:
        return Destination(str(address), port, ip=True)
    wildcard = host.startswith("*.")
    name = host[2:] if wildcard else host
    if "*" in name:
        raise EgressError("a wildcard is only a leading '*.', such as *.slack.com")
    labels = name.rstrip(".").split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise EgressError(f"{host!r} is not a host name (letters, digits and hyphens per label)")
    if _NUMERIC.fullmatch(labels[-1]):
        # 0177.0.0.1, 127.1, 0x7f.1, 2130706433: URL parsers read an IPv4 address in them,
        # resolvers may read another one or a name; no real host name ends so.
        raise EgressError(
            f"{host!r} ends in a number, so programs read it as different IPv4 addresses; "
            "write an IP address as four decimal numbers (a.b.c.d)"
        )
    if wildcard and len(labels) < 2:
        raise EgressError("a wildcard needs a domain of two labels or more, such as *.slack.com")
    return Destination(("*." if wildcard else "") + ".".join(labels), port, wildcard=wildcard)


def _split_port(text: str) -> tuple[str, int | None]:
    if text.startswith("["):  # [IPv6] or [IPv6]:port
        end = text.find("]")
        if end == -1:
            raise EgressError("an IPv6 address in brackets needs its closing ']'")
        host, rest = text[1:end], text[end + 1 :]
        if ":" not in host:
            raise EgressError("only an IPv6 address goes in brackets")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise EgressError("after ']' comes only ':port'")
        return host, _port(rest[1:])
    if text.count(":") > 1:  # a bare IPv6 address: no port possible
        return text, None
    host, colon, port = text.partition(":")
    return host, _port(port) if colon else None


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise EgressError(f"the port {text!r} is not a number from 1 to 65535")
    return int(text)


def covers(granted: Destination, wanted: Destination) -> bool:
    """Whether a grant of ``granted`` includes everything ``wanted`` reaches."""
    if not set(wanted.ports) <= set(granted.ports):
        return False
    if granted.ip or wanted.ip:
        return granted.ip and wanted.ip and granted.host == wanted.host
    if not granted.wildcard:
        return not wanted.wildcard and granted.host == wanted.host
    domain = granted.host[1:]  # ".slack.com"
    return wanted.host.endswith(domain) and wanted.host != domain[1:]


def parse_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """``egress_allow_networks`` as networks; ValueError naming the entry at fault, which
    is also any entry that overlaps one of NEVER_NETWORKS."""
    found = []
    for entry in entries:
        try:
            network = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            raise ValueError(
                f"{entry!r} is not a network in CIDR form, such as 10.20.0.0/16"
            ) from None
        for never in NEVER_NETWORKS:
            if network.version == never.version and network.overlaps(never):
                raise ValueError(
                    f"{entry!r} overlaps {never}, which egress never reaches (this host, "
                    "link-local and cloud metadata, multicast, IPv4-mapped, -compatible "
                    "and -translated)"
                )
        found.append(network)
    return tuple(found)
