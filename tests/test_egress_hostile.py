"""Egress against a hostile tool (issue 22, classes 1, 2 and 5): IPv6 forms that carry a
refused IPv4 address; requests and TLS ClientHellos that name another site than the one
the connection was granted for, sent as raw bytes on /run/egress.sock; and HTTPS to a
destination granted by IP address, verified against that address only.

Everything runs through a live daemon, real nsjail and the lab's network namespace
(tests/egress_lab.py); no traffic goes anywhere else.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import run_cli
from daemon import Daemon
from egress_lab import (
    FETCH_JS,
    FETCH_PY,
    HTTP_PORT,
    HTTPS_PORT,
    WRONG_CERT_PORT,
    EgressLab,
    app_dir,
    history,
    run_ok,
)
from runnerd.egress import Destination, parse, parse_networks
from runnerd.run.addresses import address_refusal
from runnerd.run.authority import AuthorityRefused, check_request, forward_body

# --- class 1: addresses that carry an IPv4 address -------------------------------------------


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("64:ff9b::7f00:1", "a NAT64 address of 127.0.0.1, a loopback"),
        ("64:ff9b::a9fe:a9fe", "a NAT64 address of 169.254.169.254, a link-local"),
        ("64:ff9b::a00:1", "a NAT64 address of 10.0.0.1, a private"),
        ("64:ff9b:1:7f00:1::", "a NAT64 address of 127.0.1.0"),  # RFC 8215, a /48 layout
        ("64:ff9b:1:808:808:8:a9fe:a9fe", "169.254.169.254"),  # its /96 layout
        ("::7f00:1", "an IPv4-compatible address (of 127.0.0.1)"),
        ("::808:808", "an IPv4-compatible address (of 8.8.8.8)"),  # deprecated: never
        ("::ffff:0:a9fe:a9fe", "an IPv4-translated address (of 169.254.169.254)"),
        ("::ffff:7f00:1", "an IPv4-mapped address"),
        ("2002:7f00:1::1", "a 6to4 address of 127.0.0.1, a loopback"),
        ("2002:a9fe:a9fe::", "a 6to4 address of 169.254.169.254"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "a Teredo address of 192.0.2.45"),
    ],
)
def test_an_ipv6_form_of_a_refused_ipv4_address_is_refused(address: str, why: str) -> None:
    allowed = parse_networks(["64:ff9b:1::/48", "2002::/16", "2001::/32", "10.20.0.0/16"])
    for networks in ((), allowed):  # opening the IPv6 range does not open what it carries
        found = address_refusal(ipaddress.ip_address(address), networks)
        assert found is not None and why in found, (address, networks, found)


def test_a_nat64_form_of_a_public_or_allowed_ipv4_address_passes() -> None:
    allowed = parse_networks(["10.20.0.0/16"])
    assert address_refusal(ipaddress.ip_address("64:ff9b::808:808"), ()) is None
    assert address_refusal(ipaddress.ip_address("64:ff9b::a14:304"), allowed) is None
    refused = address_refusal(ipaddress.ip_address("64:ff9b::a15:304"), allowed)
    assert refused is not None and "10.21.3.4" in refused
    # RFC 8215's local-use prefix: each layout of it carries 8.8.8.8; it passes only when
    # egress_allow_networks opens it.
    local = ipaddress.ip_address("64:ff9b:1:808:808:808:808:808")
    refused = address_refusal(local, ())
    assert refused is not None and "local-use NAT64" in refused
    assert address_refusal(local, parse_networks(["64:ff9b:1::/48"])) is None


@pytest.mark.parametrize("entry", ["::ffff:0:0:0/96", "::/96", "::ffff:0:0/96"])
def test_egress_allow_networks_cannot_open_the_ipv4_forms(entry: str) -> None:
    with pytest.raises(ValueError, match="overlaps"):
        parse_networks([entry])


def test_upload_refuses_a_literal_grant_egress_never_reaches(tmp_path: Path) -> None:
    entries = ["[64:ff9b::a9fe:a9fe]", "127.0.0.1:8080", "[::ffff:0:7f00:1]", "[2002:7f00:1::]",
               "10.1.2.3", "198.18.0.2:8080", "[64:ff9b::808:808]", "api.example.com"]  # fmt: skip
    root = app_dir(tmp_path / "app", "literal", entries, {"fetch_py": (".py", FETCH_PY)})
    proc = run_cli("app", "validate", str(root), "--json")
    assert proc.returncode == 1, proc.stdout
    problems = json.loads(proc.stdout)["problems"]
    # slug, name, version, tools, egress:, then one entry a line (the first is line 6)
    assert [(p["file"], p["line"]) for p in problems] == [
        ("agentserve.app.yaml", 6),
        ("agentserve.app.yaml", 7),
        ("agentserve.app.yaml", 8),
        ("agentserve.app.yaml", 9),
    ], problems
    assert "egress[0]: egress never reaches [64:ff9b::a9fe:a9fe]" in problems[0]["message"]
    assert "169.254.169.254" in problems[0]["message"]
    assert "loopback" in problems[1]["message"]
    # A private literal may be opened by the daemon's egress_allow_networks: it passes
    # here, and the proxy judges it at each connection.


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("169.254.169.254.", "egress never reaches 169.254.169.254"),  # a trailing dot
        ("[::ffff:a9fe:a9fe].", "only ':port'"),
        ("0177.0.0.1", "ends in a number"),  # octal: 127.0.0.1 to a URL parser
        ("127.1", "ends in a number"),
        ("2130706433", "ends in a number"),
        ("0x7f.0.0.1", "ends in a number"),
        ("metadata.0x", "ends in a number"),
    ],
)
def test_upload_refuses_ip_literals_in_disguise(tmp_path: Path, entry: str, why: str) -> None:
    """An entry one program reads as an IP address and another as a name (or as another
    address) is no grant anyone can review: refused at upload, on its line."""
    root = app_dir(tmp_path / "app", "disguised", [entry], {"fetch_py": (".py", FETCH_PY)})
    proc = run_cli("app", "validate", str(root), "--json")
    assert proc.returncode == 1, proc.stdout
    (problem,) = json.loads(proc.stdout)["problems"]
    assert (problem["file"], problem["line"]) == ("agentserve.app.yaml", 6)
    assert why in problem["message"], problem


NAMES = {
    "nat64-loop.test": "a NAT64 address of 127.0.0.1, a loopback",
    "nat64-metadata.test": "a NAT64 address of 169.254.169.254",
    "nat64-gateway.test": "an address of this host",  # in egress_allow_networks, but ours
    "compat-loop.test": "an IPv4-compatible address (of 127.0.0.1)",
    "translated-private.test": "an IPv4-translated address (of 10.1.2.3)",
    "sixtofour-loop.test": "a 6to4 address of 127.0.0.1",
}


@pytest.fixture(scope="module")
def hostile(egress_daemon: Daemon, lab: EgressLab, tmp_path_factory: pytest.TempPathFactory) -> str:
    grant = [f"api.test:{HTTP_PORT}", f"api.test:{HTTPS_PORT}", f"{lab.server_ip}:{HTTPS_PORT}",
             f"{lab.server_ip}:{WRONG_CERT_PORT}", f"api.test:{WRONG_CERT_PORT}",
             f"{lab.server_ip}:{HTTP_PORT}", *NAMES]  # fmt: skip
    tools = {"fetch_py": (".py", FETCH_PY), "fetch_js": (".mjs", FETCH_JS), "raw": (".py", RAW)}
    root = app_dir(tmp_path_factory.mktemp("hostile"), "hostile", grant, tools)
    return str(egress_daemon.ship(root)["installId"])


@pytest.mark.jail
@pytest.mark.parametrize("tool", ["fetch_py", "fetch_js"])
def test_a_name_that_resolves_to_an_ipv6_form_of_a_refused_ipv4_is_refused(
    egress_daemon: Daemon, hostile: str, tool: str
) -> None:
    for name, why in NAMES.items():
        result = run_ok(egress_daemon, hostile, tool, {"url": f"http://{name}/"})
        assert result["status"] == "failed", (name, result)
        assert "(private address)" in result["error"] and why in result["error"], (name, result)


# --- class 2: the authority a request names ---------------------------------------------------

RAW = """\
import base64, os, socket, ssl, time, urllib.parse

