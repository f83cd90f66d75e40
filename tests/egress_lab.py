"""A network of the tests' own for egress: a network namespace made by the test session,
a veth pair into it, and test servers (HTTP, and HTTPS with a test CA) on its addresses.
No traffic goes anywhere else.

Names resolve through a hosts file of the lab's: a daemon or ``tool test`` started with
``lab.wrap(argv)`` runs in a mount namespace of its own where that file is /etc/hosts, so
a granted name can point at the lab, at loopback, at cloud metadata or at a private
address, as a hostile DNS answer would. ``lab.wrap(argv, dns=True)`` also makes the
lab's gateway address its /etc/resolv.conf's only name server: a test runs a LabDns
there (names the hosts file does not have are asked of it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme

from conftest import AppDir, tool_doc
from daemon import Daemon

SERVER = Path(__file__).with_name("egress_server.py")
HTTP_PORT, HTTPS_PORT = 8080, 8443
# HTTPS whose certificate (of the same test CA) is only for localhost and elsewhere.test:
# neither a lab address nor api.test, so a client connecting there must refuse it.
WRONG_CERT_PORT = 8444


@dataclass
class EgressLab:
    namespace: str
    network: str  # the lab's /24, for egress_allow_networks
    host_ip: str  # this host's end of the veth pair
    server_ip: str  # api.test
    other_ip: str  # other.test: the same servers, another address
    ca_pem: str  # the test CA: tools are given it to trust the HTTPS server
    hosts_file: Path
    log: Path
    resolv_file: Path  # "nameserver host_ip": what wrap(dns=True) binds over resolv.conf

    def wrap(self, argv: list[str], dns: bool = False) -> list[str]:
        """``argv`` in a mount namespace where the lab's hosts file is /etc/hosts (and with
        ``dns``, where the lab's gateway is the name server: see LabDns)."""
        script = 'mount --bind "$0" /etc/hosts && exec "$@"'
        if dns:
            script = f'mount --bind "{self.resolv_file}" /etc/resolv.conf && {script}'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                str(self.hosts_file), *argv]  # fmt: skip

    def received(self) -> list[dict[str, Any]]:
        """What the test servers were sent: each request's path and Authorization."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def established(self, port: int) -> int:
        """Connections open to the lab's servers on ``port`` (seen from the lab's side)."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.namespace, "ss", "-Htn", "state", "established",
             f"( sport = :{port} )"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return len([line for line in out.splitlines() if line.strip()])


