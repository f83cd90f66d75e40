"""Results reachable from any node (issue 25): two real `runnerd serve` nodes on one
throwaway PostgreSQL. An output lives in the memory of the node that ran the run, never in
the database; any other node asks that node for it (runnerd/govern/peers.py), so an
idempotent replay and `GET /api/v2/runs/{id}` on either node answer the output. Where no
node holds it, the answer says why (`outputAvailable: false`, `outputMissing`, beside the
run answer's five fields): the node
that ran it stopped since, or did not answer (here: stopped with SIGSTOP). The node-to-node
route answers only a node's signed request for that run, made within the window."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from daemon import Daemon, running_daemon, running_nodes, serving_again
from pg_cluster import PgCluster
from runnerd.govern.peers import PEER_ANSWER_HEADER, PEER_HEADER, Peers
from runnerd.govern.results import ResultCache
from runnerd.limits import PEER_TIMEOUT_S, PEER_TOKEN_WINDOW_S
from runnerd.vault import Vault
from test_governance import gov_app

pytestmark = pytest.mark.jail

SETTINGS = {"node_lease_s": "3", "warm_jails": "1"}


@pytest.fixture(scope="module")
def nodes(
    pg: PgCluster, toolchain_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Daemon, Daemon, str]]:
    with running_nodes(toolchain_dir, pg.new_database(), **SETTINGS) as (a, b):
        yield a, b, a.ship(gov_app(tmp_path_factory.mktemp("gov")))["installId"]


def _run(node: Daemon, iid: str, text: str, idempotency_key: str) -> httpx.Response:
    return node.call(
        "POST",
        f"/api/v2/apps/installs/{iid}/tools/echo/run",
        node.admin_key,
        json={"input": {"text": text}},
        headers={"Idempotency-Key": idempotency_key},
    )


def _read(node: Daemon, run_id: str) -> dict[str, Any]:
    got = node.call("GET", f"/api/v2/runs/{run_id}", node.admin_key)
    assert got.status_code == 200, got.text
    return dict(got.json())


def _peers(node: Daemon) -> Peers:
    """A node's way of signing requests for results (what another node of it sends)."""
    vault = Vault(base64.b64decode(node.env["RUNNERD_SECRETS_KEY"]))
    return Peers(vault.derive("node results"), ResultCache(1 << 20, 60), lambda: None)


def _node_of(node: Daemon, run_id: str) -> str:
    with psycopg.connect(node.env["RUNNERD_DATABASE_URL"]) as db:
        [(node_id,)] = db.execute("SELECT node_id FROM runs WHERE id = %s", [run_id]).fetchall()
    return str(node_id)


def test_a_replay_and_a_read_on_the_other_node_answer_the_output(
    nodes: tuple[Daemon, Daemon, str],
) -> None:
    a, b, iid = nodes
    first = _run(a, iid, "made on a", "results-1")
    assert first.status_code == 200, first.text
    body = first.json()
    assert list(body) == ["runId", "status", "output", "error", "durationMs"]  # the five
    retry = _run(b, iid, "made on a", "results-1")  # another node: asks A for the result
    assert retry.status_code == 200, retry.text
    assert retry.json() == body  # the same run, output and all
    for node in (a, b):
        found = _read(node, body["runId"])
        assert found["output"] == body["output"] and found["outputAvailable"] is True
        assert found["outputMissing"] is None
    # Nothing of the output is in the database, in clear or sealed.
    store = b.store()
    try:
        for table in store.db.table_names():
            assert "made on a" not in repr(list(store.db.query(f"SELECT * FROM {table}")))
    finally:
        store.close()