SOCKET = "/run/egress.sock"


def _auth():
    token = urllib.parse.urlsplit(os.environ["HTTP_PROXY"]).password
    return "Proxy-Authorization: Basic " + base64.b64encode(f"run:{token}".encode()).decode()


def _read(sock, seconds=5.0):
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (socket.timeout, OSError):
        pass
    return data.decode("latin-1")


def _tunnel(where):
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(SOCKET)
    sock.sendall(f"CONNECT {where} HTTP/1.1\\r\\n{_auth()}\\r\\n\\r\\n".encode())
    answer = b""
    while b"\\r\\n\\r\\n" not in answer:
        answer += sock.recv(1)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return sock


def plain(i):
    # Raw bytes to the proxy ("{auth}" is the run's credential line), or into a tunnel.
    if i.get("tunnel"):
        sock = _tunnel(i["tunnel"])
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(SOCKET)
    for part in i["send"]:
        sock.sendall(part.replace("{auth}", _auth()).encode("latin-1"))
        time.sleep(0.05)
    return {"answer": _read(sock, i.get("wait", 3.0))}


def _records(data, size):
    # One TLS record's handshake bytes, cut into records of ``size`` bytes.
    assert data[0] == 22
    length = int.from_bytes(data[3:5], "big")
    body, rest = data[5 : 5 + length], data[5 + length :]
    out = b""
    for at in range(0, len(body), size):
        piece = body[at : at + size]
        out += data[:3] + len(piece).to_bytes(2, "big") + piece
    return out + rest


