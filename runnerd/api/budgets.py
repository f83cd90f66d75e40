"""The monthly budget of sandbox time of an install: read it, with this month's use, and
set it (admins)."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import caller_of, install_of
from runnerd.api.bodies import BudgetBody, BudgetInfo, wire_view
from runnerd.api.ops import INSTALL_ID, Op, json_response
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.limits import MAX_SMALL_BODY_BYTES

__all__ = ["OPS"]


async def _budget_info(state: AppState, install_id: str) -> msgspec.Struct:
    return wire_view(BudgetInfo, await state.store.io(state.store.budget, install_id))


async def get_budget(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    install = await install_of(request, state, caller, "viewer")
    return json_response(await _budget_info(state, install.id))


async def put_budget(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "apps:write")
    install = await install_of(request, state, caller, "admin")
    body = await read_body(request, BudgetBody, MAX_SMALL_BODY_BYTES)
    await state.store.io(
        state.store.set_budget,
        install.id,
        body.monthly_ms,
        caller.user_id,
        workspace_id=install.workspace_id,
        key_id=caller.key.id,
    )
    return json_response(await _budget_info(state, install.id))


OPS = [
    Op(
        "GET",
        "/api/v2/apps/installs/{installId}/budget",
        "getBudget",
        "The install's monthly budget and this month's use",
        get_budget,
        BudgetInfo,
        params=(INSTALL_ID,),
    ),
    Op(
        "PUT",
        "/api/v2/apps/installs/{installId}/budget",
        "setBudget",
        "Set the install's monthly budget of sandbox time (admins); null is unlimited",
        put_budget,
        BudgetInfo,
        body=BudgetBody,
        params=(INSTALL_ID,),
    ),
]
