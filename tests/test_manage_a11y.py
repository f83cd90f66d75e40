"""The Manage page's accessibility: axe-core (tests/axe, installed by scripts/setup into
.cache/axe; a test fixture, never served) on every screen, at 1280x800 and 390x844, in
the light and the dark colour scheme, finds nothing; and the dark scheme is one.

axe runs inside the page as the page is (its own CSP in force: Playwright's evaluate is
not a script element); the frame of an app's pages is the app's own and left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import AppDir, tool_doc
from daemon import Daemon
from test_manage_page import EXAMPLE, GOOD, _chromium, _copy_with_version

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.jail, pytest.mark.browser]

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core"
VIEWPORTS = {"wide": {"width": 1280, "height": 800}, "narrow": {"width": 390, "height": 844}}

WRITER = "def run(input):\n    return {'written': input['amount']}\n"


@pytest.fixture(scope="module")
def axe_source() -> str:
    found = AXE / "axe.min.js"
    if not found.is_file():
        pytest.fail("axe-core is missing: scripts/setup installs it into .cache/axe")
    return found.read_text()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def world(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An install with a run, a secret, a draft version, and a write call waiting."""
    install = str(daemon.ship(EXAMPLE)["installId"])
    daemon.run(install, "score_offer", {k: int(v) for k, v in GOOD.items()} | {"tier": "standard"})
    daemon.call(
        "PUT",
        f"/api/v2/apps/installs/{install}/secrets/CRM_TOKEN",
        daemon.admin_key,
        json={"value": "tok-a11y"},
    )
    base = tmp_path_factory.mktemp("a11y")
    assert daemon.deploy(_copy_with_version(EXAMPLE, base / "v2", "2")).status_code == 201
    app = AppDir(base / "writer")
    app.write("agentserve.app.yaml", "slug: a11y-writer\nname: Writer\ntools: ./tools/*\n")
    schema = {
        "type": "object",
        "properties": {
            "amount": {"type": "integer", "minimum": 1},
            "kind": {"enum": ["credit", "debit"]},
        },
        "required": ["amount", "kind"],
    }
    app.tool("post_entry", yaml=tool_doc("post_entry", effect="write", input=schema), source=WRITER)
    writer = str(daemon.ship(app.root)["installId"])
    asker = daemon.person("a11y-asker@example.com", role="member")
    held = daemon.run(writer, "post_entry", {"amount": 3, "kind": "debit"}, key=asker,
                      surface="relay")  # fmt: skip
    assert held.status_code == 202, held.text
    runs = daemon.call("GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key).json()
    return {"install": install, "writer": writer, "run": runs["data"][0]["runId"]}


def _violations(tab: Any, axe_source: str) -> list[str]:
    if not tab.evaluate("() => typeof window.axe === 'object'"):
        tab.evaluate(axe_source)
    found = tab.evaluate(
        """async () => {
            const r = await axe.run(document, {resultTypes: ['violations'],
              runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa',
                'wcag22aa', 'best-practice']}});
            return r.violations.map(v => ({id: v.id, help: v.help,
              nodes: v.nodes.slice(0, 3).map(n => n.target.join(' ') + ': ' + n.failureSummary)}));
        }"""
    )
    return [f"{v['id']} ({v['help']}): {json.dumps(v['nodes'])}" for v in found]


# Each screen: where it is, and what shows it is drawn.
def _screens(world: dict[str, str]) -> list[tuple[str, str, str]]:
    install, writer = world["install"], world["writer"]
    return [
        ("apps", "/#/", "td:has-text('draft')"),
        ("install", f"/#/installs/{install}", "#secrets code:has-text('CRM_TOKEN')"),
        ("app frame", f"/#/apps/{install}", "iframe.app-frame"),
        ("tool", f"/#/installs/{install}/tools/score_offer", "form.schema-form"),
        ("write tool", f"/#/installs/{writer}/tools/post_entry", "form.schema-form"),
        ("runs", f"/#/installs/{install}/runs", "form.filters"),
        ("run", f"/#/runs/{world['run']}", "dl.facts"),
        ("approvals", "/#/approvals", "button:has-text('Approve')"),
        ("approved", "/#/approvals?status=approved", "h1:has-text('Approvals')"),
        ("audit", "/#/audit", "form.filters"),
        ("ledger", "/#/ledger", "a:has-text('Download CSV')"),
        ("people", "/#/people", "button:has-text('Create key')"),
        ("diff", "/#/apps/deal-desk/diff?from=1&to=2", "section.diff"),
    ]


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("viewport", sorted(VIEWPORTS))
def test_axe_finds_nothing_on_any_screen(
    browser: Any,
    daemon: Daemon,
    world: dict[str, str],
    axe_source: str,
    viewport: str,
    scheme: str,
) -> None:
    context = browser.new_context(viewport=VIEWPORTS[viewport], color_scheme=scheme)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    found: dict[str, list[str]] = {}
    try:
        tab.goto(daemon.url + "/")
        tab.wait_for_selector("#api-key")
        found["sign-in"] = _violations(tab, axe_source)
        tab.fill("#api-key", daemon.admin_key)
        tab.click("button:has-text('Sign in')")
        tab.wait_for_selector("h1:has-text('Apps')")
        for name, path, ready in _screens(world):
            tab.goto(daemon.url + path)
            tab.wait_for_selector(ready)
            found[name] = _violations(tab, axe_source)
        # A dialog open over a screen, and a refused test run's inline error.
        tab.goto(daemon.url + "/#/")
        tab.click("button[data-action=publish]")
        tab.wait_for_selector("dialog.confirm")
        found["publish dialog"] = _violations(tab, axe_source)
        tab.click("dialog.confirm button:has-text('Cancel')")
        tab.goto(daemon.url + f"/#/installs/{world['install']}/tools/score_offer")
        _fill_page(tab, {**GOOD, "discountPct": "150"})
        tab.click("form.schema-form button[type=submit]")
        tab.wait_for_selector(".field-error:not(:empty)")
        found["refused input"] = _violations(tab, axe_source)
    finally:
        context.close()
    assert errors == []
    assert {k: v for k, v in found.items() if v} == {}


def _fill_page(tab: Any, values: dict[str, str]) -> None:
    tab.wait_for_selector("form.schema-form")
    for name, value in values.items():
        tab.fill(f"form.schema-form [name={name}]", value)
    tab.select_option("form.schema-form [name=tier]", json.dumps("enterprise"))


def test_the_dark_scheme_follows_the_system(browser: Any, daemon: Daemon) -> None:
    """prefers-color-scheme: dark gives a dark page and light text; light, the reverse."""
    colours = {}
    for scheme in ("light", "dark"):
        context = browser.new_context(color_scheme=scheme)
        tab = context.new_page()
        tab.goto(daemon.url + "/")
        tab.wait_for_selector("#api-key")
        colours[scheme] = tab.evaluate(
            """() => [getComputedStyle(document.documentElement).backgroundColor,
                      getComputedStyle(document.querySelector('.card')).color]"""
        )
        context.close()
    assert colours["light"][0] == "rgb(247, 248, 250)"

    def lightness(css: str) -> float:
        r, g, b = (int(x) for x in css[css.index("(") + 1 : css.index(")")].split(",")[:3])
        return (r + g + b) / 3

    assert lightness(colours["dark"][0]) < 60, colours  # a dark background
    assert lightness(colours["dark"][1]) > 180, colours  # light text on it


def test_axe_is_pinned_exactly() -> None:
    """The version scripts/setup installs is the lock's, and the lock names one version."""
    lock = json.loads((Path(__file__).parent / "axe" / "package-lock.json").read_text())
    wanted = json.loads((Path(__file__).parent / "axe" / "package.json").read_text())
    pinned = wanted["dependencies"]["axe-core"]
    assert pinned[0].isdigit(), pinned  # no range
    assert lock["packages"]["node_modules/axe-core"]["version"] == pinned
    if (AXE / "package.json").is_file():
        assert json.loads((AXE / "package.json").read_text())["version"] == pinned