def _nat64(ipv4: str) -> str:
    """``ipv4`` in the NAT64 well-known prefix, 64:ff9b::/96."""
    return str(
        ipaddress.IPv6Address(
            int(ipaddress.IPv6Address("64:ff9b::")) | int(ipaddress.IPv4Address(ipv4))
        )
    )


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def egress_lab() -> Iterator[EgressLab]:
    tag = os.getpid() % 200 + 20  # 198.18.<tag>.0/24, one per test session
    namespace, outer, inner = f"rdlab{tag}", f"rdh{tag}", f"rdn{tag}"
    net = f"198.18.{tag}"
    folder = Path(tempfile.mkdtemp(prefix="runnerd-lab-"))
    ca = trustme.CA()
    ca.issue_cert(
        "api.test", "other.test", f"{net}.2"
    ).private_key_and_cert_chain_pem.write_to_path(str(folder / "server.pem"))
    ca.issue_cert("localhost", "elsewhere.test").private_key_and_cert_chain_pem.write_to_path(
        str(folder / "wrong.pem")
    )
    hosts = folder / "hosts"
    hosts.write_text(
        "127.0.0.1 localhost\n"
        f"{net}.2 api.test\n{net}.3 other.test\n{net}.1 gateway.test\n"
        "127.0.0.1 loop.test\n169.254.169.254 metadata.test\n10.1.2.3 private.test\n"
        # IPv6 forms that carry an IPv4 address (a translator would reach that address).
        "64:ff9b::7f00:1 nat64-loop.test\n64:ff9b::a9fe:a9fe nat64-metadata.test\n"
        f"{_nat64(f'{net}.1')} nat64-gateway.test\n::7f00:1 compat-loop.test\n"
        "::ffff:0:a01:203 translated-private.test\n2002:7f00:1::1 sixtofour-loop.test\n"
    )
    hosts.chmod(0o644)
    resolv = folder / "resolv.conf"
    resolv.write_text(f"nameserver {net}.1\n")
    resolv.chmod(0o644)
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    _ip("netns", "add", namespace)
    server = None
    try:
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", namespace)
        _ip("addr", "add", f"{net}.1/24", "dev", outer)
        _ip("link", "set", outer, "up")
        for address in (f"{net}.2/24", f"{net}.3/24"):
            _ip("-n", namespace, "addr", "add", address, "dev", inner)
        _ip("-n", namespace, "link", "set", inner, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        log = folder / "received.jsonl"
        server = subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, str(SERVER), str(log),
             str(HTTP_PORT), str(HTTPS_PORT), str(folder / "server.pem"),
             str(folder / "server.pem"), str(WRONG_CERT_PORT), str(folder / "wrong.pem")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        time.sleep(0.05)
        yield EgressLab(
            namespace=namespace,
            network=f"{net}.0/24",
            host_ip=f"{net}.1",
            server_ip=f"{net}.2",
            other_ip=f"{net}.3",
            ca_pem=ca.cert_pem.bytes().decode(),
            hosts_file=hosts,
            log=log,
            resolv_file=resolv,
        )
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


class LabDns:
    """A DNS server of the test's on the lab's gateway address (UDP port 53): it answers
    an A query for a name in ``answers`` with its address, says nothing at all to a name
    ending in ``silent`` (a name server that never answers), and NXDOMAIN to any other
    name (an AAAA query for a known name gets no address). ``asked`` lists every name
    it was asked, in order."""

    def __init__(
        self, address: str, answers: dict[str, str], silent: str, slow: str = "", slow_s: float = 0
    ) -> None:
        """``slow``: names ending so are answered ``slow_s`` late (a slow name server)."""
        self.answers, self.silent, self.slow, self.slow_s = answers, silent, slow, slow_s
        self.asked: list[str] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, 53))
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._sock.close()

    def _serve(self) -> None:
        while True:
            try:
                query, peer = self._sock.recvfrom(2048)
            except OSError:
                return
            answer = self._answer(query)
            if answer is None:
                continue
            if self.slow and self.asked and self.asked[-1].endswith(self.slow):
                threading.Timer(self.slow_s, self._send, (answer, peer)).start()
            else:
                self._send(answer, peer)

    def _send(self, answer: bytes, peer: Any) -> None:
        with contextlib.suppress(OSError):
            self._sock.sendto(answer, peer)

    def _answer(self, query: bytes) -> bytes | None:
        labels, at = [], 12
        while at < len(query) and query[at]:
            labels.append(query[at + 1 : at + 1 + query[at]].decode("ascii", "replace"))
            at += 1 + query[at]
        if len(query) < at + 5:
            return None
        name = ".".join(labels).lower()
        qtype = struct.unpack("!H", query[at + 1 : at + 3])[0]
        question = query[12 : at + 5]
        self.asked.append(name)
        if name.endswith(self.silent):
            return None
        found = self.answers.get(name)
        flags = 0x8180 if found is not None else 0x8183  # a response; NXDOMAIN if unknown
        records = b""
        if found is not None and qtype == 1:
            records = struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(found)
        head = struct.pack("!HHHHHH", struct.unpack("!H", query[:2])[0], flags, 1,
                           1 if records else 0, 0, 0)  # fmt: skip
        return head + question + records


# --- the tools the egress tests run -------------------------------------------------------

FETCH_PY = """\
import json, os, urllib.request

def run(input):
    if input.get("ca"):
        with open("/tmp/ca.pem", "w") as f:
            f.write(input["ca"])
        os.environ["SSL_CERT_FILE"] = "/tmp/ca.pem"
    headers = {}
    if input.get("bearer"):
        headers["Authorization"] = "Bearer " + os.environ["API_TOKEN"]
    request = urllib.request.Request(input["url"], headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return {"status": answer.status, "body": json.loads(answer.read())}
"""

FETCH_JS = """\
import { writeFileSync } from 'node:fs';

export async function run(input) {
  if (input.ca) {
    writeFileSync('/tmp/ca.pem', input.ca);
    process.env.NODE_EXTRA_CA_CERTS = '/tmp/ca.pem';
  }
  const answer = await fetch(input.url);
  return { status: answer.status, body: await answer.json() };
}
"""

FETCH_TS = """\
import { writeFileSync } from 'node:fs';

interface Input { url: string; ca?: string }

export async function run(input: Input): Promise<{ status: number; body: unknown }> {
  if (input.ca) {
    writeFileSync('/tmp/ca.pem', input.ca);
    process.env.NODE_EXTRA_CA_CERTS = '/tmp/ca.pem';
  }
  const answer: Response = await fetch(input.url);
  return { status: answer.status, body: await answer.json() };
}
"""

