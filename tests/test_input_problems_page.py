"""The Manage page's test-run form shows every problem of a refused input: each next
to its field, and all of them in the form's message."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from daemon import Daemon
from test_manage_page import GOOD, Page, _fill, _tool_page, browser, install, tab

__all__ = ["browser", "install", "tab"]  # the fixtures, from the page tests

pytestmark = [pytest.mark.jail, pytest.mark.browser]


def test_every_broken_field_shows_its_problem(
    tab: Callable[..., Page], daemon: Daemon, install: str
) -> None:
    page = tab()
    page.sign_in(daemon.admin_key)
    _tool_page(page, install)
    _fill(page, {**GOOD, "discountPct": "150", "marginPct": "-300", "termMonths": "0"})
    page.tab.click("form.schema-form button[type=submit]")
    for name in ("discountPct", "marginPct", "termMonths"):
        error = page.tab.wait_for_selector(f"[data-pointer='/{name}'] .field-error:not(:empty)")
        assert f"/{name}" in error.inner_text()
        assert page.tab.get_attribute(f"[name={name}]", "aria-invalid") == "true"
    assert page.tab.get_attribute("[name=dealSize]", "aria-invalid") is None
    summary = page.tab.locator("form.schema-form .form-error").inner_text()
    for name in ("discountPct", "marginPct", "termMonths"):
        assert f"/{name}" in summary
    # The first broken field keeps the focus.
    assert page.tab.evaluate("document.activeElement.name") == "discountPct"
