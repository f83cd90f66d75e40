"""The address rules of egress: which IP addresses a run's connection may go to.

Refused, whatever a grant names: loopback, private, link-local (cloud metadata), CGNAT,
multicast, unspecified, reserved, site-local and ULA addresses, but for the ranges an
operator opens in ``egress_allow_networks``; never opened by those: the networks in
egress.NEVER_NETWORKS and the IPv4-mapped, -compatible and -translated forms. An IPv6
address that carries an IPv4 one (NAT64, 6to4, Teredo) is judged as each address it may
stand for. The proxy (run/proxy.py) applies them to every address it would connect to,
and refuses this host's own addresses too (``is_this_host``); a deploy applies
``never_refusal`` to the IP addresses a manifest grants.
"""

from __future__ import annotations

import ipaddress
import socket

from runnerd.egress import NEVER_NETWORKS, Network

__all__ = ["Address", "address_refusal", "embedded_ipv4", "is_this_host", "never_refusal"]

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: a local translator's
_V6_OWN = (ipaddress.IPv6Address("::"), ipaddress.IPv6Address("::1"))  # not IPv4-compatible
# IPv6 ranges whose last 32 bits are an IPv4 address (RFC 6052, RFC 4291, RFC 2765).
_V4_FORMS = [
    (ipaddress.IPv6Network("::ffff:0:0/96"), "an IPv4-mapped address"),
    (ipaddress.IPv6Network("::/96"), "an IPv4-compatible address"),  # deprecated, RFC 4291
    (ipaddress.IPv6Network("::ffff:0:0:0/96"), "an IPv4-translated address"),  # RFC 2765
]
_LOW_32 = [(ipaddress.IPv6Network("64:ff9b::/96"), "a NAT64 address"), *_V4_FORMS]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def address_refusal(address: Address, allowed: tuple[Network, ...]) -> str | None:
    """Why ``address`` is no place for egress (a short phrase), or None if it may be used.

    An IPv6 address that carries an IPv4 one (NAT64, 6to4, Teredo) is judged as each
    address it may stand for, by the same rules: behind a translator it reaches that IPv4
    address."""
    why = never_refusal(address)
    if why is not None:
        return why
    for form, inner in embedded_ipv4(address):
        why = address_refusal(inner, allowed)
        if why is not None:
            return f"{form} of {inner}, {why}"
    if any(address.version == net.version and address in net for net in allowed):
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address in _NAT64_LOCAL:
            return "a local-use NAT64 address"
        if address.is_site_local:
            return "a site-local address"
    if address.is_multicast or not address.is_global or address in _CGNAT:
        return _kind(address)
    return None


def never_refusal(address: Address) -> str | None:
    """Why egress never reaches ``address``, whatever ``egress_allow_networks`` opens (the
    host itself, link-local and cloud metadata, multicast, unspecified, the IPv4-mapped,
    -compatible and -translated forms, and any of those an IPv6 address carries), or None."""
    if isinstance(address, ipaddress.IPv6Address):
        for network, form in _V4_FORMS:
            if address in network and address not in _V6_OWN:
                inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
                return f"{form} (of {inner}), which egress never uses"
    for form, inner in embedded_ipv4(address):
        why = never_refusal(inner)
        if why is not None:
            return f"{form} of {inner}, {why}"
    for never in NEVER_NETWORKS:
        if address.version == never.version and address in never:
            return _kind(address)
    return None


def embedded_ipv4(address: Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """Every IPv4 address an IPv6 ``address`` may stand for, each with the form that carries
    it: NAT64 (64:ff9b::/96; 64:ff9b:1::/48 at each RFC 6052 prefix length), IPv4-compatible
    (::/96), IPv4-translated (::ffff:0:0:0/96), IPv4-mapped, 6to4 (2002::/16) and Teredo
    (2001::/32: its server and its client). Empty for an IPv4 address, :: and ::1."""
    if not isinstance(address, ipaddress.IPv6Address) or address in _V6_OWN:
        return []
    value = int(address)
    low = ipaddress.IPv4Address(value & 0xFFFFFFFF)
    found: list[tuple[str, ipaddress.IPv4Address]] = []
    for network, form in _LOW_32:
        if address in network:
            found.append((form, low))
    if address in _NAT64_LOCAL:
        # RFC 6052 section 2.2: past a /48 prefix the IPv4 bits skip bits 64-71.
        octets = address.packed
        for start in (6, 7):  # the /48 and /56 layouts
            picked = [b for i, b in enumerate(octets[start:], start) if i != 8][:4]
            found.append(("a NAT64 address", ipaddress.IPv4Address(bytes(picked))))
        found.append(("a NAT64 address", ipaddress.IPv4Address(octets[9:13])))  # the /64
        found.append(("a NAT64 address", low))  # the /96
    if address.sixtofour is not None:
        found.append(("a 6to4 address", address.sixtofour))
    if address.teredo is not None:
        server, client = address.teredo
        found += [("a Teredo address", server), ("a Teredo address", client)]
    return found


def _kind(address: Address) -> str:
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


def is_this_host(address: Address) -> bool:
    """Whether ``address`` is one of this host's own (it can be bound to)."""
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True
