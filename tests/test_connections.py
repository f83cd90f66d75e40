"""The daemon's HTTP port against slow and many connections (runnerd/daemon/connections.py).

A live ``runnerd serve``; attackers and probes speak raw HTTP over their own sockets,
from 127.0.0.1 (the address every local caller shares) and from 127.0.0.2 (all of
127.0.0.0/8 is loopback). docs/SECURITY.md ("Limits that protect the daemon") has the
bounds these tests prove.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import AppDir, tool_doc
from daemon import Daemon, HealthProbe, running_daemon

pytestmark = pytest.mark.jail

HEAD_S = 1.0  # the module daemon's http_header_timeout_s
BODY_S = 1.0  # its http_body_timeout_s
PER_CLIENT = 6
TOTAL = 10
DAEMON_SETTINGS = {
    "http_header_timeout_s": str(HEAD_S),
    "http_body_timeout_s": str(BODY_S),
    "http_max_connections_per_client": str(PER_CLIENT),
    "http_max_connections": str(TOTAL),
}

# The documented bounds during a flood of slow connections (docs/SECURITY.md).
FLOOD_KEPT_MS = 500.0  # /healthz on a kept-alive connection (55-85 ms here, 311 once in CI)
FLOOD_FRESH_MS = 1000.0  # /healthz on a new connection (it waits in the kernel's queue)
FLOOD_RUN_S = 5.0  # an ordinary run, end to end


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def answer(sock: socket.socket, timeout: float = 10) -> tuple[bytes, float]:
    """All the daemon sends until it closes (or ``timeout``), and when it closed."""
    sock.settimeout(timeout)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks), time.monotonic()


def status_of(raw: bytes) -> int:
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", raw)
    assert match, raw[:200]
    return int(match.group(1))


def reason_of(raw: bytes) -> str:
    body = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert set(body) == {"error"}, body
    return str(body["error"]["details"]["code"])


def one_response(sock: socket.socket) -> bytes:
    """One whole answer (it has a Content-Length) on a kept-alive connection."""
    sock.settimeout(10)
    got = b""
    while True:
        head, _, body = got.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: (\d+)", head)
        if length and len(body) >= int(length.group(1)):
            return got
        chunk = sock.recv(65536)
        assert chunk, got
        got += chunk


def healthz(port: int, source: str = "127.0.0.1") -> int:
    with connect(port, source) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return status_of(answer(sock)[0])


def is_open(sock: socket.socket) -> bool:
    """The daemon has neither answered nor closed ``sock`` (yet: it does not wait)."""
    sock.setblocking(False)
    try:
        return not sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False


# --- request heads and bodies have deadlines ----------------------------------------------------


def test_a_head_sent_a_byte_at_a_time_is_cut_with_408(daemon: Daemon) -> None:
    with connect(daemon.port) as sock:
        started = time.monotonic()
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 100
        for i, byte in enumerate(head):
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)
            if i > 60:
                break
        raw, closed = answer(sock)
    assert status_of(raw) == 408 and reason_of(raw) == "REQUEST_TIMEOUT"
    assert HEAD_S - 0.1 < closed - started < HEAD_S + 1.5


def test_the_second_head_on_a_kept_alive_connection_has_its_deadline_too(
    daemon: Daemon,
) -> None:
    with connect(daemon.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(one_response(sock)) == 200
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # and never the rest
        raw, closed = answer(sock)
    assert status_of(raw) == 408
    assert HEAD_S - 0.1 < closed - started < HEAD_S + 1.5


def test_blank_lines_do_not_hold_a_connection(daemon: Daemon) -> None:
    # Bytes that begin no request (the parser skips blank lines) start the clock too.
    with connect(daemon.port) as sock:
        started = time.monotonic()
        for _ in range(int(HEAD_S * 10) + 20):
            try:
                sock.send(b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.1)
        raw, closed = answer(sock)
    assert raw == b"" and closed - started < HEAD_S + 1.5


def test_a_connection_that_sends_nothing_is_closed(daemon: Daemon) -> None:
    with connect(daemon.port) as sock:
        started = time.monotonic()
        raw, closed = answer(sock)
    assert raw == b"" and HEAD_S - 0.1 < closed - started < HEAD_S + 1.5


def test_a_body_that_stalls_is_cut_with_408(daemon: Daemon, sleepy: str) -> None:
    with connect(daemon.port) as sock:
        sock.sendall(
            b"POST /api/v2/apps/installs/%s/tools/nap/run HTTP/1.1\r\nHost: x\r\n"
            b"X-API-Key: %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n"
            b'\r\n{"input": ' % (sleepy.encode(), daemon.admin_key.encode())
        )
        started = time.monotonic()
        raw, closed = answer(sock)
    assert status_of(raw) == 408 and reason_of(raw) == "REQUEST_TIMEOUT"
    assert BODY_S - 0.1 < closed - started < BODY_S + 1.5


def test_a_slow_but_steady_body_is_not_cut(daemon: Daemon, sleepy: str) -> None:
    # Each byte within BODY_S of the last, the whole body over 2.5 * BODY_S: it arrives.
    body = b'{"input": {"s": 0}}'
    with connect(daemon.port) as sock:
        sock.sendall(
            b"POST /api/v2/apps/installs/%s/tools/nap/run HTTP/1.1\r\nHost: x\r\n"
            b"X-API-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % (sleepy.encode(), daemon.admin_key.encode(), len(body))
        )
        for byte in body:
            sock.sendall(bytes([byte]))
            time.sleep(2.5 * BODY_S / len(body))
        raw, _ = answer(sock)
    assert status_of(raw) == 200, raw[:300]


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n",
        b"GET /healthz?" + b"q" * 40_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n",
    ],
    ids=["one-long-header", "long-url", "many-fields"],
)
def test_a_head_past_the_caps_is_431(daemon: Daemon, head: bytes) -> None:
    with connect(daemon.port) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head)
        raw, _ = answer(sock)
    assert status_of(raw) == 431 and reason_of(raw) == "REQUEST_HEAD_TOO_LARGE"
    assert healthz(daemon.port) == 200


# --- caps per client and in total ---------------------------------------------------------------


def test_at_the_cap_the_oldest_unfinished_request_goes_not_the_idle_caller(
    daemon: Daemon,
) -> None:
    caller = connect(daemon.port)  # a local caller that keeps its connection
    caller.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(one_response(caller)) == 200
    slow = []
    for _ in range(PER_CLIENT + 3):  # half heads from the caller's own address
        sock = connect(daemon.port)
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        slow.append(sock)
        time.sleep(0.02)
    try:
        assert healthz(daemon.port) == 200  # a new caller from 127.0.0.1 gets in
        time.sleep(0.05)
        alive = [is_open(sock) for sock in slow]
        # The oldest half heads made room, the newest are held (until their deadline); an
        # idle kept-alive connection of the test's own client may have gone too.
        first = alive.index(True)
        assert first >= 4 and all(alive[first:]) and len(alive) - first >= PER_CLIENT - 3, alive
        evicted = answer(slow[0])[0]
        assert status_of(evicted) == 503 and reason_of(evicted) == "TOO_MANY_CONNECTIONS"
        caller.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # still kept alive
        assert status_of(one_response(caller)) == 200
    finally:
        for sock in [caller, *slow]:
            sock.close()


@pytest.fixture
def sleepy(daemon: Daemon, make_app: Callable[..., AppDir]) -> str:
    """An install with a tool ``nap`` that sleeps ``input.s`` seconds; its id."""
    app = make_app(f"slug: nap-{time.monotonic_ns() % 10**9}\nname: Nap\ntools: ./tools/*\n")
    app.write("tools/nap.tool.yaml", tool_doc("nap", timeoutMs=20_000))
    app.write("tools/nap.py", "import time\ndef run(i):\n    time.sleep(i['s'])\n    return {}\n")
    return str(daemon.ship(app.root)["installId"])


def _run_on_own_connection(
    daemon: Daemon, install: str, seconds: float, source: str = "127.0.0.1"
) -> bytes:
    body = json.dumps({"input": {"s": seconds}}).encode()
    with connect(daemon.port, source) as sock:
        sock.sendall(
            b"POST /api/v2/apps/installs/%s/tools/nap/run HTTP/1.1\r\nHost: x\r\n"
            b"X-API-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s"
            % (install.encode(), daemon.admin_key.encode(), len(body), body)
        )
        return answer(sock, timeout=30)[0]


def test_only_when_every_connection_is_being_answered_is_a_new_one_refused(
    daemon: Daemon, sleepy: str
) -> None:
    answers: list[bytes] = []
    runs = [
        threading.Thread(target=lambda: answers.append(_run_on_own_connection(daemon, sleepy, 3)))
        for _ in range(PER_CLIENT)
    ]
    for thread in runs:  # one after the other: each request is read before the next comes
        thread.start()
        time.sleep(0.1)
    time.sleep(1)  # every run is in its jail: 127.0.0.1 has PER_CLIENT busy connections
    with connect(daemon.port) as sock:
        raw, _ = answer(sock)
    assert status_of(raw) == 503 and reason_of(raw) == "TOO_MANY_CONNECTIONS"
    assert "retry-after: 1" in raw.decode().lower()
    assert healthz(daemon.port, source="127.0.0.2") == 200  # another client is not held up
    for thread in runs:
        thread.join()
    assert [status_of(raw) for raw in answers] == [200] * PER_CLIENT  # none was cut
    assert healthz(daemon.port) == 200


def test_the_total_cap_makes_room_across_clients(daemon: Daemon) -> None:
    slow = []
    for i in range(TOTAL + 4):  # half heads from many addresses, none past its own cap
        sock = connect(daemon.port, source=f"127.0.1.{i + 1}")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        slow.append(sock)
        time.sleep(0.02)
    try:
        assert healthz(daemon.port, source="127.0.0.2") == 200
        time.sleep(0.05)
        alive = [is_open(sock) for sock in slow]
        first = alive.index(True)  # the oldest made room; the newest are held
        assert first >= 4 and all(alive[first:]) and len(alive) - first >= TOTAL - 3, alive
    finally:
        for sock in slow:
            sock.close()


# --- answers that never drain, and streams that never end --------------------------------------


def tcp_state(sock: socket.socket) -> int:
    """The socket's TCP state (1: established; 7: closed, as after a reset)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


