"""An app's pages (issue 26): the manifest's ``pages`` folder in the bundle, checked at
upload, stored with the version, served on the apps origin (a second listener of a real
daemon) to a frame token, and nothing else served there.

A real ``runnerd serve`` (tests/daemon.py gives it a free ``apps_port``), real HTTP on
both ports, the real store. No tool runs.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from conftest import run_cli, write_app
from daemon import Daemon, envelope
from inproc import in_process
from runnerd.api.frames import FRAME_KEY_LABEL, issue_frame_token
from runnerd.config import load_settings
from runnerd.daemon.apps_origin import page_csp
from runnerd.errors import BundleRejected, ConfigError
from runnerd.limits import MAX_PAGE_BYTES, MAX_PAGE_FILES, MAX_PAGES_BYTES, MB
from runnerd.upload.walk import read_app_dir
from runnerd.vault import Vault

BACKENDS = ("sqlite", "postgresql")  # pages are bytes in a BLOB, and in a BYTEA
ECHO = "def run(i):\n    return {'echo': i.get('text')}\n"
PAGE_V1 = b"<!doctype html><title>v1</title><script src='app.js'></script><p>version one</p>"
PAGE_V2 = b"<!doctype html><title>v2</title><p>version two</p>"


def pages_app(
    root: Path,
    slug: str = "paged",
    version: str = "1",
    index: bytes = PAGE_V1,
    *,
    pages: str = "./web",
    entry: str | None = None,
) -> Path:
    """An app with one tool (``echo``) and a pages folder ``web`` of three files."""
    write_app(root, slug, {"echo": ECHO}, version=version)
    manifest = (
        f"slug: {slug}\nname: {slug.title()}\nversion: '{version}'\ntools: ./tools/*\n"
        f"pages: {pages}\n" + (f"entry: {entry}\n" if entry else "")
    )
    (root / "agentserve.app.yaml").write_text(manifest)
    (root / "web" / "sub").mkdir(parents=True, exist_ok=True)
    (root / "web" / "index.html").write_bytes(index)
    (root / "web" / "app.js").write_text("document.title += '!';\n")
    (root / "web" / "sub" / "style.css").write_text("p { color: teal }\n")
    return root


def apps_base(d: Daemon) -> str:
    """The apps origin as the daemon names it (http://localhost:<apps_port>)."""
    return f"http://localhost:{d.env['RUNNERD_APPS_PORT']}"


class Answer:
    """An answer of the apps port: status, headers (lowercase names), body."""

    def __init__(self, status: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code, self.headers, self.content = status, headers, content
        self.text = content.decode(errors="replace")


def on_apps(
    d: Daemon, method: str, url_or_path: str, headers: dict[str, str] | None = None
) -> Answer:
    """One request to the apps port, its path sent byte for byte (http.client: httpx
    would resolve dot segments first), on a connection of its own (no cookie kept)."""
    parts = urlsplit(url_or_path)
    path = parts.path if parts.scheme else url_or_path
    port = int(d.env["RUNNERD_APPS_PORT"])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True)
        conn.putheader("Host", f"localhost:{port}")
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        found = {k.lower(): v for k, v in response.getheaders()}
        return Answer(response.status, found, response.read())
    finally:
        conn.close()


def frame(d: Daemon, install_id: str, key: str | None = None) -> httpx.Response:
    return d.call("POST", f"/api/v2/apps/installs/{install_id}/frame", key or d.admin_key)


def versions(d: Daemon, slug: str) -> list[str]:
    listed = d.call("GET", "/api/v2/apps", d.admin_key, params={"workspaceId": d.workspace_id})
    return [v["version"] for a in listed.json()["data"] if a["appSlug"] == slug
            for v in a["versions"]]  # fmt: skip


@pytest.fixture(scope="module")
def shipped(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The app ``paged``, versions 1 and 2 deployed and published, 1 installed."""
    root = tmp_path_factory.mktemp("pages")
    first = daemon.deploy(pages_app(root / "v1"))
    assert first.status_code == 201, first.text
    assert first.json()["pages"] == 3
    second = daemon.deploy(pages_app(root / "v2", version="2", index=PAGE_V2))
    assert second.status_code == 201, second.text
    q = {"workspaceId": daemon.workspace_id}
    for version in ("1", "2"):
        published = daemon.call("POST", f"/api/v2/apps/paged/versions/{version}/publish",
                                daemon.admin_key, params=q)  # fmt: skip
        assert published.status_code == 200, published.text
    install = daemon.call("POST", "/api/v2/apps/installs", daemon.admin_key, params=q,
                          json={"appSlug": "paged", "version": "1"})  # fmt: skip
    assert install.status_code == 201, install.text
    return {"install": install.json(), "root": root}


def test_the_frame_url_serves_the_page_with_its_headers(
    daemon: Daemon, shipped: dict[str, Any]
) -> None:
    d, install = daemon, shipped["install"]
    opened = frame(d, install["installId"])
    assert opened.status_code == 201, opened.text
    body = opened.json()
    token = body["token"]
    assert body["origin"] == apps_base(d)
    assert body["url"] == f"{apps_base(d)}/f/{token}/index.html"
    assert body["expiresAt"].endswith("Z")
    page = on_apps(d, "GET", body["url"])
    assert page.status_code == 200, page.text
    assert page.content == PAGE_V1
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    for part in ("default-src 'self'", "script-src 'self'", "connect-src 'none'",
                 f"frame-ancestors http://127.0.0.1:{d.port}"):  # fmt: skip
        assert part in csp, csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["etag"] == f'"{hashlib.sha256(PAGE_V1).hexdigest()}"'
    assert "set-cookie" not in page.headers
    # The other files, by their types; the entry at the folder's address; a revalidation.
    style = on_apps(d, "GET", f"/f/{token}/sub/style.css")
    assert (style.status_code, style.headers["content-type"]) == (200, "text/css; charset=utf-8")
    script = on_apps(d, "GET", f"/f/{token}/app.js")
    assert script.headers["content-type"] == "text/javascript; charset=utf-8"
    assert on_apps(d, "GET", f"/f/{token}/").content == PAGE_V1
    same = on_apps(d, "GET", body["url"], headers={"If-None-Match": page.headers["etag"]})
    assert (same.status_code, same.content) == (304, b"")
    head = on_apps(d, "HEAD", body["url"])
    assert (head.status_code, head.content) == (200, b"")
    # A cookie sent to the apps origin changes nothing, and none comes back.
    cookied = on_apps(d, "GET", body["url"], headers={"Cookie": "runnerd_session=x.y"})
    assert cookied.status_code == 200 and "set-cookie" not in cookied.headers
    # Audited, naming who opened it.
    store = d.store()
    try:
        [entry] = store.audit_entries(workspace_id=d.workspace_id, action="app.open")[-1:]
    finally:
        store.close()
    assert entry.install_id == install["installId"]
    assert entry.actor_user_id is not None and entry.actor_key_id is not None
    # The access log has the requests, never the token.
    logged = (d.data_dir / "serve.log").read_text()
    assert '"GET /f/…/sub/style.css HTTP/1.1" 200' in logged
    assert token not in logged


def test_the_apps_port_serves_pages_only(daemon: Daemon, shipped: dict[str, Any]) -> None:
    d = daemon
    token = frame(d, shipped["install"]["installId"]).json()["token"]
    # The API, the Manage page, MCP, health and metrics: none of them on the apps port.
    listed = "/api/v2/apps?workspaceId=" + d.workspace_id
    for path in ("/api/v2/session", listed, "/", "/login", "/mcp", "/readyz", "/healthz",
                 "/metrics", "/f/", f"/f/{token}"):  # fmt: skip
        answer = on_apps(d, "GET", path, headers={"X-API-Key": d.admin_key})
        assert answer.status_code == 404, (path, answer.text)
        assert "content-security-policy" in answer.headers
    assert d.http.get("/readyz").status_code == 200  # while the daemon's port does
    # The tool's source and file, whatever the path's spelling; the manifest; escapes.
    for path in (
        "tools/echo.py", "tools/echo.tool.yaml", "../tools/echo.py", "..%2Ftools%2Fecho.py",
        "..%2ftools%2fecho.py", "%2e%2e/tools/echo.py", "sub/..%2F..%2Ftools%2Fecho.py",
        "sub/../index.html", "./index.html", "sub%2Fstyle.css", "sub%5Cstyle.css",
        "/etc/passwd", "%2Fetc%2Fpasswd", "agentserve.app.yaml", "../agentserve.app.yaml",
        "index.html%00", "web/index.html", "sub//style.css",
    ):  # fmt: skip
        answer = on_apps(d, "GET", f"/f/{token}/{path}")
        assert answer.status_code == 404, (path, answer.text)
        assert b"def run" not in answer.content
    # Only GET and HEAD: a POST, PUT or DELETE of a real page is 404 too.
    for method in ("POST", "PUT", "DELETE", "OPTIONS"):
        assert on_apps(d, method, f"/f/{token}/index.html").status_code == 404
    # The daemon's own port serves no page.
    assert d.http.get(f"/f/{token}/index.html").status_code == 404


def test_a_bad_forged_or_expired_token_serves_nothing(
    daemon: Daemon, shipped: dict[str, Any]
) -> None:
    d, install_id = daemon, shipped["install"]["installId"]
    token = frame(d, install_id).json()["token"]
    assert on_apps(d, "GET", f"/f/{token}/index.html").status_code == 200
    payload, mac = token.split(".")
    forged_mac = ("A" if mac[0] != "A" else "B") + mac[1:]
    # A token signed with another key, for the same install and person: forged.
    other_key = hashlib.sha256(b"not the daemon's key").digest()
    user_id = base64.urlsafe_b64decode(payload + "==").split(b"\0")[1].decode()
    stranger, _ = issue_frame_token(other_key, install_id, user_id)
    # The daemon's own key (from its secrets key), an hour and more ago: expired.
    vault = Vault.from_settings(None, d.data_dir / "secrets.key")
    expired, _ = issue_frame_token(vault.derive(FRAME_KEY_LABEL), install_id, user_id,
                                   now=time.time() - 3601)  # fmt: skip
    fresh, _ = issue_frame_token(vault.derive(FRAME_KEY_LABEL), install_id, user_id)
    assert on_apps(d, "GET", f"/f/{fresh}/index.html").status_code == 200  # the key is right
    for bad in ("nonsense", f"{payload}.{forged_mac}", f"{payload}x.{mac}", payload,
                f"{token}.{mac}", stranger, expired, "a" * 600):  # fmt: skip
        assert on_apps(d, "GET", f"/f/{bad}/index.html").status_code == 404, bad


def test_switch_and_rollback_change_the_served_page_at_once(
    daemon: Daemon, shipped: dict[str, Any]
) -> None:
    d, install_id = daemon, shipped["install"]["installId"]
    url = frame(d, install_id).json()["url"]
    assert on_apps(d, "GET", url).content == PAGE_V1
    switched = d.call("POST", f"/api/v2/apps/installs/{install_id}/switch", d.admin_key,
                      json={"version": "2"})  # fmt: skip
    assert switched.status_code == 200, switched.text
    page = on_apps(d, "GET", url)  # the same URL, the same token
    assert page.content == PAGE_V2
    assert page.headers["etag"] == f'"{hashlib.sha256(PAGE_V2).hexdigest()}"'
    rolled = d.call("POST", f"/api/v2/apps/installs/{install_id}/rollback", d.admin_key)
    assert rolled.status_code == 200, rolled.text
    assert on_apps(d, "GET", url).content == PAGE_V1


def test_who_may_open_a_frame(daemon: Daemon, shipped: dict[str, Any], tmp_path: Path) -> None:
    d, install_id = daemon, shipped["install"]["installId"]
    member = d.person("member@example.com", role="member")
    viewer = d.person("viewer@example.com", role="viewer")
    no_apps = d.person("noapps@example.com", role="member", apps_access=False)
    assert frame(d, install_id, member).status_code == 201
    envelope(frame(d, install_id, viewer), 403, "INSUFFICIENT_WORKSPACE_ROLE")
    envelope(frame(d, install_id, no_apps), 403, "INSUFFICIENT_WORKSPACE_ROLE")
    ws_key = d.key(kind="workspace", workspace_id=d.workspace_id)
    envelope(frame(d, install_id, ws_key), 403, "WORKSPACE_KEY_NOT_ALLOWED")
    token = d.bound_token(member, "relay")
    envelope(frame(d, install_id, token), 403, "PERSONAL_KEY_REQUIRED")
    envelope(frame(d, "inst_00000000000000000000000000"), 404, "INSTALL_NOT_FOUND")
    outsider = d.person("out@example.com", role="admin", workspace_id=_other_workspace(d))
    envelope(frame(d, install_id, outsider), 404, "INSTALL_NOT_FOUND")
    # An install whose version has no pages.
    plain = d.ship(write_app(tmp_path / "plain", "plain-app", {"echo": ECHO}))
    envelope(frame(d, plain["installId"]), 404, "NO_PAGES")
    # A person who loses Apps access is served nothing more by the frame they opened.
    url = frame(d, install_id, member).json()["url"]
    assert on_apps(d, "GET", url).status_code == 200
    store = d.store()
    try:
        user = store.ensure_user("member@example.com")
        store.set_membership(d.workspace_id, user.id, role="member", apps_access=False)
    finally:
        store.close()
    assert on_apps(d, "GET", url).status_code == 404


def _other_workspace(d: Daemon) -> str:
    store = d.store()
    try:
        return str(store.create_workspace("Elsewhere").id)
    finally:
        store.close()


# --- Refusals at upload: the file named, nothing stored ---------------------------------------


def _refused(d: Daemon, app: Path, slug: str, *files: str) -> list[dict[str, Any]]:
    before = versions(d, slug)
    answer = d.deploy(app)
    problems = envelope(answer, 400, "BUNDLE_REJECTED")["details"]["problems"]
    named = {p["file"] for p in problems}
    assert set(files) <= named, problems
    assert versions(d, slug) == before  # nothing stored
    return list(problems)


def test_tool_files_and_sources_cannot_be_pages(daemon: Daemon, tmp_path: Path) -> None:
    # The pages folder is the tools folder: its tool file and source are refused by name.
    app = pages_app(tmp_path / "a", slug="leaky", pages="./tools")
    (app / "tools" / "index.html").write_text("<p>hi</p>")
    problems = _refused(daemon, app, "leaky", "tools/echo.py", "tools/echo.tool.yaml")
    assert any("pages folder" in p["message"] for p in problems)
    # A tool file in the pages folder, and a file the tools globs name.
    app = pages_app(tmp_path / "b", slug="leaky")
    (app / "web" / "extra.tool.yaml").write_text("name: extra\n")
    (app / "web" / "Other.TOOL.YAML").write_text("name: other\n")
    _refused(daemon, app, "leaky", "web/Other.TOOL.YAML", "web/extra.tool.yaml")
    app = pages_app(tmp_path / "c", slug="leaky")
    manifest = (app / "agentserve.app.yaml").read_text()
    (app / "agentserve.app.yaml").write_text(
        manifest.replace("tools: ./tools/*", "tools:\n  - ./tools/*\n  - ./web/app.js")
    )
    _refused(daemon, app, "leaky", "web/app.js")
    # A copy of the manifest in the pages folder (it names the tools and their secrets).
    app = pages_app(tmp_path / "m", slug="leaky")
    (app / "web" / "agentserve.app.yaml").write_text((app / "agentserve.app.yaml").read_text())
    _refused(daemon, app, "leaky", "web/agentserve.app.yaml")
    # The app folder itself, or a folder outside it, is no pages folder.
    for pages in (".", "./", "../elsewhere", "/etc"):
        app = pages_app(tmp_path / f"d{len(pages)}{pages.count('.')}", slug="leaky", pages=pages)
        problems = _refused(daemon, app, "leaky", "agentserve.app.yaml")
        assert any(p["message"].startswith("pages:") for p in problems), problems
    # An entry the folder does not have.
    app = pages_app(tmp_path / "e", slug="leaky", entry="main.html")
    problems = _refused(daemon, app, "leaky", "agentserve.app.yaml")
    assert any("main.html" in p["message"] for p in problems)


def test_page_limits_name_the_file(daemon: Daemon, tmp_path: Path) -> None:
    app = pages_app(tmp_path / "big", slug="heavy")
    (app / "web" / "big.bin").write_bytes(b"\0" * (MAX_PAGE_BYTES + 1))
    problems = _refused(daemon, app, "heavy", "web/big.bin")
    assert any(f"{MAX_PAGE_BYTES // MB} MB" in p["message"] for p in problems)
    os.remove(app / "web" / "big.bin")
    # Together past the limit, each under its own.
    share = MAX_PAGE_BYTES - 1
    for i in range(MAX_PAGES_BYTES // share + 1):
        (app / "web" / f"part{i}.bin").write_bytes(b"\1" * share)
    problems = _refused(daemon, app, "heavy", "web/")
    assert any(f"{MAX_PAGES_BYTES // MB} MB" in p["message"] for p in problems)
    many = pages_app(tmp_path / "many", slug="heavy")
    for i in range(MAX_PAGE_FILES):
        (many / "web" / f"f{i}.txt").write_text(str(i))
    problems = _refused(daemon, many, "heavy", "web/")
    assert any(f"{MAX_PAGE_FILES:,}" in p["message"] for p in problems)


def test_a_symlink_out_of_the_pages_folder_is_refused_by_name(
    daemon: Daemon, tmp_path: Path
) -> None:
    app = pages_app(tmp_path / "linked", slug="linked")
    (app / "web" / "leak.py").symlink_to(app / "tools" / "echo.py")  # in the app, not pages
    (app / "web" / "inside.js").symlink_to(app / "web" / "app.js")  # inside: fine
    with pytest.raises(BundleRejected) as refused:
        read_app_dir(app)
    assert [p.file for p in refused.value.problems] == ["web/leak.py"]
    # The CLI's deploy reads the folder so: refused before anything is sent.
    result = run_cli("app", "deploy", str(app), env=daemon.client_env())
    assert result.returncode != 0
    assert "web/leak.py" in result.stdout + result.stderr
    assert versions(daemon, "linked") == []
    # The pages folder itself a link (to the tools): refused, naming it.
    other = pages_app(tmp_path / "folder", slug="linked", pages="./site")
    (other / "site").symlink_to(other / "tools")
    with pytest.raises(BundleRejected) as refused:
        read_app_dir(other)
    assert [p.file for p in refused.value.problems] == ["site/"]
    os.remove(app / "web" / "leak.py")
    deployed = daemon.deploy(app)  # the link inside the folder is a page like any other
    assert deployed.status_code == 201, deployed.text
    assert deployed.json()["pages"] == 4


# --- Settings ---------------------------------------------------------------------------------


def test_the_apps_origin_settings() -> None:
    base = {"RUNNERD_PORT": "9000"}
    loaded = load_settings(env=base)
    assert (loaded.apps_listen_port, loaded.apps_base) == (9001, "http://localhost:9001")
    loaded = load_settings(env={**base, "RUNNERD_HOST": "10.0.0.7"})
    assert loaded.apps_base == "http://10.0.0.7:9001"
    loaded = load_settings(env={**base, "RUNNERD_APPS_PORT": "0"})
    assert loaded.apps_base is None
    proxied = {**base, "RUNNERD_PUBLIC_URL": "https://runnerd.example.com",
               "RUNNERD_APPS_URL": "https://apps.example.com/"}  # fmt: skip
    assert load_settings(env=proxied).apps_base == "https://apps.example.com"
    # Framed by the Manage page's origin only, whatever path public_url has.
    behind = load_settings(env={**proxied, "RUNNERD_PUBLIC_URL": "https://r.example.com/x/"})
    assert "frame-ancestors https://r.example.com;" in page_csp(behind)
    for bad in (
        {"RUNNERD_APPS_PORT": "9000"},
        {"RUNNERD_APPS_PORT": "70000"},
        {"RUNNERD_APPS_URL": "https://apps.example.com/pages"},
        {"RUNNERD_APPS_URL": "ftp://apps.example.com"},
        {
            "RUNNERD_PUBLIC_URL": "https://r.example.com",
            "RUNNERD_APPS_URL": "https://r.example.com",
        },
    ):
        with pytest.raises(ConfigError, match="apps_"):
            load_settings(env={**base, **bad})


@pytest.fixture(scope="module")
def pages_off(toolchain_dir: Path) -> Iterator[Any]:
    with in_process(toolchain_dir, apps_port="0") as app:
        yield app


def test_no_frame_when_pages_are_off(pages_off: Any, tmp_path: Path) -> None:
    install = pages_off.ship(pages_app(tmp_path / "off"))
    envelope(frame(pages_off, install["installId"]), 409, "PAGES_OFF")