def test_the_node_route_answers_only_a_node_s_fresh_request_for_that_run(
    nodes: tuple[Daemon, Daemon, str],
) -> None:
    """Only a request signed with the cluster's key, for that run, made for that node,
    within the window, and never seen before; its answer is signed too."""
    a, b, iid = nodes
    ran = _run(a, iid, "held by a", "results-2").json()
    other = _run(a, iid, "another", "results-3").json()
    peers, holder = _peers(a), _node_of(a, ran["runId"])
    path = f"/internal/results/{ran['runId']}"
    token = peers.sign(ran["runId"], holder)
    good = a.http.get(path, headers={PEER_HEADER: token})
    assert good.status_code == 200 and good.json()["output"] == ran["output"]
    assert good.headers["Cache-Control"] == "no-store"
    assert good.headers[PEER_ANSWER_HEADER] == peers.answer_mac(token, good.content)
    replayed = a.http.get(path, headers={PEER_HEADER: token})  # seen on the wire, sent again
    assert replayed.status_code == 404 and replayed.content == b""
    stale = peers.sign(ran["runId"], holder, now=time.time() - PEER_TOKEN_WINDOW_S - 5)
    forged = peers.sign(ran["runId"], holder)[:-4] + "0000"
    strangers = Peers(b"x" * 32, ResultCache(1 << 20, 60), lambda: None).sign(ran["runId"], holder)
    for bad in ("", peers.sign(other["runId"], holder), stale, forged, strangers, "a.b.c"):
        refused = a.http.get(path, headers={PEER_HEADER: bad} if bad else {})
        assert refused.status_code == 404, (bad, refused.text)
        assert refused.content == b""  # nothing says whether the run exists
    # A good request made for another node: 421 (misdirected), nothing of the run.
    misdirected = a.http.get(path, headers={PEER_HEADER: peers.sign(ran["runId"], "node_x")})
    assert misdirected.status_code == 421 and misdirected.content == b""
    # B holds nothing of A's run: it answers a good request made for it 404.
    for_b = peers.sign(ran["runId"], _node_of(b, _run(b, iid, "b's", "results-2b").json()["runId"]))
    assert b.http.get(path, headers={PEER_HEADER: for_b}).status_code == 404


def test_an_answer_not_signed_with_the_cluster_s_key_is_not_believed(
    nodes: tuple[Daemon, Daemon, str],
) -> None:
    """Whatever answers at a node's address without the key (a stale address now another
    service's, a machine in the path) cannot hand a node a result: B says the node did
    not answer, never the injected output."""
    a, b, iid = nodes
    first = _run(a, iid, "the real one", "results-forged").json()
    fake = {"runId": first["runId"], "status": "succeeded", "output": {"echo": "INJECTED"},
            "error": None, "durationMs": 2}  # fmt: skip
    body = json.dumps(fake).encode()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"x-runnerd-node-answer: " + b"0" * 64 + b"\r\n"
                                 b"content-length: %d\r\n\r\n" % len(body) + body)  # fmt: skip

    threading.Thread(target=serve, daemon=True).start()
    with psycopg.connect(a.env["RUNNERD_DATABASE_URL"], autocommit=True) as db:
        node = _node_of(a, first["runId"])
        [(url,)] = db.execute("SELECT url FROM nodes WHERE id = %s", [node]).fetchall()
        db.execute("UPDATE nodes SET url = %s WHERE id = %s", [f"http://127.0.0.1:{port}", node])
        try:
            retry = _run(b, iid, "the real one", "results-forged").json()
            read = _read(b, first["runId"])
        finally:
            db.execute("UPDATE nodes SET url = %s WHERE id = %s", [url, node])
            listener.close()
    for answer in (retry, read):
        assert answer["output"] is None and answer["outputAvailable"] is False, answer
        assert answer["outputMissing"] == "OUTPUT_NODE_UNREACHABLE"


def test_a_node_that_does_not_answer_makes_the_replay_say_so(
    nodes: tuple[Daemon, Daemon, str],
) -> None:
    a, b, iid = nodes
    first = _run(a, iid, "a will freeze", "results-4").json()
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        retry = _run(b, iid, "a will freeze", "results-4")
        waited = time.monotonic() - began
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    assert retry.status_code == 200, retry.text
    body = retry.json()
    assert body["runId"] == first["runId"] and body["status"] == "succeeded"
    assert body["output"] is None and body["outputAvailable"] is False
    assert body["outputMissing"] == "OUTPUT_NODE_UNREACHABLE"
    assert waited < PEER_TIMEOUT_S + 3, waited
    # A is back: the same replay on B has the output again.
    again = _run(b, iid, "a will freeze", "results-4").json()
    assert again == first


