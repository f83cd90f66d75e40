"""Request bodies through a real daemon where the socket or a run matters: a run takes
JSON only, refuses keys twice deep in its input and runs once for the body that passes;
a body its client leaves mid-way is no internal error. The rest of the body rules are in
test_bodies.py, in process."""

from __future__ import annotations

import pytest

from conftest import write_app
from daemon import Daemon, envelope
from test_bodies import ECHO, NOT_JSON, raw_post

pytestmark = pytest.mark.jail


@pytest.fixture(scope="module")
def install(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("bodies") / "app"
    write_app(root, "bodies", ECHO)
    return str(daemon.ship(root)["installId"])


def runs_of(daemon: Daemon, install: str) -> int:
    listed = daemon.call("GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key)
    assert listed.status_code == 200, listed.text
    return len(listed.json()["data"])


def test_runs_take_json_only_and_refuse_keys_twice_deep_in_the_input(
    daemon: Daemon, install: str
) -> None:
    path = f"/api/v2/apps/installs/{install}/tools/echo/run"
    key = {"X-API-Key": daemon.admin_key}
    before = runs_of(daemon, install)
    for content_type in NOT_JSON:
        body = b'{"input": {"a": 1}}'
        envelope(raw_post(daemon, path, body, content_type, headers=key), 415)
    twice = [
        '{"input": {"a": 1, "a": 2}}',
        '{"input": {"a": 1, "\\u0061": 2}}',
        '{"input": {"x": [1, {"y": {"k": 1, "\\u006b": 2}}]}}',
        '{"input": {"a": 1}, "input": {"a": 2}}',
        '{"input": {"a": 1}, "surface": "app", "surface": "chat"}',
        '{"input": {"s": "a\\"b", "s\\"": 1, "s": 2}}',
        '{"input": {"e": {"\\ud83d\\ude00": 1, "\U0001f600": 2}}}',
        '{"input": {"deep": ' + '{"d": ' * 120 + '{"z": 1, "z": 2}' + "}" * 120 + "}}",
    ]
    for body in twice:
        response = raw_post(daemon, path, body.encode(), "application/json", headers=key)
        envelope(response, 400, "DUPLICATE_KEY")
    # Keys that only look alike are not the same key; the same key in two objects is fine.
    ok = (
        '{"input": {"a": 1, "A": 2, "a ": 3, "x": [{"a": 1}, {"a": 2}], '
        '"s": "{\\"a\\":1,\\"a\\":2}"}}'
    )
    response = raw_post(daemon, path, ok.encode(), "application/json", headers=key)
    assert response.status_code == 200, response.text
    assert response.json()["output"]["got"]["s"] == '{"a":1,"a":2}'
    assert runs_of(daemon, install) == before + 1


def test_a_client_that_leaves_mid_body_is_no_internal_error(daemon: Daemon, install: str) -> None:
    """A body cut short by its client changes nothing and logs no traceback."""
    import socket
    import time

    before = runs_of(daemon, install)
    path = f"/api/v2/apps/installs/{install}/tools/echo/run"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: {daemon.admin_key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
            sock.sendall(head.encode() + b'{"input": {"a"')
            time.sleep(0.2)
    time.sleep(0.3)
    assert daemon.http.get("/healthz").status_code == 200
    assert runs_of(daemon, install) == before
    log = (daemon.data_dir / "serve.log").read_text()
    assert "internal error" not in log and "Traceback" not in log, log[-2000:]