PROBE = """\
import base64, os, socket, time, urllib.parse, urllib.request

SOCKET = "/run/egress.sock"


def _connect_line(sock, token, where="api.test:8080"):
    cred = base64.b64encode(f"run:{token}".encode()).decode()
    head = f"CONNECT {where} HTTP/1.1\\r\\nProxy-Authorization: Basic {cred}\\r\\n\\r\\n"
    sock.sendall(head.encode())
    return sock.recv(300).decode(errors="replace").split("\\r\\n")[0]


def direct(i):
    socket.create_connection((i["ip"], 8080), timeout=10)
    return {"connected": True}


def dns(i):
    return {"resolved": str(socket.getaddrinfo("api.test", 80))}


def udp(i):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(10)
    s.sendto(b"x", (i["ip"], 53))
    return {"answered": str(s.recvfrom(10))}


def forged(i):
    s = socket.socket(socket.AF_UNIX)
    s.connect(SOCKET)
    return {"answer": _connect_line(s, i.get("token", "forged-credential"))}


def proxy_env(i):
    return {"proxy": os.environ.get("HTTP_PROXY", "")}


def flood(i):
    socks, failed = [], 0
    for _ in range(i["count"]):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(SOCKET)
            socks.append(s)
        except OSError:
            failed += 1
    time.sleep(0.3)
    closed = 0
    for s in socks:
        s.setblocking(False)
        try:
            closed += s.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    for s in socks:
        s.close()
    time.sleep(0.2)
    answer = urllib.request.urlopen(i["url"], timeout=10).status
    return {"opened": len(socks), "closed": closed, "failed": failed, "then": answer}


def hold(i):
    proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
    s = socket.create_connection((proxy.hostname, proxy.port))
    line = _connect_line(s, proxy.password)
    print("tunnel:", line, flush=True)
    time.sleep(60)


def big(i):
    try:
        urllib.request.urlopen(i["url"], timeout=10).read()
        first = "whole"
    except Exception as exc:
        first = f"{type(exc).__name__}: {exc}"
    try:
        urllib.request.urlopen(i["again"], timeout=10).read()
        then = "whole"
    except Exception as exc:
        then = f"{type(exc).__name__}: {exc}"
    return {"first": first, "then": then}


def report_token(i):
    token = urllib.parse.urlsplit(os.environ["HTTP_PROXY"]).password
    urllib.request.urlopen(f"http://other.test:8080/token/{token}", timeout=10).read()
    time.sleep(i.get("sleep", 0))
    return {}


def run(input):
    started = time.monotonic()
    try:
        found = globals()[input["mode"]](input)
    except Exception as exc:
        found = {"error": f"{type(exc).__name__}: {exc}"}
    found["ms"] = round((time.monotonic() - started) * 1000)
    return found
"""


def app_dir(root: Path, slug: str, egress: list[str], tools: dict[str, tuple[str, str]]) -> Path:
    """An app folder asking for ``egress``, with ``tools`` (name -> (extension, source));
    the tool named ``hold`` has a short timeout."""
    app = AppDir(root)
    lines = "".join(f"  - '{e}'\n" for e in egress)
    app.write(
        "agentserve.app.yaml",
        f"slug: {slug}\nname: {slug.title()}\nversion: '1'\ntools: ./tools/*\n"
        + (f"egress:\n{lines}" if egress else ""),
    )
    for name, (ext, source) in tools.items():
        timeout = 1500 if name == "hold" else 15000
        app.tool(name, ext, yaml=tool_doc(name, timeoutMs=timeout), source=source)
    return root


def caller_grant(daemon: Daemon) -> list[str]:
    """The lab's servers, and names that resolve where egress never goes."""
    return [
        f"api.test:{HTTP_PORT}",
        f"api.test:{HTTPS_PORT}",
        f"loop.test:{HTTP_PORT}",
        "metadata.test",
        "private.test",
        f"gateway.test:{HTTP_PORT}",
        f"loop.test:{daemon.port}",  # a literal 127.0.0.1 grant is refused at upload
    ]


CALLER_TOOLS = {
    "fetch_py": (".py", FETCH_PY),
    "fetch_js": (".mjs", FETCH_JS),
    "fetch_ts": (".ts", FETCH_TS),
    "probe": (".py", PROBE),
    "hold": (".py", PROBE),
}


def run_ok(daemon: Daemon, install_id: str, tool: str, value: dict[str, Any]) -> dict[str, Any]:
    """A run through HTTP that started (200, whatever its status)."""
    response = daemon.run(install_id, tool, value)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def history(daemon: Daemon, install_id: str, run_id: str) -> dict[str, Any]:
    """A run's entry in its install's run history."""
    runs = daemon.call("GET", f"/api/v2/apps/installs/{install_id}/runs", daemon.admin_key)
    return next(r for r in runs.json()["data"] if r["runId"] == run_id)
