"""The deal-desk example's page (issue 26): opened from the Manage page's launcher, in
the sandboxed frame, it scores an offer with getAppClient().runTool('score_offer', ...)
through the bridge. A live daemon and Debian's chromium through Playwright.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conftest import EXAMPLE, REPO
from daemon import Daemon
from test_app_bridge import Tab, _apps_origin, _runs, browser, signed_in  # noqa: F401

pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.jail, pytest.mark.browser]


def test_the_pages_carry_the_sdks_frame_module_as_it_is() -> None:
    """The example has no build step: its runnerd-frame.js is clients/js/frame.js copied,
    and must not drift from it."""
    copied = (EXAMPLE / "pages" / "runnerd-frame.js").read_bytes()
    assert copied == (REPO / "clients" / "js" / "frame.js").read_bytes()
    assert "pages: ./pages" in (EXAMPLE / "agentserve.app.yaml").read_text()


@pytest.mark.smoke
def test_the_example_page_scores_an_offer_through_the_bridge(
    signed_in: Callable[..., Tab],  # noqa: F811 - the fixture of test_app_bridge
    daemon: Daemon,
) -> None:
    install = daemon.ship(EXAMPLE)
    install_id = str(install["installId"])
    tab = signed_in()
    tab.tab.click("#launcher a:has-text('Open deal-desk')")
    element = tab.tab.wait_for_selector("iframe.app-frame")
    assert element.get_attribute("sandbox") == "allow-scripts allow-forms"
    frame = element.content_frame()
    assert frame.url.startswith(_apps_origin(daemon) + "/f/")
    frame.wait_for_selector("h1:has-text('Score an offer')")
    # The form's offer: 12% off for an enterprise deal of 24 months, 30% margin.
    frame.click("#score")
    frame.wait_for_selector("#result:not([hidden])")
    assert frame.inner_text("#decision") == "approve"
    assert int(frame.inner_text("#points")) >= 70
    assert "within the 17% allowance" in frame.inner_text("#reasons")
    run_id = frame.get_attribute("#result", "data-run-id")
    # Too deep a discount: rejected by the tool, shown the same way.
    frame.fill("input[name=discountPct]", "40")
    frame.click("#score")
    frame.wait_for_selector("#decision.reject")
    assert frame.is_hidden("#error")
    [found] = [r for r in _runs(daemon, install_id) if r["runId"] == run_id]
    assert (found["tool"], found["surface"], found["status"]) == ("score_offer", "app", "succeeded")
