"""The API behind the Manage page against a live daemon, where tools run: a session runs
a tool under the API's rules and only with its CSRF token; the audit verdict, the ledger
as CSV and usage per day after a run. The rest is in test_manage_api.py, in process."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import httpx
import pytest

from daemon import Daemon, envelope
from test_manage_api import EXAMPLE, GOOD, _sign_in

pytestmark = pytest.mark.jail
# The tests on the module's daemon run on both stores.
BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="module")
def install(daemon: Daemon) -> str:
    return str(daemon.ship(EXAMPLE)["installId"])


@pytest.fixture
def browser_like(daemon: Daemon) -> Iterator[httpx.Client]:
    """A client that keeps cookies, as a browser does."""
    with daemon.client() as client:
        yield client


def test_a_session_acts_under_the_api_rules_and_every_change_needs_the_csrf_token(
    daemon: Daemon, install: str, browser_like: httpx.Client
) -> None:
    viewer_key = daemon.person("vera@example.com", role="viewer")
    info = _sign_in(browser_like, apiKey=viewer_key)
    csrf = {"X-CSRF-Token": str(info["csrfToken"])}
    run_path = f"/api/v2/apps/installs/{install}/tools/score_offer/run"
    # A viewer may read, not run, exactly as with the key.
    assert browser_like.get(f"/api/v2/apps/installs/{install}/runs").status_code == 200
    envelope(
        browser_like.post(run_path, json={"input": GOOD}, headers=csrf),
        403,
        "INSUFFICIENT_WORKSPACE_ROLE",
    )

    member = httpx.Client(base_url=daemon.url, timeout=60)
    member_info = _sign_in(member, apiKey=daemon.person("max@example.com", role="member"))
    # No token: refused before anything happens, and no run is recorded.
    before = len(
        daemon.call("GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key).json()["data"]
    )
    envelope(member.post(run_path, json={"input": GOOD}), 403, "CSRF_TOKEN_INVALID")
    envelope(
        member.post(run_path, json={"input": GOOD}, headers={"X-CSRF-Token": "guess"}),
        403,
        "CSRF_TOKEN_INVALID",
    )
    # Two tokens, the right one among them: no one token, refused either way round.
    right = str(member_info["csrfToken"])
    for pair in ([right, "guess"], ["guess", right]):
        twice = [("X-CSRF-Token", token) for token in pair]
        envelope(member.post(run_path, json={"input": GOOD}, headers=twice), 403,
                 "CSRF_TOKEN_INVALID")  # fmt: skip
    after = len(
        daemon.call("GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key).json()["data"]
    )
    assert after == before
    ran = member.post(
        run_path,
        json={"input": GOOD, "surface": "test"},  # as the page's test-run form sends it
        headers={"X-CSRF-Token": str(member_info["csrfToken"])},
    )
    assert ran.status_code == 200 and ran.json()["output"]["decision"] == "approve"
    run = daemon.call("GET", f"/api/v2/runs/{ran.json()['runId']}", daemon.admin_key).json()["run"]
    assert run["surface"] == "test" and run["userEmail"] == "max@example.com"


def test_audit_verdict_ledger_csv_and_usage(daemon: Daemon, install: str) -> None:
    daemon.run(install, "score_offer", GOOD)
    verdict = daemon.call(
        "POST",
        "/api/v2/audit/verify",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id},
    ).json()
    assert verdict["ok"] is True and verdict["entries"] > 5 and verdict["firstBreak"] is None

    month = daemon.call("GET", f"/api/v2/apps/installs/{install}/budget", daemon.admin_key).json()[
        "month"
    ]
    exported = daemon.call(
        "GET",
        "/api/v2/ledger",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id, "month": month, "format": "csv"},
    )
    assert exported.headers["content-type"].startswith("text/csv")
    assert "attachment" in exported.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert rows and rows[0]["tool"] in {"score_offer", "route_ticket"} and "sandboxMs" in rows[0]

    usage = daemon.call("GET", f"/api/v2/apps/installs/{install}/usage", daemon.admin_key).json()[
        "data"
    ]
    assert usage and usage[-1]["succeeded"] >= 1 and usage[-1]["sandboxMs"] > 0
    chart = httpx.get(
        f"{daemon.url}/manage/installs/{install}/usage.svg", headers={"X-API-Key": daemon.admin_key}
    )
    assert chart.headers["content-type"] == "image/svg+xml"
    assert (
        chart.text.startswith("<svg") and "succeeded" in chart.text and "<script" not in chart.text
    )
    assert httpx.get(f"{daemon.url}/manage/installs/{install}/usage.svg").status_code == 401
