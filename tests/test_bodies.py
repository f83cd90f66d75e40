"""Request bodies through the daemon's app in this process (tests/inproc.py), with raw
httpx: what changes state takes ``application/json`` only (or no body at all), and no
JSON object may hold a key twice, at any depth, however it is spelled. Nothing of it
becomes a 500. A run's body and a body cut short on the socket are in
test_bodies_daemon.py, on a real daemon."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import tool_doc, write_app
from daemon import Runnerd, envelope
from inproc import InProcess
from runnerd.checks.duplicates import TooManyTokens, duplicate_key, duplicate_key_sparse

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
# The module's app: one tool that echoes its input.
ECHO = {"echo": "def run(i):\n    return {'got': i}\n"}
JSON_TYPES = [
    "application/json",
    "APPLICATION/JSON",
    "Application/Json;Charset=UTF-8",
    'application/json; charset="utf-8"',
    "application/json ;  charset=utf-8",
]


def raw_post(
    daemon: Runnerd, path: str, body: bytes, content_type: str | None, **kw: Any
) -> httpx.Response:
    """``body`` exactly as given, labelled ``content_type`` (no label when None), from a
    client of its own (no cookie kept from one request to the next)."""
    headers = dict(kw.pop("headers", {}))
    if content_type is not None:
        headers["content-type"] = content_type
    with daemon.client() as client:
        return client.post(path, content=body, headers=headers, **kw)


def session_count(daemon: Runnerd) -> int:
    store = daemon.store()
    try:
        return int(store.db.execute("SELECT COUNT(*) FROM web_sessions").fetchone()[0])
    finally:
        store.close()


@pytest.fixture(scope="module")
def install(app_daemon: InProcess, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("bodies") / "app"
    write_app(root, "bodies", ECHO)
    return str(app_daemon.ship(root)["installId"])


# --- cross-site sign-in ------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", NOT_JSON)
def test_a_sign_in_not_labelled_json_gets_no_cookie_and_no_session(
    app_daemon: InProcess, content_type: str | None
) -> None:
    attacker = app_daemon.person("attacker@example.com")
    before = session_count(app_daemon)
    body = json.dumps({"apiKey": attacker}).encode()
    response = raw_post(app_daemon, SESSION, body, content_type)
    error = envelope(response, 415, "CONTENT_TYPE_NOT_JSON")
    assert error["details"]["field"] == "Content-Type"
    assert "set-cookie" not in response.headers
    assert session_count(app_daemon) == before


def test_two_content_type_headers_are_refused_even_when_both_say_json(
    app_daemon: InProcess,
) -> None:
    attacker = app_daemon.person("attacker2@example.com")
    before = session_count(app_daemon)
    for pair in (("application/json", "application/json"), ("application/json", "text/plain")):
        with app_daemon.client() as client:
            response = client.post(
                SESSION,
                content=json.dumps({"apiKey": attacker}).encode(),
                headers=[("content-type", pair[0]), ("content-type", pair[1])],
            )
        envelope(response, 415, "CONTENT_TYPE_NOT_JSON")
        assert "set-cookie" not in response.headers
    assert session_count(app_daemon) == before


@pytest.mark.parametrize("content_type", JSON_TYPES)
def test_json_in_any_case_and_with_a_utf8_charset_signs_in(
    app_daemon: InProcess, content_type: str
) -> None:
    key = app_daemon.person("signs-in@example.com")
    response = raw_post(app_daemon, SESSION, json.dumps({"apiKey": key}).encode(), content_type)
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
    app_daemon: InProcess, body: str
) -> None:
    victim = app_daemon.person("victim@example.com")
    attacker = app_daemon.person("attacker3@example.com")
    before = session_count(app_daemon)
    text = body % {"victim": victim, "attacker": attacker}
    response = raw_post(app_daemon, SESSION, text.encode(), "application/json")
    error = envelope(response, 400, "DUPLICATE_KEY")
    assert error["details"]["key"] == "apiKey"
    assert "set-cookie" not in response.headers
    assert session_count(app_daemon) == before


# --- every route that changes state ------------------------------------------------------------


def test_a_large_input_with_a_key_twice_at_its_end_is_refused(
    app_daemon: InProcess, install: str
) -> None:
    # 200 KB of small objects (scanned in a worker thread), the repeat in the last one.
    rows = ",".join(f'{{"a": {i}, "b": "x"}}' for i in range(9_000))
    body = '{"input": {"rows": [' + rows + ', {"a": 1, "b": 2, "a": 3}]}}'
    assert len(body) > 64 * 1024
    path = f"/api/v2/apps/installs/{install}/tools/echo/run"
    response = raw_post(
        app_daemon,
        path,
        body.encode(),
        "application/json",
        headers={"X-API-Key": app_daemon.admin_key},
    )
    assert envelope(response, 400, "DUPLICATE_KEY")["details"]["key"] == "a"


def test_a_secret_sent_twice_in_one_body_is_not_stored(app_daemon: InProcess, install: str) -> None:
    path = f"/api/v2/apps/installs/{install}/secrets/TWICE"
    key = {"X-API-Key": app_daemon.admin_key}
    for body in ('{"value": "first", "value": "second"}', '{"value": "a", "\\u0076alue": "b"}'):
        with app_daemon.client() as client:
            response = client.put(
                path, content=body.encode(), headers={**key, "content-type": "application/json"}
            )
        envelope(response, 400, "DUPLICATE_KEY")
    with app_daemon.client() as client:
        form = client.put(
            path,
            content=b"value=x",
            headers={**key, "content-type": "application/x-www-form-urlencoded"},
        )
    envelope(form, 415, "CONTENT_TYPE_NOT_JSON")
    listed = app_daemon.call(
        "GET", f"/api/v2/apps/installs/{install}/secrets", app_daemon.admin_key
    )
    assert "TWICE" not in listed.text


def test_a_route_without_a_body_refuses_one_and_takes_an_empty_one(
    app_daemon: InProcess, tmp_path: Path
) -> None:
    root = write_app(tmp_path / "rb", "bodies-rollback", {"t": "def run(i):\n    return {}\n"})
    installed = app_daemon.ship(root)
    path = f"/api/v2/apps/installs/{installed['installId']}/rollback"
    key = {"X-API-Key": app_daemon.admin_key}
    for body, content_type in (
        (b"{}", "application/json"),
        (b"confirm=yes", "application/x-www-form-urlencoded"),
        (b"x", None),
    ):
        response = raw_post(app_daemon, path, body, content_type, headers=key)
        envelope(response, 400, "BODY_NOT_ALLOWED")
    chunked = app_daemon.http.post(path, content=iter([b"", b"{", b"}"]), headers=key)
    envelope(chunked, 400, "BODY_NOT_ALLOWED")
    # No body, or an empty one whatever its label: the route runs (no previous version).
    for content_type in (None, "text/plain", "application/json"):
        response = raw_post(app_daemon, path, b"", content_type, headers=key)
        envelope(response, 400, "NO_PREVIOUS_VERSION")
    empty_chunks = app_daemon.http.post(path, content=iter([b""]), headers=key)
    envelope(empty_chunks, 400, "NO_PREVIOUS_VERSION")


# --- deploy: its files map -------------------------------------------------------------------


def test_a_deploy_with_a_path_twice_is_refused_and_stores_nothing(app_daemon: InProcess) -> None:
    slug = "bodies-twice"
    files = {
        "agentserve.app.yaml": f"slug: {slug}\nname: Twice\ntools: ./tools/*\n".encode(),
        "tools/q.tool.yaml": tool_doc("q").encode(),
        "tools/q.py": b"def run(i):\n    return {}\n",
    }
    encoded = {p: base64.b64encode(d).decode() for p, d in files.items()}
    evil = base64.b64encode(b"import os\ndef run(i):\n    return {}\n").decode()
    entries = ", ".join(f'"{p}": "{d}"' for p, d in encoded.items())
    url = f"/api/v2/apps/deploy?workspaceId={app_daemon.workspace_id}"
    key = {"X-API-Key": app_daemon.admin_key}
    for body in (
        '{"files": {' + entries + f', "tools/q.py": "{evil}"' + "}}",
        '{"files": {' + entries + f', "\\u0074ools/q\\u002epy": "{evil}"' + "}}",
        '{"files": {' + entries + f', "tools\\/q.py" : "{evil}"' + "}}",
        '{"files": {"tools/q.py": "' + evil + '"}, "files": {' + entries + "}}",
        '{"\\u0066iles": {"tools/q.py": "' + evil + '"}, "files": {' + entries + "}}",
    ):
        response = raw_post(app_daemon, url, body.encode(), "application/json", headers=key)
        error = envelope(response, 400, "DUPLICATE_KEY")
        assert error["details"]["key"] in ("tools/q.py", "files")
    for content_type in ("text/plain", None, "application/jsonx"):
        body = json.dumps({"files": encoded}).encode()
        envelope(raw_post(app_daemon, url, body, content_type, headers=key), 415)
    listed = app_daemon.call(
        "GET", "/api/v2/apps", app_daemon.admin_key, params={"workspaceId": app_daemon.workspace_id}
    )
    assert slug not in listed.text
    accepted = raw_post(
        app_daemon, url, json.dumps({"files": encoded}).encode(), "application/json", headers=key
    )
    assert accepted.status_code == 201, accepted.text


def test_a_deploy_body_of_many_brackets_is_refused_cleanly(app_daemon: InProcess) -> None:
    # Valid JSON that msgspec leaves unread (a file's value) but that holds far more
    # strings and brackets than any bundle: refused before the scan spends long on it.
    many = "[" + ",".join(["[]"] * 200_000) + "]"
    body = '{"files": {"tools/x.py": ' + many + "}}"
    url = f"/api/v2/apps/deploy?workspaceId={app_daemon.workspace_id}"
    response = raw_post(
        app_daemon,
        url,
        body.encode(),
        "application/json",
        headers={"X-API-Key": app_daemon.admin_key},
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


def test_mcp_posts_take_json_only_and_refuse_keys_twice(app_daemon: InProcess) -> None:
    url = f"/mcp?workspaceId={app_daemon.workspace_id}"
    auth = {"Authorization": f"Bearer {app_daemon.admin_key}", "Accept": STREAMS}
    body = json.dumps(_initialize()).encode()
    for content_type in NOT_JSON:
        response = raw_post(app_daemon, url, body, content_type, headers=auth)
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
        response = raw_post(app_daemon, url, twice.encode(), "application/json", headers=auth)
        envelope(response, 400, "DUPLICATE_KEY")
        assert "mcp-session-id" not in response.headers
        # The same body in another encoding the SDK's parser would read: one reading only.
        for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"):
            response = raw_post(app_daemon, url, twice.encode(encoding), "application/json",
                                headers=auth)  # fmt: skip
            envelope(response, 400, "INVALID_BODY")
    lone = text.replace('"name": "test"', '"name": "te\\ud800st"')
    assert lone != text
    envelope(raw_post(app_daemon, url, lone.encode(), "application/json", headers=auth), 400)
    deep = '{"jsonrpc": "2.0", "id": 1, "method": "x", "params": ' + "[" * 5000 + "]" * 5000 + "}"
    envelope(raw_post(app_daemon, url, deep.encode(), "application/json", headers=auth), 400)
    too_big = b'{"jsonrpc": "2.0", "pad": "' + b"x" * (600 * 1024) + b'"}'
    envelope(
        raw_post(app_daemon, url, too_big, "application/json", headers=auth), 400, "BODY_TOO_LARGE"
    )
    opened = raw_post(app_daemon, url, body, "application/json; charset=utf-8", headers=auth)
    assert opened.status_code == 200, opened.text
    assert opened.headers["mcp-session-id"]
    ended = app_daemon.http.request(
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
