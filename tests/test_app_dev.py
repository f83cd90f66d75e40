"""``runnerd app dev DIR`` (issue 26): the app's pages from a local folder in the Manage
page's frame, its tools as installed in the workspace.

A live daemon, the real CLI in its own process, and Debian's chromium through Playwright:
a page changed on disk shows in the frame without a deploy, runTool from the dev page
runs the installed version's tool (surface ``app``), and nobody else sees the pages.
"""

from __future__ import annotations

import base64
import hashlib
import json
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import AppDir, tool_doc
from daemon import Daemon, running_daemon, serving_again
from inproc import InProcess
from runnerd import limits
from runnerd.ids import stamp
from test_app_bridge import (  # noqa: F401 - fixtures, as pytest finds them
    INPUT,
    TOOLS,
    Tab,
    _app,
    _apps_origin,
    _runs,
    browser,
    signed_in,
)  # fmt: skip

pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.jail, pytest.mark.browser]

LOCAL_INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Dev demo</title>
<script type="module" src="app.js"></script></head>
<body><h1>{title}</h1><button id="run" type="button">Run echo</button>
<pre id="result"></pre></body></html>
"""


class Cli:
    """``runnerd app dev DIR --json`` in its own process; its JSON lines as they come."""

    def __init__(self, daemon: Daemon, folder: Path, key: str | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runnerd", "app", "dev", str(folder), "--json"],
            env=daemon.client_env(key),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def event(self, within_s: float = 20) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if line:
                    found: dict[str, Any] = json.loads(line)
                    return found
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise AssertionError(f"runnerd app dev ended ({self.proc.returncode}): {err}")
        raise AssertionError("no event from runnerd app dev")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def installed(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``dev-demo`` deployed with its pages (the bridge demo's, "Bridge demo"), and a
    local folder of it whose page and echo tool differ."""
    install = daemon.ship(_app(tmp_path_factory.mktemp("deployed"), "dev-demo", pages=True))
    local = _app(tmp_path_factory.mktemp("local"), "dev-demo", pages=True)
    (local / "web" / "index.html").write_text(LOCAL_INDEX.format(title="Local one"))
    (local / "tools" / "echo.py").write_text("def run(i):\n    return {'local': True}\n")
    return {"installId": str(install["installId"]), "version": str(install["version"]),
            "local": str(local)}  # fmt: skip


@pytest.fixture
def cli(daemon: Daemon) -> Iterator[Callable[..., Cli]]:
    started: list[Cli] = []

    def start(folder: str | Path, key: str | None = None) -> Cli:
        found = Cli(daemon, Path(folder), key)
        started.append(found)
        return found

    yield start
    for found in started:
        found.stop()


def _heading(tab: Tab, text: str, within_ms: float = 15000) -> None:
    tab.tab.frame_locator("iframe.app-frame").locator(f"h1:has-text('{text}')").wait_for(
        timeout=within_ms
    )


def _dev_pages(daemon: Daemon, install_id: str, key: str | None = None) -> httpx.Response:
    return daemon.call(
        "GET", f"/api/v2/apps/installs/{install_id}/dev-pages", key or daemon.admin_key
    )


