"""/mcp's transport rules, through a real daemon and raw HTTP: the Host and Origin checks
of the MCP spec's DNS-rebinding rule come before anything else (a refused one is 403
with the header named, even without a key; a served one goes on to the key check)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import RUNNERD
from daemon import Daemon, running_daemon

pytestmark = pytest.mark.jail

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}


@pytest.fixture(scope="module")
def d(toolchain_dir: Path) -> Iterator[Daemon]:
    with running_daemon(toolchain_dir, allowed_hosts="runnerd.corp.example") as daemon:
        yield daemon


def _post(d: Daemon, headers: dict[str, str], key: str | None = None) -> httpx.Response:
    sent = {"Accept": "application/json, text/event-stream", **headers}
    if key:
        sent["Authorization"] = f"Bearer {key}"
    return d.http.post(f"/mcp?workspaceId={d.workspace_id}", json=INIT, headers=sent)


@pytest.mark.parametrize(
    "host",
    ["evil.example", "127.0.0.1.evil.example", "localhost.evil.example:80", "", "a b", "[::2]"],
)
def test_a_host_not_served_is_refused_before_the_key(d: Daemon, host: str) -> None:
    answer = _post(d, {"Host": host}, key=d.admin_key)
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["details"] == {"code": "HOST_NOT_ALLOWED", "field": "Host"}, error


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8686", "localhost", "LOCALHOST:1", "[::1]:9", "runnerd.corp.example"]
)
def test_served_hosts_go_on_to_the_key_check(d: Daemon, host: str) -> None:
    assert _post(d, {"Host": host}).status_code == 401


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "null", "http://127.0.0.1.evil.example", "file://x"]
)
def test_a_page_of_another_site_is_refused(d: Daemon, origin: str) -> None:
    answer = _post(d, {"Origin": origin}, key=d.admin_key)
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["details"] == {"code": "ORIGIN_NOT_ALLOWED", "field": "Origin"}


def _raw(d: Daemon, path: str, headers: list[tuple[str, str]], body: bytes = b"") -> bytes:
    """One request as sent, headers repeated as given (no client library allows two
    Hosts), and the answer's first bytes."""
    head = f"{'POST' if body else 'GET'} {path} HTTP/1.1\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers)
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as conn:
        conn.sendall(head.encode() + body)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        return answer


@pytest.mark.parametrize(
    ("header", "reason"), [("Host", "HOST_NOT_ALLOWED"), ("Origin", "ORIGIN_NOT_ALLOWED")]
)
def test_two_hosts_or_origins_are_refused_in_either_order(
    d: Daemon, header: str, reason: str
) -> None:
    """A proxy in front may read another one of the two than this check: both orders."""
    good = f"127.0.0.1:{d.port}" if header == "Host" else "http://localhost:5173"
    bad = "evil.example" if header == "Host" else "http://evil.example"
    body = json.dumps(INIT).encode()
    for pair in ((good, bad), (bad, good)):
        sent = [
            ("Accept", "application/json, text/event-stream"),
            ("Content-Type", "application/json"),
            ("Authorization", f"Bearer {d.admin_key}"),
            *((header, v) for v in pair),
        ]
        if header == "Origin":
            sent.append(("Host", f"127.0.0.1:{d.port}"))
        answer = _raw(d, f"/mcp?workspaceId={d.workspace_id}", sent, body)
        assert answer.startswith(b"HTTP/1.1 403"), (pair, answer[:300])
        assert reason.encode() in answer
    if header == "Host":  # the OAuth endpoints read Host the same way
        meta = _raw(d, "/.well-known/oauth-authorization-server", [("Host", good), ("Host", bad)])
        assert meta.startswith(b"HTTP/1.1 403"), meta[:300]


def test_an_allowed_origin_and_no_origin_are_served(d: Daemon) -> None:
    for headers in ({"Origin": "http://localhost:5173"}, {}):
        answer = _post(d, headers, key=d.admin_key)
        assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("rk_p_not-a-key", "401 UNAUTHORIZED"),
        ("workspace", "403 WORKSPACE_KEY_NOT_ALLOWED"),
    ],
)
def test_the_stdio_bridge_says_a_refused_key_in_one_line(d: Daemon, key: str, said: str) -> None:
    if key == "workspace":
        made = d.call("POST", f"/api/v2/workspaces/{d.workspace_id}/keys", d.admin_key,
                      json={"kind": "workspace", "name": "bridge"})  # fmt: skip
        assert made.status_code == 201, made.text
        key = made.json()["apiKey"]
    bridge = subprocess.run(
        [RUNNERD, "mcp", "--url", d.url, "--workspace", d.workspace_id],
        env={**os.environ, "RUNNERD_API_KEY": key},
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bridge.returncode == 1
    lines = bridge.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"runnerd mcp: {said}: "), bridge.stderr
    assert key not in bridge.stderr
