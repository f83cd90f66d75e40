"""Request bodies through a real daemon, with raw httpx: what changes state takes
``application/json`` only (or no body at all), and no JSON object may hold a key twice,
at any depth, however it is spelled. Nothing of it becomes a 500."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import tool_doc, write_app
from daemon import Daemon, envelope
from runnerd.checks.duplicates import TooManyTokens, duplicate_key, duplicate_key_sparse

pytestmark = pytest.mark.jail

SESSION = "/api/v2/session"
# The types a cross-site form or a careless client sends, and near misses of JSON.
NOT_JSON = [
    None,
    "text/plain",
    "text/plain; charset=utf-8",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json-patch+json",
    "application/jsonx",
    "application/json5",
    "text/json",
    "application/json; charset=latin-1",
    "application/json; charset=utf-16",
    "application/json; boundary=x",
    "application/json, text/plain",
    "text/plain, application/json",
    "text/plain; application/json",
    "application/json;",
    "application/json; charset=utf-8; charset=utf-8",
    'application/json; charset="utf-8',
    "application/json; charset=utf-8 x",
    "",
]
JSON_TYPES = [
    "application/json",
    "APPLICATION/JSON",
    "Application/Json;Charset=UTF-8",
    'application/json; charset="utf-8"',
    "application/json ;  charset=utf-8",
]


def raw_post(
    daemon: Daemon, path: str, body: bytes, content_type: str | None, **kw: Any
) -> httpx.Response:
    """``body`` exactly as given, labelled ``content_type`` (no label when None), from a
    client of its own (no cookie kept from one request to the next)."""
    headers = dict(kw.pop("headers", {}))
    if content_type is not None:
        headers["content-type"] = content_type
    return httpx.post(daemon.url + path, content=body, headers=headers, timeout=60, **kw)


def session_count(daemon: Daemon) -> int:
    store = daemon.store()
    try:
        return int(store.db.execute("SELECT COUNT(*) FROM web_sessions").fetchone()[0])
    finally:
        store.close()


@pytest.fixture(scope="module")
def install(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("bodies") / "app"
    write_app(root, "bodies", {"echo": "def run(i):\n    return {'got': i}\n"})
    return str(daemon.ship(root)["installId"])


def runs_of(daemon: Daemon, install: str) -> int:
    listed = daemon.call("GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key)
    assert listed.status_code == 200, listed.text
    return len(listed.json()["data"])


# --- cross-site sign-in ------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", NOT_JSON)
def test_a_sign_in_not_labelled_json_gets_no_cookie_and_no_session(
    daemon: Daemon, content_type: str | None
) -> None:
    attacker = daemon.person("attacker@example.com")
    before = session_count(daemon)
    body = json.dumps({"apiKey": attacker}).encode()
    response = raw_post(daemon, SESSION, body, content_type)
    error = envelope(response, 415, "CONTENT_TYPE_NOT_JSON")
    assert error["details"]["field"] == "Content-Type"
    assert "set-cookie" not in response.headers
    assert session_count(daemon) == before


def test_two_content_type_headers_are_refused_even_when_both_say_json(daemon: Daemon) -> None:
    attacker = daemon.person("attacker2@example.com")
    before = session_count(daemon)
    for pair in (("application/json", "application/json"), ("application/json", "text/plain")):
        response = httpx.post(
            daemon.url + SESSION,
            content=json.dumps({"apiKey": attacker}).encode(),
            headers=[("content-type", pair[0]), ("content-type", pair[1])],
        )
        envelope(response, 415, "CONTENT_TYPE_NOT_JSON")
        assert "set-cookie" not in response.headers
    assert session_count(daemon) == before


@pytest.mark.parametrize("content_type", JSON_TYPES)
def test_json_in_any_case_and_with_a_utf8_charset_signs_in(
    daemon: Daemon, content_type: str
) -> None:
    key = daemon.person("signs-in@example.com")
    response = raw_post(daemon, SESSION, json.dumps({"apiKey": key}).encode(), content_type)
    assert response.status_code == 200, response.text
    assert response.headers["set-cookie"].startswith("runnerd_session=")


@pytest.mark.parametrize(
    "body",
    [
        '{"apiKey": "%(victim)s", "apiKey": "%(attacker)s"}',
        '{"apiKey": "%(victim)s", "\\u0061piKey": "%(attacker)s"}',
        '{"\\u0061\\u0070\\u0069\\u004b\\u0065\\u0079": "%(victim)s", "apiKey": "%(attacker)s"}',
        '{"apiKey": "%(victim)s", "loginToken": "x", "apiKey" : "%(attacker)s"}',
    ],
)
def test_a_sign_in_with_a_key_twice_is_refused_however_it_is_spelled(
    daemon: Daemon, body: str
) -> None:
    victim = daemon.person("victim@example.com")
    attacker = daemon.person("attacker3@example.com")
    before = session_count(daemon)
    text = body % {"victim": victim, "attacker": attacker}
    response = raw_post(daemon, SESSION, text.encode(), "application/json")
    error = envelope(response, 400, "DUPLICATE_KEY")
    assert error["details"]["key"] == "apiKey"
    assert "set-cookie" not in response.headers
    assert session_count(daemon) == before


# --- every route that changes state ------------------------------------------------------------


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


def test_a_large_input_with_a_key_twice_at_its_end_is_refused(daemon: Daemon, install: str) -> None:
    # 200 KB of small objects (scanned in a worker thread), the repeat in the last one.
    rows = ",".join(f'{{"a": {i}, "b": "x"}}' for i in range(9_000))
    body = '{"input": {"rows": [' + rows + ', {"a": 1, "b": 2, "a": 3}]}}'
    assert len(body) > 64 * 1024
    path = f"/api/v2/apps/installs/{install}/tools/echo/run"
    response = raw_post(
        daemon, path, body.encode(), "application/json", headers={"X-API-Key": daemon.admin_key}
    )
    assert envelope(response, 400, "DUPLICATE_KEY")["details"]["key"] == "a"


def test_a_secret_sent_twice_in_one_body_is_not_stored(daemon: Daemon, install: str) -> None:
    path = f"/api/v2/apps/installs/{install}/secrets/TWICE"
    key = {"X-API-Key": daemon.admin_key}
    for body in ('{"value": "first", "value": "second"}', '{"value": "a", "\\u0076alue": "b"}'):
        response = httpx.put(
            daemon.url + path,
            content=body.encode(),
            headers={**key, "content-type": "application/json"},
        )
        envelope(response, 400, "DUPLICATE_KEY")
    form = httpx.put(
        daemon.url + path,
        content=b"value=x",
        headers={**key, "content-type": "application/x-www-form-urlencoded"},
    )
    envelope(form, 415, "CONTENT_TYPE_NOT_JSON")
    listed = daemon.call("GET", f"/api/v2/apps/installs/{install}/secrets", daemon.admin_key)
    assert "TWICE" not in listed.text


def test_a_route_without_a_body_refuses_one_and_takes_an_empty_one(
    daemon: Daemon, tmp_path: Path
) -> None:
    root = write_app(tmp_path / "rb", "bodies-rollback", {"t": "def run(i):\n    return {}\n"})
    installed = daemon.ship(root)
    path = f"/api/v2/apps/installs/{installed['installId']}/rollback"
    key = {"X-API-Key": daemon.admin_key}
    for body, content_type in (
        (b"{}", "application/json"),
        (b"confirm=yes", "application/x-www-form-urlencoded"),
        (b"x", None),
    ):
        response = raw_post(daemon, path, body, content_type, headers=key)
        envelope(response, 400, "BODY_NOT_ALLOWED")
    chunked = daemon.http.post(path, content=iter([b"", b"{", b"}"]), headers=key)
    envelope(chunked, 400, "BODY_NOT_ALLOWED")
    # No body, or an empty one whatever its label: the route runs (no previous version).
    for content_type in (None, "text/plain", "application/json"):
        response = raw_post(daemon, path, b"", content_type, headers=key)
        envelope(response, 400, "NO_PREVIOUS_VERSION")
    empty_chunks = daemon.http.post(path, content=iter([b""]), headers=key)
    envelope(empty_chunks, 400, "NO_PREVIOUS_VERSION")


# --- deploy: its files map -------------------------------------------------------------------


def test_a_deploy_with_a_path_twice_is_refused_and_stores_nothing(daemon: Daemon) -> None:
    slug = "bodies-twice"
    files = {
        "agentserve.app.yaml": f"slug: {slug}\nname: Twice\ntools: ./tools/*\n".encode(),
        "tools/q.tool.yaml": tool_doc("q").encode(),
        "tools/q.py": b"def run(i):\n    return {}\n",
    }
    encoded = {p: base64.b64encode(d).decode() for p, d in files.items()}
    evil = base64.b64encode(b"import os\ndef run(i):\n    return {}\n").decode()
    entries = ", ".join(f'"{p}": "{d}"' for p, d in encoded.items())
    url = f"/api/v2/apps/deploy?workspaceId={daemon.workspace_id}"
    key = {"X-API-Key": daemon.admin_key}
    for body in (
        '{"files": {' + entries + f', "tools/q.py": "{evil}"' + "}}",
        '{"files": {' + entries + f', "\\u0074ools/q\\u002epy": "{evil}"' + "}}",
        '{"files": {' + entries + f', "tools\\/q.py" : "{evil}"' + "}}",
        '{"files": {"tools/q.py": "' + evil + '"}, "files": {' + entries + "}}",
        '{"\\u0066iles": {"tools/q.py": "' + evil + '"}, "files": {' + entries + "}}",
    ):
        response = raw_post(daemon, url, body.encode(), "application/json", headers=key)
        error = envelope(response, 400, "DUPLICATE_KEY")
        assert error["details"]["key"] in ("tools/q.py", "files")
    for content_type in ("text/plain", None, "application/jsonx"):
        body = json.dumps({"files": encoded}).encode()
        envelope(raw_post(daemon, url, body, content_type, headers=key), 415)
    listed = daemon.call(
        "GET", "/api/v2/apps", daemon.admin_key, params={"workspaceId": daemon.workspace_id}
    )
    assert slug not in listed.text
    accepted = raw_post(
        daemon, url, json.dumps({"files": encoded}).encode(), "application/json", headers=key
    )
    assert accepted.status_code == 201, accepted.text


def test_a_deploy_body_of_many_brackets_is_refused_cleanly(daemon: Daemon) -> None:
    # Valid JSON that msgspec leaves unread (a file's value) but that holds far more
    # strings and brackets than any bundle: refused before the scan spends long on it.
    many = "[" + ",".join(["[]"] * 200_000) + "]"
    body = '{"files": {"tools/x.py": ' + many + "}}"
    url = f"/api/v2/apps/deploy?workspaceId={daemon.workspace_id}"
    response = raw_post(
        daemon, url, body.encode(), "application/json", headers={"X-API-Key": daemon.admin_key}
    )
    assert "strings and brackets" in envelope(response, 400, "INVALID_BODY")["message"]


# --- MCP ---------------------------------------------------------------------------------------

STREAMS = "application/json, text/event-stream"


def _initialize(version: str = "2025-06-18") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }


def test_mcp_posts_take_json_only_and_refuse_keys_twice(daemon: Daemon) -> None:
    url = f"/mcp?workspaceId={daemon.workspace_id}"
    auth = {"Authorization": f"Bearer {daemon.admin_key}", "Accept": STREAMS}
    body = json.dumps(_initialize()).encode()
    for content_type in NOT_JSON:
        response = raw_post(daemon, url, body, content_type, headers=auth)
        envelope(response, 415, "CONTENT_TYPE_NOT_JSON")
        assert "mcp-session-id" not in response.headers
    text = body.decode()
    for twice in (
        text.replace('"id": 1,', '"id": 1, "id": 2,'),
        text.replace(
            '"jsonrpc": "2.0",', '"jsonrpc": "2.0", "\\u006aSONrpc": 1, "jsonrpc": "2.0",'
        ),
        text.replace('"name": "test"', '"name": "test", "\\u006eame": "other"'),
    ):
        assert twice != text
        response = raw_post(daemon, url, twice.encode(), "application/json", headers=auth)
        envelope(response, 400, "DUPLICATE_KEY")
        assert "mcp-session-id" not in response.headers
        # The same body in another encoding the SDK's parser would read: one reading only.
        for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"):
            response = raw_post(daemon, url, twice.encode(encoding), "application/json",
                                headers=auth)  # fmt: skip
            envelope(response, 400, "INVALID_BODY")
    lone = text.replace('"name": "test"', '"name": "te\\ud800st"')
    assert lone != text
    envelope(raw_post(daemon, url, lone.encode(), "application/json", headers=auth), 400)
    deep = '{"jsonrpc": "2.0", "id": 1, "method": "x", "params": ' + "[" * 5000 + "]" * 5000 + "}"
    envelope(raw_post(daemon, url, deep.encode(), "application/json", headers=auth), 400)
    too_big = b'{"jsonrpc": "2.0", "pad": "' + b"x" * (600 * 1024) + b'"}'
    envelope(
        raw_post(daemon, url, too_big, "application/json", headers=auth), 400, "BODY_TOO_LARGE"
    )
    opened = raw_post(daemon, url, body, "application/json; charset=utf-8", headers=auth)
    assert opened.status_code == 200, opened.text
    assert opened.headers["mcp-session-id"]
    ended = daemon.http.request(
        "DELETE",
        url,
        content=b"{}",
        headers={**auth, "Mcp-Session-Id": opened.headers["mcp-session-id"]},
    )
    envelope(ended, 400, "BODY_NOT_ALLOWED")


# --- the two scans agree ---------------------------------------------------------------------

CASES: dict[bytes, str | None] = {
    b'{"a":1,"a":2}': "a",
    b'{"a":1,"\\u0061":2}': "a",
    b'{"x":{"in":[{"b":1},{"c":{"a":1,"a":2}}]}}': "a",
    b'{"a":1,"b":{"a":2}}': None,
    b'[{"a":1},{"a":2}]': None,
    b'{"k":"a\\"b","k\\"":1,"a\\"b":2}': None,
    b'{"s":"{\\"a\\":1,\\"a\\":2}"}': None,
    b'{"files":{"p":"QQ=="},"files":{}}': "files",
    b'{"files":{"p":"QQ==","\\u0070":"QQ=="}}': "p",
    b'{"p\\\\":1,"p\\\\" :2}': "p\\",
    b'{"a" \n : 1, "b": [1,2,{"a":1}], "a"\t:3}': "a",
    b'{"\\ud83d\\ude00":1,"\xf0\x9f\x98\x80":2}': "\U0001f600",
    b'{"\\/":1,"/":2}': "/",
    b"{}": None,
    b"[]": None,
    b'"x"': None,
    b"1": None,
}


@pytest.mark.parametrize("text", list(CASES))
def test_both_scans_find_the_same_repeated_key(text: bytes) -> None:
    assert duplicate_key(text) == CASES[text]
    assert duplicate_key_sparse(text, 1_000) == CASES[text]
    assert duplicate_key_sparse(bytearray(text), 1_000) == CASES[text]


def test_the_sparse_scan_stops_at_its_token_budget() -> None:
    with pytest.raises(TooManyTokens):
        duplicate_key_sparse(b"[" + b"[]," * 100 + b"[]]", 50)
    assert duplicate_key(b"{not json") is None and duplicate_key(b"\xff") is None


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
