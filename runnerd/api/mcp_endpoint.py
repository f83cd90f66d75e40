"""``/mcp``, with the MCP SDK loaded at the first MCP request instead of at start.

The SDK and its protocol types are most of the daemon's memory and start-up time (about
30 MB of RSS and 0.4 s of imports here), and many installs never speak MCP. The SDK is
imported in a thread, so the event loop keeps answering meanwhile; its session manager
runs in a task of the daemon's lifespan (``serve``), which it must enter and leave.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import TYPE_CHECKING

from starlette.types import Receive, Scope, Send

from runnerd.api.errors import ApiError, error_response

if TYPE_CHECKING:
    from runnerd.api.mcp import McpGateway
    from runnerd.api.state import AppState

__all__ = ["McpEndpoint"]


class McpEndpoint:
    """The ASGI endpoint of ``/mcp`` and the daemon's handle on MCP sessions."""

    def __init__(self) -> None:
        self.state: AppState | None = None  # set by the daemon's lifespan
        self._wanted = asyncio.Event()
        self._stop = asyncio.Event()
        self._gateway: asyncio.Future[McpGateway] | None = None

    @property
    def loaded(self) -> bool:
        return self._gateway is not None and self._gateway.done()

    async def serve(self) -> None:
        """The lifespan's task: load the SDK when first asked, run its session manager
        until ``stop``."""
        await self._wanted.wait()
        if self._stop.is_set():
            return
        assert self._gateway is not None
        try:
            module = await asyncio.to_thread(importlib.import_module, "runnerd.api.mcp")
            gateway: McpGateway = module.McpGateway()
            gateway.state = self.state
        except Exception as exc:
            self._gateway.set_exception(exc)
            return
        async with gateway.run():
            self._gateway.set_result(gateway)
            await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()
        self._wanted.set()

    async def _loaded(self) -> McpGateway:
        if self._gateway is None:
            self._gateway = asyncio.get_running_loop().create_future()
            self._wanted.set()
        return await asyncio.shield(self._gateway)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._stop.is_set() and not self.loaded:  # the daemon is stopping
            unavailable = ApiError("SERVICE_UNAVAILABLE", "runnerd is stopping")
            await error_response(unavailable)(scope, receive, send)
            return
        gateway = await self._loaded()
        await gateway(scope, receive, send)

    async def tools_changed(self) -> None:
        """Tell open MCP sessions that the tools changed (none before the SDK loads)."""
        if self.loaded:
            assert self._gateway is not None
            await self._gateway.result().tools_changed()