def tls(i):
    # CONNECT, then a TLS handshake whose ClientHello names i["sni"] (None: no SNI),
    # optionally cut into small records sent a few bytes at a time.
    sock = _tunnel(i["where"])
    context = ssl.create_default_context(cadata=i["ca"])
    context.check_hostname = False  # the SNI under test may not be the certificate's
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = context.wrap_bio(incoming, outgoing, server_hostname=i.get("sni"))
    first = True
    try:
        while True:
            try:
                conn.do_handshake()
                sock.sendall(outgoing.read())
                break
            except ssl.SSLWantReadError:
                data = outgoing.read()
                if first and i.get("split"):
                    data = _records(data, i["split"])
                    for at in range(0, len(data), 7):
                        sock.sendall(data[at : at + 7])
                        time.sleep(0.002)
                else:
                    sock.sendall(data)
                first = False
                got = sock.recv(65536)
                if not got:
                    return {"tls": "closed"}
                incoming.write(got)
    except ssl.SSLError as exc:
        return {"tls": f"SSLError: {exc}"}
    head = f"GET {i['path']} HTTP/1.1\\r\\nHost: {i['host']}\\r\\nConnection: close\\r\\n\\r\\n"
    conn.write(head.encode())
    sock.sendall(outgoing.read())
    answer = b""
    while True:
        got = sock.recv(65536)
        if not got:
            break
        incoming.write(got)
        try:
            while chunk := conn.read(65536):
                answer += chunk
        except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
            pass
    return {"tls": "ok", "answer": answer.decode("latin-1")}


def run(input):
    try:
        return globals()[input["mode"]](input)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
