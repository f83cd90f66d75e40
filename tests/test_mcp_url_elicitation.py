"""A chat client that shows URLs but no forms (2025-11-25's URL-mode elicitation), with the
official MCP Python SDK's client against a live daemon: a write call sends the person to
the Manage page, waits while they decide there, and answers the run's result; declined
at the client or denied on the page, nothing runs."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import mcp_types as types
import pytest
from mcp.client.session import ClientSession

from daemon import Daemon
from test_mcp import HANDSHAKE, _approval_status, _client, ship_apps

pytestmark = pytest.mark.jail


@pytest.fixture(scope="module")
def installs(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return ship_apps(daemon, tmp_path_factory)


@pytest.fixture
def url_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's client declares both modes when it has a callback: this one, URL only."""
    declare = ClientSession._build_capabilities

    def url_mode(self: ClientSession, version: str) -> types.ClientCapabilities:
        found = declare(self, version)
        if found.elicitation is not None:
            found.elicitation = types.ElicitationCapability(url=types.UrlElicitationCapability())
        return found

    monkeypatch.setattr(ClientSession, "_build_capabilities", url_mode)


def _runs(daemon: Daemon, install: str) -> int:
    found = daemon.call(
        "GET", f"/api/v2/apps/installs/{install}/runs", daemon.admin_key,
        params={"tool": "file_entry"},
    )  # fmt: skip
    return len(found.json()["data"])


def _decide_soon(daemon: Daemon, key: str, approval_id: str, verdict: str) -> None:
    """The person on the Manage page: decides the held call a moment after being sent."""

    def decide() -> None:
        time.sleep(0.7)
        done = daemon.call("POST", f"/api/v2/approvals/{approval_id}/{verdict}", key)
        assert done.status_code == 200, done.text

    threading.Thread(target=decide, daemon=True).start()


def test_a_url_only_client_sends_the_person_to_the_page_and_gets_the_result(
    daemon: Daemon, installs: dict[str, str], url_only: None
) -> None:
    key = daemon.person(f"url-{time.monotonic_ns()}@example.com")
    asked: list[Any] = []

    def sent_to_the_page(verdict: str | None) -> Any:
        async def elicit(ctx: Any, params: Any) -> types.ElicitResult:
            asked.append(params)
            if verdict is None:
                return types.ElicitResult(action="decline")
            _decide_soon(daemon, key, params.elicitation_id, verdict)
            return types.ElicitResult(action="accept")

        return elicit

    async def call(verdict: str | None, amount: int) -> tuple[str, Any]:
        async with _client(
            daemon, key, mode="legacy", elicitation_callback=sent_to_the_page(verdict)
        ) as client:
            result = await client.call_tool("ledger__file_entry", {"amount": amount})
            return client.protocol_version, result

    before = _runs(daemon, installs["ledger"])
    version, ran = asyncio.run(call("approve", 61))
    assert version == HANDSHAKE
    [params] = asked
    assert params.mode == "url" and params.url.endswith("/#/approvals")
    assert params.elicitation_id in params.message
    # The page's decision ran the call: its output, matching the strict output schema.
    assert ran.is_error is not True and ran.structured_content == {"filed": 61}
    assert _approval_status(daemon, params.elicitation_id) == "approved"
    assert _runs(daemon, installs["ledger"]) == before + 1

    for verdict in ("deny", None):  # denied on the page; declined at the client
        _, refused = asyncio.run(call(verdict, 62))
        approval_id = asked[-1].elicitation_id
        assert refused.is_error and refused.structured_content is None
        assert approval_id in refused.content[0].text
        assert refused.meta["runnerd/approval"]["approvalId"] == approval_id
        assert _approval_status(daemon, approval_id) == "denied"
    assert _runs(daemon, installs["ledger"]) == before + 1
