"""What the daemon holds while it serves: settings, store, run machine, load limits."""

from __future__ import annotations

from dataclasses import dataclass

from runnerd.api.ratelimit import RateLimiter
from runnerd.api.sessions import CookieSigner
from runnerd.config import Settings
from runnerd.govern.governor import Governor
from runnerd.run.machine import Machine
from runnerd.store import Store

__all__ = ["AppState"]


@dataclass
class AppState:
    settings: Settings
    store: Store
    machine: Machine
    limiter: RateLimiter
    governor: Governor
    signer: CookieSigner  # signs session cookies (this node's key)
    # Signs MCP's held-approval request state: derived from the secrets key, so a client's
    # retry verifies on every node of a cluster.
    call_signer: CookieSigner
    # Signs frame tokens (api/frames.py): derived from the secrets key, so a frame any
    # node opened is served, and its bridge calls proven, by every node.
    frame_key: bytes
