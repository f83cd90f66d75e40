"""The app bridge in a real browser (issue 26): the Manage page's Apps launcher opens an
app's pages in a sandboxed frame on the apps origin, and the page's getAppClient() (the JS
package's frame.js, copied into the pages folder as an app with no build step does) runs
the app's own tools through the Manage page (runnerd/web/static/bridge.js).

Playwright drives Debian's chromium (nothing is downloaded) against a live daemon with its
apps listener (tests/daemon.py gives it a free apps_port). The frame cannot read the
Manage page's cookies, cannot reach the API itself, cannot run another app's tools, and
cannot get a tool's source from the apps origin.
"""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
import pytest

from conftest import AppDir, tool_doc
from daemon import Daemon
from test_manage_page import SHOTS, _chromium

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.jail, pytest.mark.browser]

FRAME_SDK = Path(__file__).resolve().parent.parent / "clients" / "js" / "frame.js"
INPUT = {
    "type": "object",
    "properties": {"n": {"type": "integer", "maximum": 10}},
    "additionalProperties": True,
}
TOOLS = {
    "echo": "def run(i):\n    return {'echo': i}\n",
    "boom": "def run(i):\n    raise ValueError('the ledger is closed')\n",
    "slow": "import time\ndef run(i):\n    time.sleep(5)\n    return {}\n",
}
ECHO_SOURCE = TOOLS["echo"]
INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Bridge demo</title>
<script type="module" src="app.js"></script></head>
<body><h1>Bridge demo</h1><button id="run" type="button">Run echo</button>
<pre id="result"></pre></body></html>
"""
# The app's page: the SDK copied next to it, loaded as a module (no bundler).
APP_JS = """import { AppBridgeError, getAppClient } from './runnerd-frame.js';

const client = getAppClient();
window.bridge = client;
window.AppBridgeError = AppBridgeError;
document.getElementById('run').addEventListener('click', async () => {
  const out = document.getElementById('result');
  try {
    const run = await client.runTool('echo', { n: 3 });
    out.textContent = JSON.stringify(run);
  } catch (err) {
    out.textContent = `${err.name} ${err.code}`;
  }
});
window.bridgeReady = true;
"""


def _app(root: Path, slug: str, *, pages: bool) -> Path:
    app = AppDir(root)
    app.write(
        "agentserve.app.yaml",
        f"slug: {slug}\nname: {slug}\ntools: ./tools/*\n" + ("pages: ./web\n" if pages else ""),
    )
    for name, source in TOOLS.items():
        doc = tool_doc(name, input=INPUT, timeoutMs=1000 if name == "slow" else 10000)
        app.tool(name, yaml=doc, source=source)
    if pages:
        app.write("web/index.html", INDEX)
        app.write("web/app.js", APP_JS)
        shutil.copy(FRAME_SDK, root / "web" / "runnerd-frame.js")
    return root


@pytest.fixture(scope="module")
def apps(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two installs: ``bridge-demo`` with pages, ``bridge-other`` with the same tools
    and no pages."""
    demo = daemon.ship(_app(tmp_path_factory.mktemp("demo"), "bridge-demo", pages=True))
    other = daemon.ship(_app(tmp_path_factory.mktemp("other"), "bridge-other", pages=False))
    return {"demo": str(demo["installId"]), "other": str(other["installId"])}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        yield launched
        launched.close()


class Tab:
    """A browser tab signed in to the Manage page, recording the hosts it asks."""

    def __init__(self, browser: Any, daemon: Daemon, key: str) -> None:
        self.daemon = daemon
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.tab = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.tab.on("request", lambda r: self.requests.append(r.url))
        self.tab.on("pageerror", lambda e: self.errors.append(str(e)))
        self.tab.goto(daemon.url + "/")
        self.tab.fill("#api-key", key)
        self.tab.click("button:has-text('Sign in')")
        self.tab.wait_for_selector("h1:has-text('Apps')")

    def open_app(self, slug: str) -> Any:
        """Opens ``slug`` from the launcher; its frame once the page's SDK is loaded."""
        self.tab.click(f"#launcher a:has-text('Open {slug}')")
        element = self.tab.wait_for_selector("iframe.app-frame")
        frame = element.content_frame()
        frame.wait_for_function("() => window.bridgeReady === true")
        return frame

    def close(self, apps_origin: str) -> None:
        hosts = {urlsplit(u).netloc for u in self.requests if not u.startswith("data:")}
        allowed = {urlsplit(self.daemon.url).netloc, urlsplit(apps_origin).netloc}
        assert hosts <= allowed, hosts  # nothing from elsewhere
        assert self.errors == [], self.errors
        self.context.close()


