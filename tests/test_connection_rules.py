"""The rules behind the daemon's port (runnerd/daemon/connections.py) that need no port:
what counts as one client, and the connection settings refused by name. The port itself,
against slow and many connections, is in test_connections.py."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ("127.0.0.1", "127.0.0.2", False),
        ("::ffff:127.0.0.1", "127.0.0.1", True),  # IPv4-mapped: its IPv4 address
        ("2001:db8::1", "2001:db8::ffff:1", True),  # one /64
        ("2001:db8::1", "2001:db8:0:1::1", False),
        ("fe80::1%eth0", "fe80::2", True),
        ("::1", "::1", True),
    ],
)
def test_a_client_is_an_ipv4_address_or_an_ipv6_64(one: str, other: str, same: bool) -> None:
    from runnerd.daemon.connections import client_key

    assert (client_key(one) == client_key(other)) is same


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("http_header_timeout_s", "0"),
        ("http_header_timeout_s", "nan"),
        ("http_body_timeout_s", "-1"),
        ("http_body_timeout_s", "inf"),
        ("http_max_connections_per_client", "0"),
        ("http_max_connections", "-5"),
        ("http_max_connections", "many"),
    ],
)
def test_bad_connection_settings_are_refused_by_name(name: str, value: str) -> None:
    from runnerd.config import load_settings
    from runnerd.errors import ConfigError

    with pytest.raises(ConfigError, match=name):
        load_settings(env={f"RUNNERD_{name.upper()}": value})
