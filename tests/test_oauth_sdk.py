"""OAuth 2.1 end to end: the official MCP SDK's ``OAuthClientProvider`` against a live
daemon signs in through the consent screen (driven in Chromium) and calls a tool; a Deny
on that screen sends the client access_denied. On one store (test_oauth.py runs the
protocol on both)."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from daemon import Runnerd
from test_governance import audit
from test_oauth import authorize, pkce, register

DAEMON_SETTINGS = {"oauth_allow_loopback_clients": "true"}


# --- end to end: the official SDK's OAuth client, the consent screen in Chromium -------------


class _Tokens:
    """The SDK's TokenStorage, in memory."""

    def __init__(self) -> None:
        self.tokens: Any = None
        self.client: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client

    async def set_client_info(self, client_info: Any) -> None:
        self.client = client_info


@contextlib.contextmanager
def callback_server() -> Iterator[tuple[str, list[dict[str, list[str]]]]]:
    """The client's loopback redirect target: records each query sent to /callback (the
    browser may ask for /favicon.ico there too)."""
    received: list[dict[str, list[str]]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if urlsplit(self.path).path == "/callback":
                received.append(parse_qs(urlsplit(self.path).query))
            body = b"<!doctype html><title>done</title><p>You may close this tab."
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/callback", received
    finally:
        server.shutdown()
        server.server_close()


def _consent_in_chromium(url: str, key: str, *, allow: bool, shot: str | None = None) -> list[str]:
    """Follow the client's authorization URL in a headless Chromium: sign in on the
    Manage page with ``key``, then Allow or Deny; the hosts the tab asked."""
    from playwright.sync_api import sync_playwright

    from test_manage_page import _chromium

    asked: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            tab = browser.new_page()
            tab.on("request", lambda r: asked.append(urlsplit(r.url).netloc))
            tab.goto(url)
            tab.fill("#api-key", key)
            tab.click("button:has-text('Sign in')")
            tab.wait_for_selector("#consent")
            assert tab.inner_text("#consent-client") == "SDK test client"
            assert tab.inner_text("#consent-host").startswith("127.0.0.1:")
            assert tab.is_checked("#scope-tools\\:run")
            if shot:
                tab.screenshot(path=shot, full_page=True)
            with tab.expect_navigation(url=lambda u: "/callback" in u):
                tab.click("#consent-allow" if allow else "#consent-deny")
        finally:
            browser.close()
    return asked


@pytest.mark.jail
@pytest.mark.browser
def test_the_sdk_signs_in_through_the_consent_screen_and_calls_a_tool(daemon: Runnerd) -> None:

    from mcp import Client
    from mcp.client.auth import OAuthClientProvider
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata

    from test_mcp import EXAMPLE, OFFER

    pytest.importorskip("playwright.sync_api")
    d = daemon
    d.ship(EXAMPLE)
    storage = _Tokens()
    with callback_server() as (callback, received):
        asked: list[str] = []

        async def redirect_handler(url: str) -> None:
            asked.extend(
                await asyncio.to_thread(_consent_in_chromium, url, d.admin_key, allow=True)
            )

        async def callback_handler() -> AuthorizationCodeResult:
            query = received[-1]
            assert "code" in query, query  # else the server's error, shown
            return AuthorizationCodeResult(
                code=query["code"][0], state=query["state"][0], iss=query["iss"][0]
            )

        provider = OAuthClientProvider(
            server_url=f"{d.url}/mcp?workspaceId={d.workspace_id}",
            client_metadata=OAuthClientMetadata(
                client_name="SDK test client",
                redirect_uris=[callback],  # type: ignore[list-item]
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
            ),
            storage=storage,
            redirect_handler=redirect_handler,
            callback_handler=callback_handler,
        )

        async def work() -> tuple[Any, Any]:
            http = create_mcp_http_client(auth=provider)
            url = f"{d.url}/mcp?workspaceId={d.workspace_id}"
            async with Client(streamable_http_client(url, http_client=http)) as client:
                listed = await client.list_tools()
                called = await client.call_tool("deal-desk__score_offer", OFFER)
                return listed, called

        listed, called = asyncio.run(work())
    assert "deal-desk__score_offer" in {t.name for t in listed.tools}
    assert called.is_error is not True
    assert called.structured_content["decision"] == "approve"
    assert len(received) == 1  # one consent
    assert set(asked) <= {urlsplit(d.url).netloc, urlsplit(callback).netloc}  # nothing else
    # The client registered (RFC 7591) with a secret, kept only as a hash.
    assert storage.client.client_secret
    assert storage.tokens.access_token.startswith("rk_o_")
    assert storage.tokens.refresh_token
    # A personal key in a header keeps working beside it.
    assert (
        d.call(
            "GET", "/api/v2/apps", d.admin_key, params={"workspaceId": d.workspace_id}
        ).status_code
        == 200
    )
    actions = [e["action"] for e in audit(d)]
    for action in ("oauth.consent.grant", "oauth.token.issue"):
        assert action in actions, action


@pytest.mark.browser
def test_deny_on_the_consent_screen_sends_access_denied(daemon: Runnerd) -> None:
    pytest.importorskip("playwright.sync_api")
    d = daemon
    with callback_server() as (callback, received):
        client = register(d, redirect=callback, client_name="SDK test client")
        _, challenge = pkce()
        started = authorize(d, client["client_id"], challenge, redirect=callback)
        assert started.status_code == 302
        url = f"{d.url}/oauth/authorize?{urlsplit(str(started.request.url)).query}"
        _consent_in_chromium(url, d.admin_key, allow=False)
    [query] = received
    assert query["error"] == ["access_denied"] and query["state"] == ["st-1"]
    assert "code" not in query
