"""The route table: every operation of the API, from which the Starlette routes and the
OpenAPI document are both built, so the served API and its description cannot drift."""

from __future__ import annotations

import functools
import os
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api import apps as apps_ops
from runnerd.api import governance as governance_ops
from runnerd.api import people as people_ops
from runnerd.api import tools as tools_ops
from runnerd.api.bodies import Health
from runnerd.api.errors import ApiError
from runnerd.api.openapi import openapi_document
from runnerd.api.ops import Op, json_response
from runnerd.api.state import AppState

__all__ = ["OPS", "api_document"]


async def healthz(request: Request, state: AppState) -> Response:
    return json_response(Health(status="ok"))


async def readyz(request: Request, state: AppState) -> Response:
    checks: dict[str, str] = {}
    try:
        await state.store.io(state.store.ping)
        checks["store"] = "ok"
    except Exception as exc:
        checks["store"] = f"error: {type(exc).__name__}"
    nsjail = state.machine.sandbox.nsjail
    checks["nsjail"] = "ok" if os.access(nsjail, os.X_OK) else f"missing: {nsjail}"
    rt = state.machine.runtimes
    checks["python"] = rt.python.version if rt.python else "missing"
    checks["node"] = rt.node.version if rt.node else "missing"
    checks["cgroups"] = state.machine.cgroups.mode
    ready = (
        checks["store"] == "ok"
        and checks["nsjail"] == "ok"
        and (rt.python is not None or rt.node is not None)
    )
    if not ready:
        raise ApiError("SERVICE_UNAVAILABLE", "not ready", details={"checks": checks})
    return json_response(Health(status="ready", checks=checks))


async def openapi(request: Request, state: AppState) -> Response:
    return json_response(api_document())


OPS: list[Op] = [
    *tools_ops.OPS,
    *apps_ops.OPS,
    *governance_ops.OPS,
    *people_ops.OPS,
    Op("GET", "/healthz", "healthz", "Alive", healthz, Health, errors=(500,), authenticated=False),
    Op(
        "GET",
        "/readyz",
        "readyz",
        "Ready: store open, nsjail usable, a runtime found",
        readyz,
        Health,
        errors=(500, 503),
        authenticated=False,
    ),
    Op(
        "GET",
        "/api/v2/openapi.json",
        "openapi",
        "This API's OpenAPI document",
        openapi,
        None,
        errors=(500,),
        authenticated=False,
    ),
]


@functools.cache
def api_document() -> dict[str, Any]:
    """The OpenAPI document of OPS (built once)."""
    return openapi_document(OPS)