@pytest.fixture
def signed_in(browser: Any, daemon: Daemon) -> Iterator[Callable[..., Tab]]:
    opened: list[Tab] = []

    def make(key: str | None = None) -> Tab:
        tab = Tab(browser, daemon, key or daemon.admin_key)
        opened.append(tab)
        return tab

    yield make
    for tab in opened:
        tab.close(_apps_origin(daemon))


def _apps_origin(daemon: Daemon) -> str:
    return f"http://localhost:{daemon.env['RUNNERD_APPS_PORT']}"


def _runs(daemon: Daemon, install: str) -> list[dict[str, Any]]:
    found = daemon.call("GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key)
    assert found.status_code == 200, found.text
    return list(found.json()["data"])


# What a call from the frame gives: the result, or the AppBridgeError's fields.
CALL = """async ([method, args]) => {
  try {
    return { ok: await window.bridge[method](...args) };
  } catch (err) {
    return { name: err.name, isBridgeError: err instanceof window.AppBridgeError,
             code: err.code, status: err.status, details: err.details, message: err.message };
  }
}"""

# A message of the frame's own making, posted to the Manage page, and its answer.
RAW = """async (message) => new Promise((resolve) => {
  window.addEventListener('message', function once(event) {
    if (event.data && event.data.id === message.id) {
      window.removeEventListener('message', once);
      resolve(event.data);
    }
  });
  window.parent.postMessage(message, '*');
})"""


@pytest.mark.smoke
def test_the_launcher_opens_the_app_whose_page_runs_a_tool_through_the_bridge(
    signed_in: Callable[..., Tab], daemon: Daemon, apps: dict[str, str]
) -> None:
    tab = signed_in()
    launcher = tab.tab.wait_for_selector("#launcher")
    assert "bridge-demo" in launcher.inner_text()
    assert "bridge-other" not in launcher.inner_text()  # no pages: nothing to open
    frame = tab.open_app("bridge-demo")
    iframe = tab.tab.query_selector("iframe.app-frame")
    assert iframe.get_attribute("sandbox") == "allow-scripts allow-forms"
    assert iframe.get_attribute("referrerpolicy") == "no-referrer"
    assert frame.url.startswith(_apps_origin(daemon) + "/f/")
    frame.click("#run")
    frame.wait_for_selector("#result:has-text('succeeded')")
    run = json.loads(frame.inner_text("#result"))
    assert run["status"] == "succeeded" and run["output"] == {"echo": {"n": 3}}
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.tab.screenshot(path=str(SHOTS / "app-frame.png"))
    assert run["runId"].startswith("run_") and run["durationMs"] > 0
    # The run is in the history with surface app, for the person signed in.
    [found] = [r for r in _runs(daemon, apps["demo"]) if r["runId"] == run["runId"]]
    assert found["surface"] == "app"
    tab.tab.goto(f"{daemon.url}/#/runs/{run['runId']}")
    tab.tab.wait_for_selector("dt:has-text('Surface') + dd:has-text('app')")


def test_failed_and_timed_out_runs_resolve_and_refusals_reject_with_their_code(
    signed_in: Callable[..., Tab], daemon: Daemon, apps: dict[str, str]
) -> None:
    frame = signed_in().open_app("bridge-demo")
    failed = frame.evaluate(CALL, ["runTool", ["boom", {}]])["ok"]
    assert failed["status"] == "failed" and "the ledger is closed" in failed["error"]
    slow = frame.evaluate(CALL, ["runTool", ["bridge-demo/slow", {}]])
    assert "ok" in slow, slow
    slow = slow["ok"]
    assert slow["status"] == "timed_out" and slow["output"] is None
    invalid = frame.evaluate(CALL, ["runTool", ["echo", {"n": 11}]])
    assert invalid["name"] == "AppBridgeError" and invalid["isBridgeError"]
    assert (invalid["code"], invalid["status"]) == ("INVALID_INPUT", 400)
    assert invalid["details"]["pointer"] == "/n"
    missing = frame.evaluate(CALL, ["runTool", ["nope", {}]])
    assert (missing["code"], missing["status"]) == ("TOOL_NOT_FOUND", 404)
    # listTools: this app's tools only, with their schemas.
    tools = frame.evaluate(CALL, ["listTools", []])["ok"]
    assert sorted(t["name"] for t in tools) == ["boom", "echo", "slow"]
    assert {t["installId"] for t in tools} == {apps["demo"]}
    echo = next(t for t in tools if t["name"] == "echo")
    assert echo["reference"] == "bridge-demo/echo"
    assert echo["inputSchema"]["properties"]["n"]["maximum"] == 10


def test_a_spent_budget_and_a_viewer_are_refused_through_the_bridge(
    signed_in: Callable[..., Tab], daemon: Daemon, apps: dict[str, str]
) -> None:
    spent = daemon.call(
        "PUT", f"/api/v2/apps/installs/{apps['demo']}/budget", daemon.admin_key,
        json={"monthlyMs": 0},
    )  # fmt: skip
    assert spent.status_code == 200, spent.text
    try:
        frame = signed_in().open_app("bridge-demo")
        broke = frame.evaluate(CALL, ["runTool", ["echo", {}]])
        assert (broke["code"], broke["status"]) == ("budget_exhausted", 403)
        assert broke["isBridgeError"]
    finally:
        unlimited = daemon.call(
            "PUT", f"/api/v2/apps/installs/{apps['demo']}/budget", daemon.admin_key,
            json={"monthlyMs": None},
        )  # fmt: skip
        assert unlimited.status_code == 200, unlimited.text
    # A viewer may not run tools: the launcher offers none, and the frame route refuses.
    viewer = signed_in(daemon.person("bridge-viewer@example.com", role="viewer"))
    assert viewer.tab.query_selector("#launcher") is None
    viewer.tab.goto(f"{daemon.url}/#/apps/{apps['demo']}")
    viewer.tab.wait_for_selector(".error")
    assert viewer.tab.query_selector("iframe") is None


def test_the_frame_cannot_read_cookies_reach_the_api_or_run_another_apps_tools(
    signed_in: Callable[..., Tab], daemon: Daemon, apps: dict[str, str]
) -> None:
    tab = signed_in()
    frame = tab.open_app("bridge-demo")
    [session] = [c for c in tab.context.cookies() if c["name"] == "runnerd_session"]
    # Its origin is opaque: no cookies of any origin, no storage.
    cookie = frame.evaluate(
        "() => { try { return document.cookie; } catch (e) { return 'threw ' + e.name; } }"
    )
    assert cookie in ("", "threw SecurityError") and session["value"] not in cookie
    assert frame.evaluate("() => window.origin") == "null"
    storage = frame.evaluate(
        "() => { try { return String(localStorage.length); } catch (e) { return e.name; } }"
    )
    assert storage == "SecurityError"
    # The Manage page's document is another origin's: out of reach.
    parent = frame.evaluate(
        "() => { try { return window.parent.document.cookie; } catch (e) { return e.name; } }"
    )
    assert parent == "SecurityError"
    # No request leaves the frame (connect-src 'none'): not the API, not the apps origin.
    for url in (f"{daemon.url}/api/v2/session", f"{_apps_origin(daemon)}/f/x/index.html"):
        fetched = frame.evaluate(
            """async (url) => { try { const r = await fetch(url, {credentials: 'include'});
                 return 'status ' + r.status; } catch (e) { return e.name; } }""",
            url,
        )
        assert fetched == "TypeError", (url, fetched)
    before = _runs(daemon, apps["other"])
    # Another app's tool, by reference: refused by the page, nothing runs.
    other = frame.evaluate(CALL, ["runTool", ["bridge-other/echo", {"n": 1}]])
    assert (other["code"], other["status"]) == ("OTHER_APP_REFUSED", 403)
    # A message of its own naming the other install, or its app: refused the same way.
    for n, params in enumerate(
        [
            {"name": "echo", "input": {}, "installId": apps["other"]},
            {"name": "echo", "input": {}, "app": "bridge-other"},
        ]
    ):
        answer = frame.evaluate(
            RAW, {"runnerd": 1, "id": 9000 + n, "method": "runTool", "params": params}
        )
        assert answer["error"]["code"] == "OTHER_APP_REFUSED", answer
    listed = frame.evaluate(
        RAW,
        {"runnerd": 1, "id": 9100, "method": "listTools", "params": {"installId": apps["other"]}},
    )
    assert listed["error"]["code"] == "OTHER_APP_REFUSED"
    bad = frame.evaluate(RAW, {"runnerd": 1, "id": 9200, "method": "deleteApp", "params": {}})
    assert bad["error"]["code"] == "BAD_MESSAGE"
    # A name a URL would read as another path ('..', '.', an encoded slash): no request.
    for n, name in enumerate(["..", ".", "bridge-demo/..", "echo%2f..", "Echo", "echo/"]):
        answer = frame.evaluate(
            RAW, {"runnerd": 1, "id": 9300 + n, "method": "runTool",
                  "params": {"name": name, "input": {}}},
        )  # fmt: skip
        assert answer["error"]["code"] in ("BAD_MESSAGE", "OTHER_APP_REFUSED"), (name, answer)
    assert _runs(daemon, apps["other"]) == before
    # The frame's own token does not prove a frame of another install to the API.
    token = urlsplit(frame.url).path.split("/")[2]
    forged = daemon.call(
        "POST", f"/api/v2/apps/installs/{apps['other']}/tools/echo/run", daemon.admin_key,
        json={"input": {}}, headers={"X-Runnerd-Frame": token},
    )  # fmt: skip
    assert forged.status_code == 403, forged.text
    assert _runs(daemon, apps["other"]) == before


def test_a_page_opened_on_its_own_is_refused_and_could_set_no_cookie(
    signed_in: Callable[..., Tab], daemon: Daemon, apps: dict[str, str]
) -> None:
    """A link to a frame's page, opened as a window of its own (where a page would have a
    real origin, and could toss a session cookie onto the Manage page's host): refused;
    and a page served anyway (a client sending no Sec-Fetch-Dest) is sandboxed by its
    CSP, so its document has an opaque origin and no cookie jar."""
    tab = signed_in()
    frame = tab.open_app("bridge-demo")
    url = frame.url
    [session] = [c for c in tab.context.cookies() if c["name"] == "runnerd_session"]
    window = tab.context.new_page()
    opened = window.goto(url)
    assert opened is not None and opened.status == 403
    assert "opens in its frame on the Manage page" in window.inner_text("body")
    window.close()
    # Served without Sec-Fetch-Dest, the page's CSP still sandboxes it.
    served = httpx.get(url, timeout=10)
    assert served.status_code == 200, served.text
    assert "sandbox allow-scripts allow-forms" in served.headers["content-security-policy"]
    # The session cookie is the Manage page's own still, and the frame set none.
    [after] = [c for c in tab.context.cookies() if c["name"] == "runnerd_session"]
    assert after["value"] == session["value"]
    tossed = frame.evaluate(
        "() => { try { document.cookie = 'runnerd_session=tossed; path=/';"
        " return document.cookie; } catch (e) { return 'threw ' + e.name; } }"
    )
    assert "tossed" not in tossed
    assert [c["value"] for c in tab.context.cookies() if c["name"] == "runnerd_session"] == [
        session["value"]
    ]


def test_another_window_cannot_use_the_bridge(
    signed_in: Callable[..., Tab], daemon: Daemon, apps: dict[str, str]
) -> None:
    """A message to the Manage page from anything but the frame it opened (the page
    itself here, or a frame it did not open) gets no answer and runs nothing."""
    tab = signed_in()
    tab.open_app("bridge-demo")
    before = _runs(daemon, apps["demo"])
    answered = tab.tab.evaluate(
        """async () => new Promise((resolve) => {
          window.addEventListener('message', (e) => {
            const d = e.data;
            if (d && d.id === 77 && ('result' in d || 'error' in d)) resolve('answered');
          });
          const params = {name: 'echo', input: {}};
          window.postMessage({runnerd: 1, id: 77, method: 'runTool', params}, '*');
          setTimeout(() => resolve('no answer'), 1500);
        })"""
    )
    assert answered == "no answer"
    assert _runs(daemon, apps["demo"]) == before


def test_no_tool_source_is_served_on_the_apps_origin(
    signed_in: Callable[..., Tab], daemon: Daemon, apps: dict[str, str]
) -> None:
    frame = signed_in().open_app("bridge-demo")
    base = frame.url.rsplit("/", 1)[0]  # <apps origin>/f/<token>
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{base}/app.js").status_code == 200  # its pages are served
        for path in ("tools/echo.py", "tools/echo.tool.yaml", "../tools/echo.py",
                     "agentserve.app.yaml", "%2e%2e/tools/echo.py"):  # fmt: skip
            answer = client.get(f"{base}/{path}")
            assert answer.status_code == 404, (path, answer.status_code)
            assert ECHO_SOURCE not in answer.text
        assert client.get(f"{_apps_origin(daemon)}/api/v2/session").status_code == 404


def test_the_manage_page_may_frame_the_apps_origin_only(daemon: Daemon) -> None:
    page = daemon.http.get("/")
    csp = page.headers["content-security-policy"]
    assert f"frame-src {_apps_origin(daemon)}" in csp
    assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
    api = daemon.http.get("/healthz")
    assert "frame-src" not in api.headers["content-security-policy"]


class _Counting(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        body = b"<!doctype html><title>elsewhere</title><p>elsewhere</p>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_frame_cannot_navigate_itself_to_another_site(
    signed_in: Callable[..., Tab], daemon: Daemon, apps: dict[str, str]
) -> None:
    """A page that took the frame elsewhere would be that frame's window to the bridge:
    the Manage page's frame-src allows the apps origin only, so the navigation is
    blocked, and the other site gets no request."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        elsewhere = f"http://127.0.0.1:{server.server_address[1]}/took-over"
        tab = signed_in()
        frame = tab.open_app("bridge-demo")
        frame.evaluate("(url) => { window.location.href = url; }", elsewhere)
        tab.tab.wait_for_timeout(1500)
        assert _Counting.hits == []
        frame = tab.tab.query_selector("iframe.app-frame").content_frame()
        assert not frame.url.startswith(elsewhere), frame.url
    finally:
        server.shutdown()
        server.server_close()


def test_a_frame_token_near_its_end_is_renewed_before_a_call(
    signed_in: Callable[..., Tab], daemon: Daemon, apps: dict[str, str]
) -> None:
    """The page renews the frame's token when it has less than a minute left: here the
    first frame answer is made to say so (its expiresAt in 30 s), and the run still goes
    through, with a second, fresh token."""
    tab = signed_in()
    opened: list[str] = []

    def near_its_end(route: Any) -> None:
        answer = route.fetch()
        body = answer.json()
        opened.append(body["token"])
        if len(opened) == 1:
            soon = datetime.now(UTC) + timedelta(seconds=30)
            body["expiresAt"] = soon.isoformat().replace("+00:00", "Z")
        route.fulfill(response=answer, json=body)

    tab.tab.route(f"**/api/v2/apps/installs/{apps['demo']}/frame", near_its_end)
    sent: list[str | None] = []
    tab.tab.on(
        "request",
        lambda r: (
            sent.append(r.headers.get("x-runnerd-frame"))
            if r.method == "POST" and r.url.endswith("/tools/echo/run")
            else None
        ),
    )
    frame = tab.open_app("bridge-demo")
    run = frame.evaluate(CALL, ["runTool", ["echo", {"n": 1}]])
    assert run["ok"]["status"] == "succeeded", run
    assert len(opened) == 2 and opened[0] != opened[1]
    assert sent == [opened[1]]  # the run went with the fresh token
    [found] = [r for r in _runs(daemon, apps["demo"]) if r["runId"] == run["ok"]["runId"]]
    assert found["surface"] == "app"