def test_a_result_of_a_node_that_stopped_since_is_missing_and_says_why(
    nodes: tuple[Daemon, Daemon, str], toolchain_dir: Path
) -> None:
    a, _, iid = nodes
    with running_daemon(toolchain_dir, join=a, **SETTINGS) as c:
        first = _run(c, iid, "made on c", "results-5")
        assert first.status_code == 200, first.text
    # C stopped (its memory went with it): A answers the run, and why it has no output.
    retry = _run(a, iid, "made on c", "results-5")
    assert retry.status_code == 200, retry.text
    body = retry.json()
    assert body["runId"] == first.json()["runId"] and body["status"] == "succeeded"
    assert body["output"] is None and body["outputAvailable"] is False
    assert body["outputMissing"] == "OUTPUT_NODE_STOPPED"
    found = _read(a, body["runId"])
    assert found["outputAvailable"] is False and found["outputMissing"] == "OUTPUT_NODE_STOPPED"


def test_one_node_s_replay_after_its_restart_says_the_output_went_with_it(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    """One node on SQLite: what it held in memory does not survive a restart (outputs are
    never written anywhere), and the replay says so instead of a silent null."""
    with running_daemon(toolchain_dir, **SETTINGS) as d:
        iid = d.ship(gov_app(tmp_path))["installId"]
        first = _run(d, iid, "before the restart", "results-6").json()
        assert "outputAvailable" not in first
        d.proc.send_signal(signal.SIGTERM)
        d.proc.wait(timeout=20)
        with serving_again(d):
            retry = _run(d, iid, "before the restart", "results-6").json()
    assert retry["runId"] == first["runId"] and retry["output"] is None
    assert (retry["outputAvailable"], retry["outputMissing"]) == (False, "OUTPUT_NODE_STOPPED")


@pytest.mark.parametrize("answer", ["silent", "endless"])
def test_a_node_url_that_hangs_or_floods_costs_the_asker_at_most_the_bound(
    nodes: tuple[Daemon, Daemon, str], answer: str
) -> None:
    """A's published address replaced by a listener that never answers, or that answers
    200 with a body without end: B's replay of A's run says OUTPUT_NODE_UNREACHABLE within
    PEER_TIMEOUT_S (the whole answer, not each read), and reads a bounded amount."""
    a, b, iid = nodes
    key = f"results-hang-{answer}"
    first = _run(a, iid, "held by a", key).json()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sent = [0]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            if answer == "silent":
                time.sleep(PEER_TIMEOUT_S + 3)
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n[")
            with contextlib.suppress(OSError):
                while sent[0] < 64 << 20:
                    conn.sendall(b"1," * 8192)
                    sent[0] += 16384

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    with psycopg.connect(a.env["RUNNERD_DATABASE_URL"], autocommit=True) as db:
        [(url,)] = db.execute(
            "SELECT url FROM nodes WHERE id = (SELECT node_id FROM runs WHERE id = %s)",
            [first["runId"]],
        ).fetchall()
        db.execute("UPDATE nodes SET url = %s WHERE url = %s", [f"http://127.0.0.1:{port}", url])
        try:
            began = time.monotonic()
            retry = _run(b, iid, "held by a", key).json()
            waited = time.monotonic() - began
        finally:
            db.execute(
                "UPDATE nodes SET url = %s WHERE url = %s", [url, f"http://127.0.0.1:{port}"]
            )
            listener.close()
    assert (retry["outputAvailable"], retry["outputMissing"]) == (False, "OUTPUT_NODE_UNREACHABLE")
    assert waited < PEER_TIMEOUT_S + 1.5, waited
    assert sent[0] < 64 << 20  # B stopped reading long before the flood's end
    assert _run(b, iid, "held by a", key).json() == first  # A's own address again
