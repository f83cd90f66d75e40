"""``notifications/tools/list_changed`` reaches the official SDK's client in every revision
the pinned SDK negotiates, after an install through the real API: 2025-06-18 and
2025-11-25 on the session's GET stream (the handshake says ``tools.listChanged``),
2026-07-28 on its ``subscriptions/listen`` stream; over HTTP (the daemon's app in process)
and through the stdio bridge ``runnerd mcp`` (a real daemon)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.client.session
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from conftest import RUNNERD, AppDir, tool_doc
from daemon import Daemon, Runnerd, running_daemon
from inproc import InProcess
from test_mcp_contract import _client, _run

# A handshake client offers the SDK's newest handshake revision; 2025-06-18 is offered by
# setting the client's offer (its module constant) for the test.
HANDSHAKE_ERAS = ("2025-06-18", "2025-11-25")
WITHIN_S = 10


def _new_app(d: Runnerd, root: Path, slug: str) -> str:
    """A one-tool app deployed, published and installed through the API: its install id."""
    app = AppDir(root)
    app.write("agentserve.app.yaml", f"slug: {slug}\nname: {slug}\ntools: ./tools/*\n")
    app.tool("echo", yaml=tool_doc("echo"), source="def run(i):\n    return i\n")
    return str(d.ship(app.root)["installId"])


def _changes(seen: list[str]) -> Any:
    """A message handler that notes each tools/list_changed notification it is given."""

    async def handle(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            seen.append(message.method)

    return handle


async def _until(seen: list[str], n: int) -> None:
    async with asyncio.timeout(WITHIN_S):
        while len(seen) < n:
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("era", HANDSHAKE_ERAS)
def test_a_handshake_era_client_is_told_on_its_session_stream(
    app_daemon: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, era: str
) -> None:
    d = app_daemon
    monkeypatch.setattr(mcp.client.session, "LATEST_HANDSHAKE_VERSION", era)
    seen: list[str] = []

    async def work() -> tuple[str, Any, set[str]]:
        async with _client(d, mode="legacy", message_handler=_changes(seen)) as client:
            await client.list_tools()
            await asyncio.sleep(0.5)  # the client's GET stream opens after its handshake
            await asyncio.to_thread(_new_app, d, tmp_path / "app", f"told-{era[:7]}")
            await _until(seen, 1)
            listed = {t.name for t in (await client.list_tools()).tools}
            return client.protocol_version, client.server_capabilities, listed

    version, capabilities, listed = _run(d, work)
    assert version == era
    assert capabilities.tools is not None and capabilities.tools.list_changed is True
    assert seen == ["notifications/tools/list_changed"]
    assert f"told-{era[:7]}__echo" in listed


def test_a_2026_client_is_told_on_its_listen_stream_only(
    app_daemon: InProcess, tmp_path: Path
) -> None:
    """From 2026-07-28 the change comes on the listen stream the client opened, and not
    a second time on another channel."""
    d = app_daemon
    seen: list[str] = []

    async def work() -> tuple[str, Any, Any]:
        async with (
            _client(d, message_handler=_changes(seen)) as client,
            client.listen(tools_list_changed=True) as events,
        ):
            await asyncio.to_thread(_new_app, d, tmp_path / "app", "told-2026")
            event = await asyncio.wait_for(events.__anext__(), WITHIN_S)
            return client.protocol_version, client.server_capabilities, event

    version, capabilities, event = _run(d, work)
    assert version == "2026-07-28"
    assert capabilities.tools is not None and capabilities.tools.list_changed is True
    assert type(event).__name__ == "ToolsListChanged"
    assert seen == ["notifications/tools/list_changed"]  # the listen stream's, given on too


def test_every_open_session_is_told(app_daemon: InProcess, tmp_path: Path) -> None:
    """Two clients of two people, both eras at once: each is told once."""
    d = app_daemon
    other = d.person("told-too@example.com", role="admin")
    legacy: list[str] = []
    modern: list[str] = []

    async def work() -> Any:
        async with (
            _client(d, mode="legacy", message_handler=_changes(legacy)),
            _client(d, other, mode="legacy", message_handler=_changes(modern)),
        ):
            await asyncio.sleep(0.5)
            await asyncio.to_thread(_new_app, d, tmp_path / "app", "told-all")
            await _until(legacy, 1)
            await _until(modern, 1)

    _run(d, work)
    assert len(legacy) == len(modern) == 1


# --- through the stdio bridge -------------------------------------------------------------


@pytest.fixture(scope="module")
def real(toolchain_dir: Path) -> Iterator[Daemon]:
    with running_daemon(toolchain_dir, warm_jails="0") as daemon:
        yield daemon


@pytest.mark.jail
@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_stdio_bridge_tells_its_agent(real: Daemon, tmp_path: Path, mode: str) -> None:
    """``runnerd mcp`` hears the daemon's change and tells its own client, in that
    client's revision: a notification on the pipe (2025-11-25), or on the client's
    listen stream (2026-07-28)."""
    server = StdioServerParameters(
        command=RUNNERD,
        args=["mcp", "--url", real.url, "--workspace", real.workspace_id],
        env={"RUNNERD_API_KEY": real.admin_key, "PATH": "/usr/bin:/bin"},
    )
    seen: list[str] = []
    slug = f"bridged-{mode}"

    async def work() -> tuple[str, Any, set[str]]:
        async with Client(server, mode=mode, message_handler=_changes(seen)) as client:
            await client.list_tools()
            if mode == "legacy":
                await asyncio.sleep(1)  # the bridge's own listen on the daemon opens
                await asyncio.to_thread(_new_app, real, tmp_path / "app", slug)
                await _until(seen, 1)
            else:
                async with client.listen(tools_list_changed=True) as events:
                    await asyncio.sleep(1)
                    await asyncio.to_thread(_new_app, real, tmp_path / "app", slug)
                    event = await asyncio.wait_for(events.__anext__(), WITHIN_S)
                    assert type(event).__name__ == "ToolsListChanged"
            listed = {t.name for t in (await client.list_tools()).tools}
            return client.protocol_version, client.server_capabilities, listed

    version, capabilities, listed = asyncio.run(work())
    assert version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    assert capabilities.tools is not None and capabilities.tools.list_changed is True
    assert seen == ["notifications/tools/list_changed"]  # once, in either revision
    assert f"{slug}__echo" in listed
