"""The Python SDK where no daemon answers: an unreachable one, and redirects from the
tests' own loopback servers (tests/redirect_lab.py) that must never take the key or the
input to another origin. Redirects that end at a daemon are in test_sdk.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from redirect_lab import redirect_lab
from runnerd.sdk import AppBridgeError, AppClient, AsyncAppClient


def test_an_unreachable_daemon_is_an_app_bridge_error() -> None:
    with pytest.raises(AppBridgeError) as caught:
        AppClient("http://127.0.0.1:9", "k", "ws", app="a").run_tool("t", {})
    found = caught.value
    assert (found.envelope_code, found.reason, found.code, found.status) == (
        "UNAVAILABLE", "connection_failed", "connection_failed", 0,
    )  # fmt: skip


# --- redirects: the key and the input never go to another origin -------------------------

REDIRECT_KEY = "rk_p_redirect-test-key-3f9a1c"  # no daemon checks it: it must simply not leave
CALLS = ("run_tool", "list_tools", "async run_tool", "async list_tools")
# Each Location and the origin the refusal must name ({port}: the redirector's own port;
# {far}: a trap on 127.0.0.2; {near}: a trap on 127.0.0.1, another port).
CROSS_ORIGIN = {
    "another host": ("http://127.0.0.2:{far}/api/x", "http://127.0.0.2:{far}"),
    "another port": ("http://127.0.0.1:{near}/api/x", "http://127.0.0.1:{near}"),
    "https, another port": ("https://127.0.0.1:{near}/api/x", "https://127.0.0.1:{near}"),
    "https, the same port": ("https://127.0.0.1:{port}/api/x", "https://127.0.0.1:{port}"),
    "userinfo trick": ("http://127.0.0.1:{port}@127.0.0.2:{far}/x", "http://127.0.0.2:{far}"),
    "scheme-relative": ("//127.0.0.2:{far}/api/x", "http://127.0.0.2:{far}"),
    "trailing dot": ("http://127.0.0.2.:{far}/x", "http://127.0.0.2"),
    "upper case": ("http://LOCALHOST:{near}/x", "http://localhost:{near}"),
    "tab in the host": ("http://127.0.0.2\t:{far}/x", ""),
    "file": ("file:///etc/passwd", "file:"),
    "javascript": ("javascript:alert(1)", "javascript:"),
}


def sdk_call(kind: str, url: str, key: str = REDIRECT_KEY, ws: str = "ws_1", app: str = "a") -> Any:
    """One SDK call of ``kind`` on a client of ``url``: its result or its AppBridgeError."""
    try:
        if kind.startswith("async"):
            client = AsyncAppClient(url, key, ws, app=app)
            call = client.run_tool("echo", {"n": 3}) if "run" in kind else client.list_tools()
            return asyncio.run(call)
        with AppClient(url, key, ws, app=app) as sync:
            return sync.run_tool("echo", {"n": 3}) if "run" in kind else sync.list_tools()
    except AppBridgeError as exc:
        return exc


def refused_redirect(found: Any, reason: str, status: int) -> AppBridgeError:
    assert isinstance(found, AppBridgeError), found
    assert (found.envelope_code, found.reason, found.code, found.status) == (
        "REDIRECT_REFUSED", reason, reason, status,
    )  # fmt: skip
    assert REDIRECT_KEY not in f"{found} {found.details}"
    return found


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("case", CROSS_ORIGIN)
def test_a_redirect_to_another_origin_is_refused_and_nothing_is_sent_there(
    case: str, call: str
) -> None:
    with redirect_lab() as lab:
        where = {"port": lab.port, "far": lab.far.port, "near": lab.near.port}
        location, origin = (part.format(**where) for part in CROSS_ORIGIN[case])
        lab.route = lambda path: (307, location)  # 307 would resend the POST and its body
        # httpx refuses a tab in a URL; fetch's parser drops it (and then sees 127.0.0.2).
        reason = "BAD_REDIRECT" if case == "tab in the host" else "CROSS_ORIGIN_REDIRECT"
        found = refused_redirect(sdk_call(call, lab.url), reason, 307)
        assert (lab.far.connections(), lab.near.connections(), lab.connections) == (0, 0, 1)
    if origin:
        assert found.details["origin"].startswith(origin)
        assert found.details["origin"] in str(found)


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_every_redirect_status_to_another_origin_is_refused(call: str, status: int) -> None:
    with redirect_lab() as lab:
        lab.route = lambda path: (status, f"http://127.0.0.2:{lab.far.port}{path}")
        found = refused_redirect(sdk_call(call, lab.url), "CROSS_ORIGIN_REDIRECT", status)
        assert found.details["origin"] == f"http://127.0.0.2:{lab.far.port}"
        assert lab.far.connections() == 0 and lab.connections == 1


def test_a_cross_origin_hop_after_same_origin_hops_is_refused() -> None:
    with redirect_lab() as lab:
        far = f"//127.0.0.2:{lab.far.port}/"
        lab.route = lambda path: (308, far if path.startswith("/next") else f"/next{path}")
        refused_redirect(sdk_call("run_tool", lab.url), "CROSS_ORIGIN_REDIRECT", 308)
        assert lab.far.connections() == 0 and lab.connections == 2


def test_a_host_that_differs_only_by_a_trailing_dot_is_another_origin() -> None:
    # ``localhost.`` is read by DNS without search domains: it may be another host.
    with redirect_lab() as lab:
        lab.route = lambda path: (307, f"http://localhost.:{lab.port}{path}")
        found = refused_redirect(sdk_call("run_tool", f"http://localhost:{lab.port}"),
                         "CROSS_ORIGIN_REDIRECT", 307)  # fmt: skip
        assert found.details["origin"] == f"http://localhost.:{lab.port}"
        assert lab.connections == 1


@pytest.mark.parametrize("status", [301, 302, 303])
def test_a_redirect_that_would_turn_a_run_into_a_get_is_refused(status: int) -> None:
    with redirect_lab() as lab:
        lab.route = lambda path: (status, f"/via{path}")
        for call in ("run_tool", "async run_tool"):
            refused_redirect(sdk_call(call, lab.url), "REDIRECT_CHANGES_METHOD", status)
        assert lab.connections == 2 and [m for m, *_ in lab.seen] == ["POST", "POST"]


@pytest.mark.parametrize(
    "location", ["http://[::1", "http:\\\\127.0.0.2:1\\x", "https:\\\\127.0.0.2\\", "http:"]
)
def test_a_location_that_is_no_url_is_refused(location: str) -> None:
    """No URL, or one parsers read differently (a scheme, then backslashes: WHATWG reads
    another host there, httpx a path)."""
    with redirect_lab() as lab:
        lab.route = lambda path: (307, location)
        for call in CALLS:
            refused_redirect(sdk_call(call, lab.url), "BAD_REDIRECT", 307)
        assert lab.connections == len(CALLS)