@pytest.mark.smoke
def test_dev_pages_show_in_the_frame_reload_on_change_and_run_the_installed_tools(
    signed_in: Callable[..., Tab],  # noqa: F811 - the fixture of test_app_bridge
    cli: Callable[..., Cli],
    daemon: Daemon,
    installed: dict[str, str],
) -> None:
    install_id = installed["installId"]
    dev = cli(installed["local"])
    ready = dev.event()
    assert ready["event"] == "ready" and ready["installId"] == install_id
    assert ready["version"] == installed["version"]
    assert ready["manageUrl"] == f"{daemon.url}/#/apps/{install_id}?dev=1"
    tab = signed_in()
    tab.tab.goto(ready["manageUrl"])
    _heading(tab, "Local one")
    assert "shown to you only" in tab.tab.inner_text("#dev-note")
    element = tab.tab.query_selector("iframe.app-frame")
    assert element.get_attribute("sandbox") == "allow-scripts allow-forms"
    frame = element.content_frame()
    assert frame.url.startswith(_apps_origin(daemon) + "/d/")
    frame.wait_for_function("() => window.bridgeReady === true")
    # The page is the local one; the tool that runs is the installed echo, not the local.
    frame.click("#run")
    frame.wait_for_selector("#result:has-text('succeeded')")
    run = json.loads(frame.inner_text("#result"))
    assert run["output"] == {"echo": {"n": 3}}
    [found] = [r for r in _runs(daemon, install_id) if r["runId"] == run["runId"]]
    assert found["surface"] == "app"
    # A change on disk shows in the open frame, with no deploy.
    (Path(installed["local"]) / "web" / "index.html").write_text(
        LOCAL_INDEX.format(title="Local two")
    )
    assert dev.event()["event"] == "reloaded"
    _heading(tab, "Local two")
    frame = tab.tab.query_selector("iframe.app-frame").content_frame()
    frame.wait_for_function("() => window.bridgeReady === true")
    again = frame.evaluate(
        "async () => (await window.bridge.runTool('echo', { n: 2 })).output"
    )  # the reloaded page still has the bridge
    assert again == {"echo": {"n": 2}}
    # The install itself still serves its deployed pages.
    tab.tab.goto(f"{daemon.url}/#/apps/{install_id}")
    _heading(tab, "Bridge demo")
    assert tab.tab.query_selector("#dev-note") is None
    # Ctrl-C drops them from the store.
    assert dev.stop() == 0
    assert _dev_pages(daemon, install_id).status_code == 404


def test_another_person_does_not_see_the_dev_pages(
    signed_in: Callable[..., Tab],  # noqa: F811 - the fixture of test_app_bridge
    cli: Callable[..., Cli],
    daemon: Daemon,
    installed: dict[str, str],
) -> None:
    install_id = installed["installId"]
    dev = cli(installed["local"])
    dev.event()
    mine = _dev_pages(daemon, install_id)
    assert mine.status_code == 200, mine.text
    with httpx.Client(timeout=10) as client:
        page = client.get(mine.json()["url"])
        assert page.status_code == 200 and "Local" in page.text
        deployed = client.get(mine.json()["url"].replace("/d/", "/f/", 1))
        assert "Bridge demo" in deployed.text  # the same token, the store's pages
        # The same CSP and headers as a deployed page.
        for name in ("content-security-policy", "x-content-type-options", "referrer-policy"):
            assert page.headers[name] == deployed.headers[name]
        assert "connect-src 'none'" in page.headers["content-security-policy"]
        assert "set-cookie" not in page.headers
        # Another member: none of them through the API, nor with their own frame token.
        other = daemon.person("dev-other@example.com")
        theirs = _dev_pages(daemon, install_id, other)
        assert theirs.status_code == 404 and theirs.json()["error"]["details"]["code"] == (
            "NO_DEV_PAGES"
        )
        framed = daemon.call("POST", f"/api/v2/apps/installs/{install_id}/frame", other)
        assert framed.status_code == 201, framed.text
        token = framed.json()["token"]
        for path in ("index.html", "app.js", ""):
            answer = client.get(f"{_apps_origin(daemon)}/d/{token}/{path}")
            assert answer.status_code == 404, (path, answer.status_code)
    tab = signed_in(other)
    tab.tab.goto(f"{daemon.url}/#/apps/{install_id}?dev=1")
    tab.tab.wait_for_selector(".error")
    assert tab.tab.query_selector("iframe") is None
    assert dev.stop() == 0


