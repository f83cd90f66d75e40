"""Name lookups of the egress proxy (runnerd/run/resolver.py), end to end: a live daemon
whose name server is a LabDns of the test's on the lab's gateway address, and tools that
look names up through the proxy. No traffic goes to any other address.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon import Daemon, running_daemon
from egress_lab import FETCH_PY, HTTP_PORT, EgressLab, LabDns, app_dir, run_ok

pytestmark = pytest.mark.jail

FLOOD = 48  # never-answering names one run asks at once: more than an install may have going
# A run that reaches the lab takes well under a second; a lookup stuck behind another
# install's would wait out its 5 s deadline and fail.
OTHER_INSTALL_BOUND_S = 3.0

FLOOD_PY = """\
import base64, os, socket, time, urllib.parse


def run(input):
    proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
    cred = base64.b64encode(f"run:{proxy.password}".encode()).decode()
    started = time.monotonic()
    socks = []
    for i in range(input["count"]):
        s = socket.create_connection((proxy.hostname, proxy.port), timeout=20)
        where = f"n{i}.silent.test:8080"
        s.sendall(f"CONNECT {where} HTTP/1.1\\r\\nProxy-Authorization: Basic {cred}\\r\\n\\r\\n"
                  .encode())
        socks.append(s)
    answers = []
    for s in socks:
        try:
            line = s.recv(400).decode(errors="replace").split("\\r\\n")[0]
        except OSError as exc:
            line = type(exc).__name__
        answers.append([line, round((time.monotonic() - started) * 1000)])
        s.close()
    return {"answers": answers}
"""


@pytest.fixture(scope="module")
def dns(lab: EgressLab) -> Iterator[LabDns]:
    answers = {"ok.dns.test": lab.server_ip, "late.slow.test": lab.server_ip}
    server = LabDns(lab.host_ip, answers, ".silent.test", slow=".slow.test", slow_s=0.6)
    yield server
    server.close()


@pytest.fixture(scope="module")
def daemon(lab: EgressLab, dns: LabDns, toolchain_dir: Path) -> Iterator[Daemon]:
    """A daemon whose name server is ``dns`` (and whose hosts file is the lab's)."""
    with running_daemon(
        toolchain_dir,
        wrap=functools.partial(lab.wrap, dns=True),
        egress_allow_networks=lab.network,
    ) as d:
        yield d


def test_a_name_from_the_name_server_reaches_the_lab(
    daemon: Daemon, dns: LabDns, tmp_path: Path
) -> None:
    tools = {"fetch_py": (".py", FETCH_PY)}
    install = daemon.ship(app_dir(tmp_path, "plain", [f"ok.dns.test:{HTTP_PORT}"], tools))
    url = f"http://ok.dns.test:{HTTP_PORT}/from-dns"
    result = run_ok(daemon, install["installId"], "fetch_py", {"url": url})
    assert result["status"] == "succeeded", result["error"]
    assert result["output"]["body"]["path"] == "/from-dns"
    assert "ok.dns.test" in dns.asked

    missing = run_ok(daemon, install["installId"], "fetch_py", {"url": url.replace("ok", "ok2")})
    assert missing["status"] == "failed"  # not granted, before any lookup
    assert "(not granted)" in missing["error"]


def test_one_installs_silent_names_do_not_delay_anothers_lookups(
    daemon: Daemon, dns: LabDns, tmp_path: Path
) -> None:
    """Install A floods lookups of names its name server never answers; install B's
    lookup of an answering name, meanwhile, is as fast as ever. A's lookups fail with
    an ordinary 502 within the 5 s deadline (its excess at once: "lookups busy"), and
    free their slots: A's next lookup resolves."""
    flooder = daemon.ship(
        app_dir(
            tmp_path / "a",
            "flooder",
            ["*.silent.test:8080", f"ok.dns.test:{HTTP_PORT}"],
            {"flood": (".py", FLOOD_PY), "fetch_py": (".py", FETCH_PY)},
        )
    )["installId"]
    plain = app_dir(tmp_path / "b", "other", [f"ok.dns.test:{HTTP_PORT}"],
                    {"fetch_py": (".py", FETCH_PY)})  # fmt: skip
    other = daemon.ship(plain)["installId"]
    flooded: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: flooded.update(run_ok(daemon, flooder, "flood", {"count": FLOOD}))
    )
    asked_before = len(dns.asked)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            silent = [n for n in dns.asked[asked_before:] if n.endswith(".silent.test")]
            if len(silent) >= 8:
                break
            time.sleep(0.02)
        assert len(silent) >= 8, "the flooding run never asked its names"

        started = time.monotonic()
        url = f"http://ok.dns.test:{HTTP_PORT}/while-another-floods"
        fetched = run_ok(daemon, other, "fetch_py", {"url": url})
        took = time.monotonic() - started
        flooding = thread.is_alive()
    finally:
        thread.join()
    assert fetched["status"] == "succeeded", fetched["error"]
    assert fetched["output"]["body"]["path"] == "/while-another-floods"
    assert took < OTHER_INSTALL_BOUND_S, f"another install's lookup took {took:.1f} s"
    assert flooding, "the flood was over before the other lookup: it proved nothing"

    assert flooded["status"] == "succeeded", flooded["error"]
    answers = flooded["output"]["answers"]
    assert len(answers) == FLOOD
    for line, ms in answers:
        assert line.startswith("HTTP/1.1 502"), line
        assert "(no such host)" in line or "(lookups busy)" in line, line
        assert ms < 8000, (line, ms)  # the 5 s deadline, and the run's own pace
    assert any("(lookups busy)" in line for line, _ in answers)
    assert any("did not resolve within 5 s" in line for line, _ in answers)

    again = run_ok(daemon, flooder, "fetch_py", {"url": f"http://ok.dns.test:{HTTP_PORT}/after"})
    assert again["status"] == "succeeded", again["error"]


def test_a_grant_narrowed_while_a_connection_looks_its_name_up_is_refused_before_it_goes(
    daemon: Daemon, dns: LabDns, lab: EgressLab, tmp_path: Path
) -> None:
    """The grant is checked again once a connection is made, before anything goes to the
    destination: narrowed while the name server takes 0.6 s to answer (under c-ares' 1 s
    retry, so one query gets its answer), the request never reaches the lab server, and
    the tool is told it is no longer granted."""
    granted = [f"late.slow.test:{HTTP_PORT}", f"ok.dns.test:{HTTP_PORT}"]
    install = daemon.ship(app_dir(tmp_path, "narrowed", granted, {"fetch_py": (".py", FETCH_PY)}))[
        "installId"
    ]
    result: dict[str, Any] = {}
    url = f"http://late.slow.test:{HTTP_PORT}/sent-after-the-narrowing"
    thread = threading.Thread(
        target=lambda: result.update(run_ok(daemon, install, "fetch_py", {"url": url}))
    )
    asked_before = len(dns.asked)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while "late.slow.test" not in dns.asked[asked_before:] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "late.slow.test" in dns.asked[asked_before:], "the run never looked its name up"
        narrowed = daemon.call("PUT", f"/api/v2/apps/installs/{install}/egress",
                               daemon.admin_key, json={"egress": granted[1:]})  # fmt: skip
        assert narrowed.status_code == 200, narrowed.text
    finally:
        thread.join()
    assert result["status"] == "failed"
    assert "no longer in this install's egress grant" in result["error"], result["error"]
    assert not [r for r in lab.received() if r["path"] == "/sent-after-the-narrowing"]
