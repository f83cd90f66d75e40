"""A revoked grant holds for runs already going: the egress proxy checks each connection of
an install's run against the install's grant as stored now, and closes the open ones it
no longer covers. End to end, on a live daemon and the egress lab (tests/egress_lab.py).
"""

from __future__ import annotations

import base64
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon import Daemon, running_daemon
from egress_lab import HTTP_PORT, EgressLab, app_dir, run_ok
from pg_cluster import PgCluster

pytestmark = pytest.mark.jail

# After the revoking call answers: a new connection is refused by the next one the run
# makes (it polls every 250 ms), an open one closes within the proxy's 1 s re-check. The
# bounds leave a loaded machine room (ten polls, five re-checks); a run that kept its
# reach would be cut by neither before its end (it polls for 8 s).
REFUSED_WITHIN_S, CLOSED_WITHIN_S = 2.5, 5.0

POLL_PY = """\
import base64, os, socket, time, urllib.parse, urllib.request


def run(input):
    proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
    cred = base64.b64encode(f"run:{proxy.password}".encode()).decode()
    held = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
    head = f"CONNECT other.test:8080 HTTP/1.1\\r\\nProxy-Authorization: Basic {cred}"
    held.sendall((head + "\\r\\n\\r\\n").encode())
    tunnel = held.recv(300).decode(errors="replace").split("\\r\\n")[0]
    held.settimeout(0.01)
    refused = closed = None
    polls = 0
    deadline = time.monotonic() + input["within"]
    while time.monotonic() < deadline and (refused is None or closed is None):
        if refused is None:
            try:
                url = f"http://other.test:8080/poll/{input['tag']}"
                urllib.request.urlopen(url, timeout=5).read()
                polls += 1
            except Exception as exc:
                refused = [time.time(), f"{type(exc).__name__}: {exc}"]
        if closed is None:
            try:
                if held.recv(1) == b"":
                    closed = time.time()
            except socket.timeout:
                pass
            except OSError:
                closed = time.time()
        time.sleep(0.05 if refused else 0.25)  # at most 16 connections a run (egress_daemon)
    return {"tunnel": tunnel, "polls": polls, "refused": refused, "closed": closed}
"""


def _publish_without_other(daemon: Daemon, root: Path) -> None:
    """Version 2 of the app in ``root``, which does not ask for other.test."""
    manifest = root / "agentserve.app.yaml"
    text = manifest.read_text().replace("version: '1'", "version: '2'")
    manifest.write_text(text.replace(f"  - 'other.test:{HTTP_PORT}'\n", ""))
    version = daemon.deploy(root).json()["version"]
    published = daemon.call(
        "POST",
        f"/api/v2/apps/{version['appSlug']}/versions/{version['version']}/publish",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id},
    )
    assert published.status_code == 200, published.text


def _revoke_other(daemon: Daemon, install: dict[str, Any], how: str) -> None:
    """Take other.test out of ``install``'s grant: narrow it, or switch to version 2."""
    where = f"/api/v2/apps/installs/{install['installId']}"
    if how == "narrow":
        done = daemon.call(
            "PUT", where + "/egress", daemon.admin_key, json={"egress": [f"api.test:{HTTP_PORT}"]}
        )
    else:
        done = daemon.call("POST", where + "/switch", daemon.admin_key, json={"version": "2"})
    assert done.status_code == 200, done.text
    answer = done.json()
    assert f"other.test:{HTTP_PORT}" not in answer.get("granted", answer.get("egress"))


@pytest.mark.parametrize("how", ["narrow", "switch"])
def test_a_revoked_grant_refuses_a_run_in_flight_at_once(
    egress_daemon: Daemon, lab: EgressLab, tmp_path: Path, how: str
) -> None:
    _revoke_while_running(egress_daemon, egress_daemon, lab, tmp_path, how)


@pytest.fixture(scope="module")
def pg_nodes(lab: EgressLab, pg: PgCluster, toolchain_dir: Path) -> Iterator[tuple[Daemon, Daemon]]:
    """Two nodes on one PostgreSQL database, each resolving through the lab's hosts file."""
    settings = {"egress_allow_networks": lab.network, "egress_max_connections": "16"}
    key = base64.b64encode(os.urandom(32)).decode()
    with (
        running_daemon(toolchain_dir, wrap=lab.wrap, database_url=pg.new_database(),
                       secrets_key=key, **settings) as a,
        running_daemon(toolchain_dir, wrap=lab.wrap, join=a, **settings) as b,
    ):  # fmt: skip
        yield a, b


def test_a_grant_narrowed_on_one_node_refuses_a_run_on_the_other(
    pg_nodes: tuple[Daemon, Daemon], lab: EgressLab, tmp_path: Path
) -> None:
    admin_node, run_node = pg_nodes
    _revoke_while_running(run_node, admin_node, lab, tmp_path, "narrow")


def _revoke_while_running(
    runs: Daemon, admin: Daemon, lab: EgressLab, tmp_path: Path, how: str
) -> None:
    """A run on ``runs`` holds a tunnel to other.test and polls it; ``admin`` takes
    other.test out of the grant (``how``). The run's next connection is refused, and
    its tunnel closed, within the bounds above."""
    root = app_dir(
        tmp_path, f"revoke{how}", [f"api.test:{HTTP_PORT}", f"other.test:{HTTP_PORT}"],
        {"poll": (".py", POLL_PY)},
    )  # fmt: skip
    install = admin.ship(root)
    if how == "switch":
        _publish_without_other(admin, root)
    tag = uuid.uuid4().hex
    found: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: found.update(
            run_ok(runs, install["installId"], "poll", {"tag": tag, "within": 8})
        )
    )
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if any(r["path"] == f"/poll/{tag}" for r in lab.received()):
                break
            time.sleep(0.02)
        else:
            pytest.fail("the run never reached its granted host")
        _revoke_other(admin, install, how)
        revoked = time.time()
    finally:
        thread.join()
    assert found["status"] == "succeeded", found["error"]
    output = found["output"]
    assert output["tunnel"].startswith("HTTP/1.1 200"), output
    assert output["refused"] is not None, "the run kept reaching a destination no longer granted"
    refused_at, error = output["refused"]
    assert "403" in error and "(not granted)" in error, error
    assert "no longer in this install's egress grant" in error, error
    assert refused_at - revoked < REFUSED_WITHIN_S, output
    assert output["closed"] is not None, "the open tunnel stayed open"
    assert output["closed"] - revoked < CLOSED_WITHIN_S, output
