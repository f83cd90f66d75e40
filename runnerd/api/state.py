"""What the daemon holds while it serves: settings, store, run engine, load limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from runnerd.api.limits import RateLimiter
from runnerd.calls import Calls
from runnerd.config import Settings
from runnerd.run.engine import Engine
from runnerd.store import Store
from runnerd.web.cookies import CookieSigner

if TYPE_CHECKING:
    from runnerd.api.mcp_endpoint import McpEndpoint

__all__ = ["AppState"]


@dataclass
class AppState:
    settings: Settings
    store: Store
    engine: Engine
    limiter: RateLimiter
    calls: Calls
    cookies: CookieSigner
    mcp: McpEndpoint | None = None  # the MCP endpoint, to tell its sessions tools changed