def _unread_answers(port: int, source: str, count: int) -> list[socket.socket]:
    """``count`` connections that pipeline requests for the OpenAPI document (a large
    answer) and never read: the daemon's writes to them stall."""
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.send(b"GET /api/v2/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 100)
        socks.append(sock)
        time.sleep(0.05)  # being answered before the next comes: none closes another
    return socks


def test_answers_a_client_never_reads_lock_out_no_one_and_are_cut(
    daemon: Daemon, sleepy: str
) -> None:
    # Attack B, small: every slot of 127.0.0.1 holds an answer that never drains.
    attack = _unread_answers(daemon.port, "127.0.0.1", PER_CLIENT + 2)  # all its slots
    started = time.monotonic()
    try:
        time.sleep(0.3)  # the answers fill the sockets' buffers
        assert healthz(daemon.port) == 200  # a stalled answer made room
        assert healthz(daemon.port, source="127.0.0.2") == 200
        raw = _run_on_own_connection(daemon, sleepy, 0)
        assert status_of(raw) == 200, raw[:300]
        # Stalled past http_body_timeout_s, whatever else goes on: every one is cut.
        time.sleep(max(0.0, started + BODY_S + 1.5 - time.monotonic()))
        assert [tcp_state(sock) for sock in attack].count(1) == 0
    finally:
        for sock in attack:
            sock.close()
    assert healthz(daemon.port) == 200


def _mcp_stream(daemon: Daemon, key: str, source: str) -> tuple[httpx.Client, httpx.Response]:
    """A 2025-11-25-era MCP session opened from ``source``, and its GET stream, held open
    on that one connection."""
    client = httpx.Client(
        base_url=daemon.url,
        transport=httpx.HTTPTransport(local_address=source),
        limits=httpx.Limits(max_connections=1),
        timeout=10,
    )
    url = f"/mcp?workspaceId={daemon.workspace_id}"
    headers = {"Authorization": f"Bearer {key}", "Mcp-Protocol-Version": "2025-11-25"}
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    opened = client.post(
        url,
        json=init,
        headers={**headers, "Accept": "application/json, text/event-stream"},
    )
    assert opened.status_code == 200, opened.text
    headers |= {"Accept": "text/event-stream", "Mcp-Session-Id": opened.headers["mcp-session-id"]}
    # A 1 s read timeout on the stream alone (_stream_ended reads it); a loaded machine
    # may take longer than that to open the session.
    stream = client.send(
        client.build_request("GET", url, headers=headers, timeout=httpx.Timeout(10, read=1)),
        stream=True,
    )
    assert stream.status_code == 200, stream.read()
    return client, stream


def _stream_ended(stream: httpx.Response) -> bool:
    try:
        for _ in stream.iter_raw():
            pass
    except httpx.ReadTimeout:
        return False  # still open: nothing to read within the client's read timeout
    except httpx.TransportError:
        return True
    return True


def test_open_streams_lock_out_no_one(daemon: Daemon, sleepy: str) -> None:
    # Attack A, small: a viewer's key holds MCP GET streams on the total cap's slots,
    # every one of 127.0.0.1's among them (the rest from 127.0.0.3, opened first).
    viewer = daemon.person(f"viewer-{time.monotonic_ns()}@example.com", role="viewer")
    held = [_mcp_stream(daemon, viewer, "127.0.0.3") for _ in range(TOTAL - PER_CLIENT)]
    held += [_mcp_stream(daemon, viewer, "127.0.0.1") for _ in range(PER_CLIENT)]
    try:
        time.sleep(3.5)  # STREAM_GRACE_S: from now on they are streams
        assert healthz(daemon.port, source="127.0.0.2") == 200  # at the total cap
        assert healthz(daemon.port) == 200  # at 127.0.0.1's cap
        for source in ("127.0.0.1", "127.0.0.2"):
            raw = _run_on_own_connection(daemon, sleepy, 0, source)
            assert status_of(raw) == 200, raw[:300]
        ended = [_stream_ended(stream) for _, stream in held]
        # The oldest stream of all made room for 127.0.0.2, 127.0.0.1's oldest for
        # 127.0.0.1; the newest still stream.
        first_own = TOTAL - PER_CLIENT
        assert ended[0] and ended[first_own] and not ended[-1], ended
    finally:
        for client, stream in held:
            stream.close()
            client.close()


# --- a flood of slow connections ----------------------------------------------------------------

_ATTACK = r"""
import json, resource, socket, sys, time
port, slow, stalled, hold_s = (int(a) for a in sys.argv[1:5])
run = ('POST %s HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\nContent-Type: application/json\r\n'
       'Content-Length: 100000\r\n\r\n{' % (sys.argv[5], sys.argv[6])).encode()
resource.setrlimit(resource.RLIMIT_NOFILE, (20000, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
socks, opened, failed = [], 0, 0
started = time.monotonic()
for i in range(slow + stalled):
    try:
        s = socket.create_connection(('127.0.0.1', port), timeout=5)
        s.setblocking(False)
        if i < slow:  # half a request head, the rest a byte at a time
            s.send(b'GET /healthz HTTP/1.1\r\nHost: x\r\n')
        else:  # a whole head, and a body that never comes
            s.send(run)
        socks.append(s)
        opened += 1
    except OSError:
        failed += 1
print(json.dumps({'opened': opened, 'failed': failed, 'openS': time.monotonic() - started}),
      flush=True)
deadline, open_at_end = time.monotonic() + hold_s, 0
while time.monotonic() < deadline:
    for s in socks[:slow]:
        try:
            s.send(b'X')
        except OSError:
            pass
    time.sleep(0.5)
for s in socks:
    try:
        s.recv(1, socket.MSG_PEEK)  # an answer, or b'' once closed
    except BlockingIOError:
        open_at_end += 1  # neither answered nor closed
    except OSError:
        pass
print(json.dumps({'openAtEnd': open_at_end}), flush=True)
sys.stdin.read()
"""

_FRESH_PROBE = r"""
import json, socket, sys, threading, time
port, source = int(sys.argv[1]), sys.argv[2]
worst, count, retried, errors, stop = 0.0, 0, 0, [], threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print('ready', flush=True)

def healthz():
    with socket.create_connection(('127.0.0.1', port), timeout=10,
                                  source_address=(source, 0)) as s:
        s.sendall(b'GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
        got = b''
        while chunk := s.recv(65536):
            got += chunk
    return got

while not stop.is_set():
    started = time.perf_counter()
    try:
        try:
            got = healthz()
        except ConnectionResetError:
            got = b''
        if got == b'' or b'TOO_MANY_CONNECTIONS' in got:
            # Closed for room in a burst from its own address before its head was read
            # (docs/SECURITY.md): one retry at once, and its time counts.
            retried += 1
            got = healthz()
        if not got.startswith(b'HTTP/1.1 200 '):
            errors.append(got[:80].decode(errors='replace'))
    except OSError as exc:
        errors.append(repr(exc))
    worst = max(worst, (time.perf_counter() - started) * 1000)
    count += 1
    time.sleep(0.02)
print(json.dumps({'worstMs': worst, 'probes': count, 'retried': retried,
                  'errors': errors[:5]}), flush=True)
"""


class FreshProbe:
    """GET /healthz every 20 ms, each on a new connection from ``source``, in a process
    of its own; the slowest answer, and what failed."""

    def __init__(self, daemon: Daemon, source: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _FRESH_PROBE, str(daemon.port), source],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        self.found: dict[str, Any] = {}

    def stop(self) -> dict[str, Any]:
        out, _ = self.proc.communicate("", timeout=60)
        self.found = json.loads(out.strip().splitlines()[-1])
        return self.found


@pytest.fixture
def flooded_daemon(toolchain_dir: Path) -> Iterator[Daemon]:
    """A daemon started as systemd starts services by default: soft limit of 1024 open
    files (its hard limit higher), header deadline 3 s, the default connection caps."""
    with running_daemon(
        toolchain_dir,
        wrap=lambda argv: ["prlimit", "--nofile=1024:20000", "--", *argv],
        http_header_timeout_s="3",
        http_body_timeout_s="3",
    ) as d:
        yield d


def test_serve_raises_its_open_file_limit_and_says_so(flooded_daemon: Daemon) -> None:
    # Started with a soft limit of 1024 and a hard one of 20000: up to the hard limit
    # (the target, 65536, is higher).
    limits = Path(f"/proc/{flooded_daemon.proc.pid}/limits").read_text()
    assert re.search(r"Max open files\s+20000\s+20000\s", limits), limits
    log = (flooded_daemon.data_dir / "serve.log").read_text()
    assert "open files: limit raised from 1024 to 20000 (hard limit 20000)" in log


def test_a_slowloris_flood_delays_neither_healthz_nor_a_run(
    flooded_daemon: Daemon, make_app: Callable[..., AppDir]
) -> None:
    daemon = flooded_daemon
    app = make_app("slug: flood\nname: Flood\ntools: ./tools/*\n")
    app.write("tools/echo.tool.yaml", tool_doc("echo"))
    app.write("tools/echo.py", "def run(i):\n    return {'echo': i}\n")
    install = str(daemon.ship(app.root)["installId"])
    assert daemon.run(install, "echo", {"a": 1}).json()["status"] == "succeeded"

    attacker = daemon.person("mallory@example.com")  # a key of its own: its own rate limit
    kept = HealthProbe(daemon)  # one kept-alive connection from 127.0.0.1
    fresh = [FreshProbe(daemon, "127.0.0.1"), FreshProbe(daemon, "127.0.0.2")]
    attack = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _ATTACK,
            str(daemon.port),
            "1100",
            "400",
            "6",
            f"/api/v2/apps/installs/{install}/tools/echo/run",
            attacker,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert attack.stdout is not None
    try:
        opened = json.loads(attack.stdout.readline())
        assert opened["opened"] == 1500, opened
        run_s = []
        for i in range(5):  # runs, each on a connection of its own, while the flood holds
            started = time.monotonic()
            with httpx.Client(base_url=daemon.url, timeout=30) as client:
                response = client.post(
                    f"/api/v2/apps/installs/{install}/tools/echo/run",
                    headers={"X-API-Key": daemon.admin_key},
                    json={"input": {"i": i}},
                )
            run_s.append(time.monotonic() - started)
            assert response.status_code == 200, response.text
            assert response.json()["status"] == "succeeded", response.text
            time.sleep(0.5)
        held = json.loads(attack.stdout.readline())
    finally:
        attack.communicate("", timeout=60)
        with kept:
            pass
        found = [probe.stop() for probe in fresh]
    # Past the header deadline (3 s) with a byte every 0.5 s, no slow head is held.
    assert held["openAtEnd"] == 0, held
    assert kept.worst_ms < FLOOD_KEPT_MS, kept.worst_ms
    for probe in found:
        assert probe["probes"] > 20 and not probe["errors"], probe
        assert probe["worstMs"] < FLOOD_FRESH_MS, probe
    # Another address is never closed for room; the attacker's own, seldom.
    assert found[1]["retried"] == 0 and found[0]["retried"] <= 3, found
    assert max(run_s) < FLOOD_RUN_S, run_s
    fresh_ms = [(round(p["worstMs"], 1), p["retried"]) for p in found]
    print(f"flood: /healthz worst {kept.worst_ms:.1f} ms kept alive, {fresh_ms} ms fresh; {run_s}")