def test_the_cli_says_when_the_app_is_not_installed(daemon: Daemon, tmp_path: Path) -> None:
    folder = _app(tmp_path, "dev-nowhere", pages=True)
    done = subprocess.run(
        [sys.executable, "-m", "runnerd", "app", "dev", str(folder)],
        env=daemon.client_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "dev-nowhere is not installed in the workspace" in done.stderr
    assert "runnerd app deploy" in done.stderr


def test_the_cli_sends_no_tool_file_and_the_daemon_takes_none(
    cli: Callable[..., Cli], daemon: Daemon, installed: dict[str, str], tmp_path: Path
) -> None:
    # A pages folder with a tool's file in it: named, nothing sent, the folder watched.
    app = AppDir(tmp_path)
    app.write(
        "agentserve.app.yaml", "slug: dev-demo\nname: dev-demo\ntools: ./web/*\npages: ./web\n"
    )
    app.write("web/echo.tool.yaml", tool_doc("echo", input=INPUT))
    app.write("web/echo.py", TOOLS["echo"])
    app.write("web/index.html", LOCAL_INDEX.format(title="never"))
    dev = cli(tmp_path)
    refused = dev.event()
    assert refused["event"] == "problems", refused
    assert "web/echo.py" in [p["file"] for p in refused["problems"]], refused
    assert _dev_pages(daemon, installed["installId"]).status_code == 404
    assert dev.stop() == 0
    # The daemon refuses a tool file, a manifest, a path out of the folder, a missing entry.
    path = f"/api/v2/apps/installs/{installed['installId']}/dev-pages"
    html = base64.b64encode(b"<p>x</p>").decode()
    for files, entry in [
        ({"index.html": html, "echo.tool.yaml": html}, "index.html"),
        ({"index.html": html, "agentserve.app.yaml": html}, "index.html"),
        ({"index.html": html, "../tools/echo.py": html}, "index.html"),
        ({"index.html": html, "a//b.js": html}, "index.html"),
        ({"index.html": "not base64!"}, "index.html"),
        ({"index.html": html}, "main.html"),
    ]:
        refused = daemon.call("PUT", path, daemon.admin_key, json={"files": files, "entry": entry})
        assert refused.status_code == 400, (files, refused.text)
        assert refused.json()["error"]["details"]["code"] == "INVALID_BODY"
    assert _dev_pages(daemon, installed["installId"]).status_code == 404
    # A viewer may not hold any.
    viewer = daemon.person("dev-viewer@example.com", role="viewer")
    put = daemon.call("PUT", path, viewer, json={"files": {"index.html": html}})
    assert put.status_code == 403, put.text


def test_dev_pages_work_for_an_install_with_no_pages_yet(
    daemon: Daemon, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Pages being made for an app whose installed version has none: the frame opens on
    the dev pages (the deployed frame has nothing to open), and its token proves `app`."""
    install = daemon.ship(_app(tmp_path_factory.mktemp("bare"), "dev-bare", pages=False))
    install_id = str(install["installId"])
    opened = daemon.call("POST", f"/api/v2/apps/installs/{install_id}/frame", daemon.admin_key)
    assert opened.status_code == 404 and opened.json()["error"]["details"]["code"] == "NO_PAGES"
    html = base64.b64encode(LOCAL_INDEX.format(title="First page").encode()).decode()
    put = daemon.call(
        "PUT", f"/api/v2/apps/installs/{install_id}/dev-pages", daemon.admin_key,
        json={"files": {"index.html": html}},
    )  # fmt: skip
    assert put.status_code == 200, put.text
    held = put.json()
    assert held["revision"] == 1 and held["files"] == 1
    with httpx.Client(timeout=10) as client:
        page = client.get(held["url"])
        assert page.status_code == 200 and "First page" in page.text
        assert page.headers["content-type"] == "text/html; charset=utf-8"
    run = daemon.call(
        "POST", f"/api/v2/apps/installs/{install_id}/tools/echo/run", daemon.admin_key,
        json={"input": {"n": 1}}, headers={"X-Runnerd-Frame": held["token"]},
    )  # fmt: skip
    assert run.status_code == 403  # a frame proves `app` with the session only, not a key
    again = daemon.call(
        "PUT", f"/api/v2/apps/installs/{install_id}/dev-pages", daemon.admin_key,
        json={"files": {"index.html": html}},
    )  # fmt: skip
    assert again.json()["revision"] == 2
    gone = daemon.call("DELETE", f"/api/v2/apps/installs/{install_id}/dev-pages", daemon.admin_key)
    assert gone.json() == {"name": "dev-pages", "deleted": True}
    with httpx.Client(timeout=10) as client:
        assert client.get(held["url"]).status_code == 404


def test_the_store_holds_dev_pages_an_hour_and_within_its_limit(
    app_daemon: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's app in this process, its limits made small: past the store's bytes
    (every node's dev pages together) the oldest person's dev pages go, and an hour
    (here: none) after the last PUT, all go."""
    install = app_daemon.ship(_app(tmp_path, "dev-limits", pages=False))
    path = f"/api/v2/apps/installs/{install['installId']}/dev-pages"
    page = base64.b64encode(b"x" * 1000).decode()
    first, second = app_daemon.admin_key, app_daemon.person("dev-second@example.com")
    monkeypatch.setattr(limits, "DEV_PAGES_MAX_BYTES", 1500)
    for key in (first, second):
        put = app_daemon.call("PUT", path, key, json={"files": {"index.html": page}})
        assert put.status_code == 200, put.text
    assert app_daemon.call("GET", path, first).status_code == 404  # the older one went
    assert app_daemon.call("GET", path, second).status_code == 200
    monkeypatch.setattr(limits, "DEV_PAGES_TTL_S", 0)
    assert app_daemon.call("GET", path, second).status_code == 404


def _put(runnerd: Any, install_id: str, key: str, title: str) -> httpx.Response:
    html = base64.b64encode(LOCAL_INDEX.format(title=title).encode()).decode()
    js = base64.b64encode(f"// {title}\n".encode()).decode()
    return runnerd.call(
        "PUT", f"/api/v2/apps/installs/{install_id}/dev-pages", key,
        json={"files": {"index.html": html, "app.js": js}},
    )  # fmt: skip


def _held_rows(runnerd: Any, install_id: str) -> list[tuple[str, int]]:
    """(user id, files) of each person's dev pages of the install in the store."""
    store = runnerd.store()
    try:
        rows = store.db.execute(
            """SELECT d.user_id, (SELECT count(*) FROM dev_page_files f
                 WHERE f.install_id = d.install_id AND f.user_id = d.user_id)
               FROM dev_pages d WHERE d.install_id = ? ORDER BY d.user_id""",
            [install_id],
        ).fetchall()
        return [(str(r[0]), int(r[1])) for r in rows]
    finally:
        store.close()


def test_each_persons_token_serves_their_own_dev_pages_only(
    daemon: Daemon, installed: dict[str, str]
) -> None:
    """Two people hold dev pages of one install at once: each frame token (and each GET)
    finds its own person's, never the other's."""
    install_id = installed["installId"]
    mine, theirs = daemon.admin_key, daemon.person("dev-both@example.com")
    assert _put(daemon, install_id, mine, "Mine").status_code == 200
    assert _put(daemon, install_id, theirs, "Theirs").status_code == 200
    try:
        with httpx.Client(timeout=10) as client:
            for key, title, other in ((mine, "Mine", "Theirs"), (theirs, "Theirs", "Mine")):
                info = _dev_pages(daemon, install_id, key).json()
                page = client.get(info["url"])
                assert page.status_code == 200 and title in page.text and other not in page.text
                script = client.get(f"{_apps_origin(daemon)}/d/{info['token']}/app.js")
                assert script.text == f"// {title}\n"
                sha256 = hashlib.sha256(f"// {title}\n".encode()).hexdigest()
                assert script.headers["etag"] == f'"{sha256}"'
                again = client.get(info["url"], headers={"If-None-Match": page.headers["etag"]})
                assert again.status_code == 304  # the same ETag as a deployed page's
    finally:
        for key in (mine, theirs):
            daemon.call("DELETE", f"/api/v2/apps/installs/{install_id}/dev-pages", key)


def test_delete_removes_the_dev_pages_from_the_store(
    daemon: Daemon, installed: dict[str, str]
) -> None:
    install_id = installed["installId"]
    key = daemon.person("dev-delete@example.com")
    held = _put(daemon, install_id, key, "To delete").json()
    assert len(_held_rows(daemon, install_id)) == 1
    path = f"/api/v2/apps/installs/{install_id}/dev-pages"
    assert daemon.call("DELETE", path, key).json() == {"name": "dev-pages", "deleted": True}
    assert _held_rows(daemon, install_id) == []  # the row and its files
    assert _dev_pages(daemon, install_id, key).status_code == 404
    with httpx.Client(timeout=10) as client:
        assert client.get(held["url"]).status_code == 404
    assert daemon.call("DELETE", path, key).json() == {"name": "dev-pages", "deleted": False}


def test_a_person_taken_out_of_the_workspace_leaves_no_dev_pages(
    daemon: Daemon, installed: dict[str, str]
) -> None:
    install_id = installed["installId"]
    key = daemon.person("dev-leaver@example.com")
    assert _put(daemon, install_id, key, "Leaving").status_code == 200
    assert len(_held_rows(daemon, install_id)) == 1
    store = daemon.store()
    try:
        user = store.ensure_user("dev-leaver@example.com")
        assert store.remove_member(daemon.workspace_id, user.id)
    finally:
        store.close()
    assert _held_rows(daemon, install_id) == []


def test_dev_pages_expire_an_hour_after_the_last_put_by_the_databases_clock(
    daemon: Daemon, installed: dict[str, str]
) -> None:
    """Their last PUT moved back past DEV_PAGES_TTL_S in the store (as the database's
    clock would see it an hour on): no node serves them, and the next PUT drops them
    (anyone's PUT: here another person's), and starts again at revision 1."""
    install_id = installed["installId"]
    key, later = daemon.person("dev-ttl@example.com"), daemon.person("dev-ttl2@example.com")
    held = _put(daemon, install_id, key, "Stale soon").json()
    assert _put(daemon, install_id, key, "Stale soon").json()["revision"] == 2
    store = daemon.store()
    try:
        past = stamp(store.db_now() - timedelta(seconds=limits.DEV_PAGES_TTL_S + 1))
        with store.db.write():
            store.db.execute(
                "UPDATE dev_pages SET updated_at = ? WHERE install_id = ?", [past, install_id]
            )
        [(user_id, _)] = _held_rows(daemon, install_id)
    finally:
        store.close()
    assert _dev_pages(daemon, install_id, key).status_code == 404
    with httpx.Client(timeout=10) as client:
        assert client.get(held["url"]).status_code == 404
    assert _put(daemon, install_id, later, "Someone else").status_code == 200
    assert user_id not in [u for u, _ in _held_rows(daemon, install_id)]  # gone from the store
    assert _put(daemon, install_id, key, "Fresh").json()["revision"] == 1
    for person in (key, later):
        daemon.call("DELETE", f"/api/v2/apps/installs/{install_id}/dev-pages", person)


def test_dev_pages_outlive_a_restart_of_the_node(toolchain_dir: Path, tmp_path: Path) -> None:
    """They are in the store: a node restarted within the hour serves them on (the
    revision goes on counting)."""
    with running_daemon(toolchain_dir) as node:
        install_id = str(node.ship(_app(tmp_path, "dev-restart", pages=False))["installId"])
        held = _put(node, install_id, node.admin_key, "Before the restart").json()
        node.proc.terminate()
        node.proc.wait(timeout=30)
        with serving_again(node) as again:
            assert again.poll() is None
            info = _dev_pages(node, install_id)
            assert info.status_code == 200, info.text
            assert info.json()["revision"] == held["revision"] == 1
            with httpx.Client(timeout=10) as client:
                page = client.get(info.json()["url"])
                assert page.status_code == 200 and "Before the restart" in page.text
            assert _put(node, install_id, node.admin_key, "After").json()["revision"] == 2
