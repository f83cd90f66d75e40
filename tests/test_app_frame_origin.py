"""The Apps launcher's frame, where the Manage page is: at another address than
public_url the browser would leave the frame blank (the pages' frame-ancestors name
public_url's origin only), so the page says where to open it instead; at public_url the
frame shows, and fills the window's height below it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from daemon import Daemon
from test_app_bridge import _app, browser  # noqa: F401 - the fixture, as pytest finds it

pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.jail, pytest.mark.browser]


@pytest.fixture(scope="module")
def install(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(
        daemon.ship(_app(tmp_path_factory.mktemp("app"), "origin-demo", pages=True))["installId"]
    )


@pytest.fixture
def tab(browser: Any) -> Iterator[Any]:  # noqa: F811 - the fixture of test_app_bridge
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert errors == [], errors


def _sign_in(page: Any, base: str, key: str) -> None:
    page.goto(base + "/")
    page.fill("#api-key", key)
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("h1:has-text('Apps')")


def _opens(daemon: Daemon, install: str) -> int:
    found = daemon.call(
        "GET", "/api/v2/audit", daemon.admin_key,
        params={"workspaceId": daemon.workspace_id, "action": "app.open", "limit": 500},
    )  # fmt: skip
    assert found.status_code == 200, found.text
    return sum(1 for e in found.json()["data"] if e.get("installId") == install)


def test_at_another_address_than_public_url_the_page_says_where_to_open_the_app(
    tab: Any, daemon: Daemon, install: str
) -> None:
    other = daemon.url.replace("127.0.0.1", "localhost")  # public_url is 127.0.0.1's
    assert other != daemon.url
    _sign_in(tab, other, daemon.admin_key)
    opened = _opens(daemon, install)
    tab.goto(f"{other}/#/apps/{install}")
    notice = tab.wait_for_selector(".frame-origin")
    text = notice.inner_text()
    assert text.startswith(f"Open the Manage page at {daemon.url} to use apps: the apps origin")
    assert f"this page is at {other}" in text
    link = tab.get_attribute(".frame-origin a", "href")
    assert link == f"{daemon.url}/#/apps/{install}"
    assert tab.query_selector("iframe") is None
    assert _opens(daemon, install) == opened  # no frame opened (nor audited) for nothing


def test_at_public_url_the_frame_shows_and_fills_the_window_below_it(
    tab: Any, daemon: Daemon, install: str
) -> None:
    _sign_in(tab, daemon.url, daemon.admin_key)
    tab.goto(f"{daemon.url}/#/apps/{install}")
    tab.frame_locator("iframe.app-frame").locator("h1:has-text('Bridge demo')").wait_for()
    assert tab.query_selector(".frame-origin") is None

    def bottom() -> float:
        found: float = tab.evaluate(
            "document.querySelector('iframe.app-frame').getBoundingClientRect().bottom"
        )
        return found

    assert abs(bottom() - (900 - 24)) <= 1
    tab.set_viewport_size({"width": 1280, "height": 760})
    tab.wait_for_function(
        "() => Math.abs(document.querySelector('iframe.app-frame')"
        ".getBoundingClientRect().bottom - (760 - 24)) <= 1"
    )
    tab.set_viewport_size({"width": 1280, "height": 300})  # never below 420 px
    tab.wait_for_function(
        "() => document.querySelector('iframe.app-frame').getBoundingClientRect().height >= 420"
    )