"""


def _plain(daemon: Daemon, install: str, send: list[str], tunnel: str | None = None) -> str:
    value: dict[str, Any] = {"mode": "plain", "send": send}
    if tunnel:
        value["tunnel"] = tunnel
    result = run_ok(daemon, install, "raw", value)
    assert result["status"] == "succeeded", result
    assert "error" not in result["output"], result["output"]
    answer: str = result["output"]["answer"]
    return answer


def _paths(lab: EgressLab) -> list[str]:
    return [r["path"] for r in lab.received()]


API = f"api.test:{HTTP_PORT}"
OTHER = f"other.test:{HTTP_PORT}"


@pytest.mark.jail
@pytest.mark.parametrize(
    ("host", "status"),
    [
        (f"Host: {OTHER}", "403"),  # another virtual host behind the granted address
        ("Host: other.test", "403"),
        (f"Host: api.test:{HTTP_PORT + 1}", "403"),  # another port
        (f"Host: {API}\r\nHost: {OTHER}", "400"),  # twice
        (f"Host: {API}\r\nhost: {API}", "400"),
        (f"Host: user@{API}", "400"),  # userinfo
        (f"Host: {API}/x", "400"),
        ("Host: [::1]:8080", "403"),
        (f"Host : {OTHER}", "400"),  # a space before the colon
        (f"X-A: b\r\n Host: {OTHER}", "400"),  # a folded line
        (f"Host: {API}\nHost: {OTHER}", "400"),  # a bare LF, which some servers split on
        (f"Host: {API}\rHost: {OTHER}", "400"),
    ],
)
def test_a_proxied_request_whose_host_is_not_the_granted_one_is_refused(
    egress_daemon: Daemon, hostile: str, lab: EgressLab, host: str, status: str
) -> None:
    path = f"/h1-host-{abs(hash(host)) % 10**8}"
    head = f"GET http://{API}{path} HTTP/1.1\r\n{host}\r\n{{auth}}\r\n\r\n"
    answer = _plain(egress_daemon, hostile, [head])
    assert answer.startswith(f"HTTP/1.1 {status} "), answer
    if status == "403":
        assert "(authority mismatch)" in answer and "the Host header names" in answer, answer
    assert path not in _paths(lab)


@pytest.mark.jail
@pytest.mark.parametrize(
    "host", [f"Host: {API}", f"host: API.Test.:{HTTP_PORT}", "Host: api.test", None]
)
def test_a_proxied_request_naming_the_granted_host_in_any_spelling_goes(
    egress_daemon: Daemon, hostile: str, lab: EgressLab, host: str | None
) -> None:
    path = f"/h1-spelling-{abs(hash(host)) % 10**8}"
    version = "HTTP/1.1" if host else "HTTP/1.0"  # HTTP/1.0 may omit Host: the URL's is sent
    lines = "".join(f"{line}\r\n" for line in (host, "{auth}") if line)
    answer = _plain(egress_daemon, hostile, [f"GET http://{API}{path} {version}\r\n{lines}\r\n"])
    assert answer.startswith("HTTP/1.") and " 200 " in answer.split("\r\n")[0], answer
    assert path in _paths(lab)


@pytest.mark.jail
def test_only_the_first_request_of_a_proxied_connection_goes(
    egress_daemon: Daemon, hostile: str, lab: EgressLab
) -> None:
    first = f"POST http://{API}/h1-pipe-1 HTTP/1.1\r\nHost: {API}\r\n{{auth}}\r\n"
    body = "Content-Length: 5\r\n\r\nhello"
    second = f"GET /h1-pipe-2 HTTP/1.1\r\nHost: {OTHER}\r\n\r\n"
    third = f"GET http://{OTHER}/h1-pipe-3 HTTP/1.1\r\nHost: {OTHER}\r\n\r\n"
    _plain(egress_daemon, hostile, [first + body + second + third])
    paths = _paths(lab)
    assert "/h1-pipe-2" not in paths and "/h1-pipe-3" not in paths


@pytest.mark.jail
def test_every_request_in_a_tunnel_must_name_the_granted_host(
    egress_daemon: Daemon, hostile: str, lab: EgressLab
) -> None:
    """The JS harness tunnels http:// too: a tunnel's plain requests are each checked."""
    good = f"GET /h1-tunnel-1 HTTP/1.1\r\nHost: {API}\r\n\r\n"
    chunked = (f"POST /h1-tunnel-2 HTTP/1.1\r\nHost: {API}\r\nTransfer-Encoding: chunked\r\n\r\n"
               f"5\r\nhello\r\n0\r\n\r\n")  # fmt: skip
    bad = f"GET /h1-tunnel-3 HTTP/1.1\r\nHost: {OTHER}\r\n\r\n"
    answer = _plain(egress_daemon, hostile, [good, chunked, bad], tunnel=API)
    assert answer.count("HTTP/1.1 200 ") == 2, answer
    assert "(authority mismatch)" in answer, answer
    paths = _paths(lab)
    assert "/h1-tunnel-1" in paths and "/h1-tunnel-2" in paths
    assert "/h1-tunnel-3" not in paths

    absolute = f"GET http://{OTHER}/h1-tunnel-4 HTTP/1.1\r\nHost: {API}\r\n\r\n"
    answer = _plain(egress_daemon, hostile, [absolute], tunnel=API)
    assert answer.startswith("HTTP/1.1 403 ") and "the request's URL names" in answer, answer
    smuggled = (f"GET /h1-tunnel-5 HTTP/1.1\r\nHost: {API}\r\nContent-Length: 5\r\n"
                "Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    answer = _plain(egress_daemon, hostile, [smuggled], tunnel=API)
    assert answer.startswith("HTTP/1.1 400 "), answer
    answer = _plain(egress_daemon, hostile, ["EHLO other.test\r\n"], tunnel=API)
    assert answer.startswith("HTTP/1.1 400 "), answer
    assert not {"/h1-tunnel-4", "/h1-tunnel-5"} & set(_paths(lab))
    # An SSLv2-format ClientHello carries no SNI: refused with a TLS alert (decode_error).
    sslv2 = "\x80\x2e\x01\x03\x01\x00\x15\x00\x00\x00\x10"
    answer = _plain(egress_daemon, hostile, [sslv2], tunnel=f"api.test:{HTTPS_PORT}")
    assert answer == "\x15\x03\x03\x00\x02\x02\x32", repr(answer)


def _tls(daemon: Daemon, install: str, lab: EgressLab, **value: Any) -> dict[str, Any]:
    value = {"mode": "tls", "ca": lab.ca_pem, "host": f"api.test:{HTTPS_PORT}", **value}
    result = run_ok(daemon, install, "raw", value)
    assert result["status"] == "succeeded", result
    found: dict[str, Any] = result["output"]
    return found


@pytest.mark.jail
@pytest.mark.parametrize("split", [0, 40])
def test_a_tls_client_hello_must_name_the_granted_host(
    egress_daemon: Daemon, hostile: str, lab: EgressLab, split: int
) -> None:
    """The server's certificate is good for api.test, other.test and the lab's address:
    only the proxy's reading of the SNI stops another name (a ClientHello cut into
    records of ``split`` bytes, sent 7 bytes at a time, is read whole)."""
    where = f"api.test:{HTTPS_PORT}"
    ok = _tls(egress_daemon, hostile, lab, where=where, sni="api.test", split=split,
              path=f"/h1-sni-ok-{split}")  # fmt: skip
    assert ok["tls"] == "ok" and " 200 " in ok["answer"], ok
    other = _tls(egress_daemon, hostile, lab, where=where, sni="other.test", split=split,
                 path=f"/h1-sni-other-{split}")  # fmt: skip
    assert "UNRECOGNIZED_NAME" in other["tls"].upper(), other
    none = _tls(egress_daemon, hostile, lab, where=where, sni=None, split=split,
                path=f"/h1-sni-none-{split}")  # fmt: skip
    assert "UNRECOGNIZED_NAME" in none["tls"].upper(), none
    by_ip = f"{lab.server_ip}:{HTTPS_PORT}"
    named = _tls(egress_daemon, hostile, lab, where=by_ip, sni="api.test", split=split,
                 path=f"/h1-sni-ip-{split}")  # fmt: skip
    assert "UNRECOGNIZED_NAME" in named["tls"].upper(), named
    bare = _tls(egress_daemon, hostile, lab, where=by_ip, sni=None, split=split,
                path=f"/h1-sni-ip-bare-{split}")  # fmt: skip
    assert bare["tls"] == "ok", bare
    paths = _paths(lab)
    assert f"/h1-sni-ok-{split}" in paths and f"/h1-sni-ip-bare-{split}" in paths
    assert not {f"/h1-sni-other-{split}", f"/h1-sni-none-{split}", f"/h1-sni-ip-{split}"} & set(
        paths
    )


# --- class 5: HTTPS to a destination granted by IP address ------------------------------------


@pytest.mark.jail
@pytest.mark.parametrize("tool", ["fetch_js", "fetch_py"])
def test_https_to_an_ip_grant_is_verified_against_that_address(
    egress_daemon: Daemon, hostile: str, lab: EgressLab, tool: str
) -> None:
    good = f"https://{lab.server_ip}:{HTTPS_PORT}/h1-ip-{tool}"
    result = run_ok(egress_daemon, hostile, tool, {"url": good, "ca": lab.ca_pem})
    assert result["status"] == "succeeded", result["error"]
    assert result["output"]["body"]["tls"] is True
    # Certificates of the same CA, for localhost and elsewhere.test only: refused.
    for url in (f"https://{lab.server_ip}:{WRONG_CERT_PORT}/h1-wrong-ip-{tool}",
                f"https://api.test:{WRONG_CERT_PORT}/h1-wrong-name-{tool}"):  # fmt: skip
        result = run_ok(egress_daemon, hostile, tool, {"url": url, "ca": lab.ca_pem})
        assert result["status"] == "failed", (url, result)
        error = result["error"].lower()
        assert "certificate" in error or "altnames" in error or "hostname" in error, result
    paths = _paths(lab)
    assert f"/h1-ip-{tool}" in paths
    assert f"/h1-wrong-ip-{tool}" not in paths and f"/h1-wrong-name-{tool}" not in paths
    assert history(egress_daemon, hostile, result["runId"]).get("egress")


# --- the parts, directly -------------------------------------------------------------------


def test_a_chunked_body_is_passed_whole_and_nothing_past_it() -> None:
    async def scenario() -> tuple[bytes, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(b"5;x=1\r\nhello\r\n0\r\nTrailer: t\r\n\r\nGET /next HTTP/1.1\r\n")
        reader.feed_eof()
        sent = bytearray()

        async def send(data: bytes) -> None:
            sent.extend(data)

        await forward_body(reader, -1, send)
        return bytes(sent), await reader.read()

    sent, rest = asyncio.run(scenario())
    assert sent == b"5;x=1\r\nhello\r\n0\r\nTrailer: t\r\n\r\n"
    assert rest == b"GET /next HTTP/1.1\r\n"


def test_a_proxied_head_goes_on_in_origin_form_without_the_proxys_headers() -> None:
    wanted = Destination("api.test", 8080)
    head = (b"GET http://api.test:8080?q=1 HTTP/1.1\r\nHost: api.test:8080\r\n"
            b"Proxy-Authorization: Basic eA==\r\nUpgrade: h2c\r\n"
            b"Connection: Upgrade\r\n\r\n")  # fmt: skip
    request = check_request(head, wanted, proxied=True)
    assert request.head == (
        b"GET /?q=1 HTTP/1.1\r\nHost: api.test:8080\r\nConnection: close\r\n\r\n"
    )
    with pytest.raises(AuthorityRefused, match="Content-Length"):
        check_request(
            b"GET / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            wanted,
            proxied=False,
        )
    assert parse("api.test.").host == "api.test"
