"""Whether the daemon is alive (``/healthz``) and ready to serve calls (``/readyz``):
no authentication, for load balancers and service managers."""

from __future__ import annotations

import asyncio
import os

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.bodies import Health
from runnerd.api.ops import Op, json_response
from runnerd.api.state import AppState
from runnerd.errors import NotReady
from runnerd.limits import READY_STORE_TIMEOUT_S

__all__ = ["OPS"]


async def healthz(request: Request, state: AppState) -> Response:
    return json_response(Health(status="ok"))


async def readyz(request: Request, state: AppState) -> Response:
    """Ready: the store answers (within READY_STORE_TIMEOUT_S), nsjail can be run, a
    Python or a Node was found, and the daemon is not stopping; 503 SERVICE_UNAVAILABLE
    with each check's finding otherwise."""
    checks: dict[str, str] = {}
    ping = asyncio.ensure_future(state.store.io(state.store.ping))
    done, _ = await asyncio.wait({ping}, timeout=READY_STORE_TIMEOUT_S)
    if not done:  # a database cut off, or every store thread held: left to end by itself
        ping.add_done_callback(lambda f: f.cancelled() or f.exception())
        checks["store"] = f"error: no answer within {READY_STORE_TIMEOUT_S} s"
    elif (exc := ping.exception()) is not None:
        checks["store"] = f"error: {type(exc).__name__}"
    else:
        checks["store"] = "ok"
    nsjail = state.machine.sandbox.nsjail
    checks["nsjail"] = "ok" if os.access(nsjail, os.X_OK) else f"missing: {nsjail}"
    rt = state.machine.runtimes
    checks["python"] = rt.python.version if rt.python else "missing"
    checks["node"] = rt.node.version if rt.node else "missing"
    checks["cgroups"] = state.machine.cgroups.mode
    stopping = state.governor.gate.closing  # draining: a balancer sends calls elsewhere
    if stopping:
        checks["admitting"] = "no: stopping"
    ready = (
        not stopping
        and checks["store"] == "ok"
        and checks["nsjail"] == "ok"
        and (rt.python is not None or rt.node is not None)
    )
    if not ready:
        raise NotReady(checks)
    return json_response(Health(status="ready", checks=checks))


OPS: list[Op] = [
    Op("GET", "/healthz", "healthz", "Alive", healthz, Health, errors=(500,), authenticated=False),
    Op(
        "GET",
        "/readyz",
        "readyz",
        "Ready: store open, nsjail usable, a runtime found, not stopping",
        readyz,
        Health,
        errors=(500, 503),
        authenticated=False,
    ),
]
