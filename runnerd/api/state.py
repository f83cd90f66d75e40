"""What the daemon holds while it serves: settings, store, run engine, load limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from runnerd.api.ratelimit import RateLimiter
from runnerd.api.sessions import CookieSigner
from runnerd.config import Settings
from runnerd.govern.governor import Governor
from runnerd.run.machine import Machine
from runnerd.store import Store

if TYPE_CHECKING:
    from runnerd.mcp.endpoint import McpEndpoint

__all__ = ["AppState"]


@dataclass
class AppState:
    settings: Settings
    store: Store
    machine: Machine
    limiter: RateLimiter
    governor: Governor
    cookies: CookieSigner
    mcp: McpEndpoint | None = None  # the MCP endpoint, to tell its sessions tools changed
