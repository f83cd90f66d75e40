"""Run history: the runs of an install, the last of each tool, its use per day, and one
run, with its output while held in memory for those who may see it. Inputs are never
recorded, outputs never stored."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import caller_of, install_of
from runnerd.api.bodies import (
    EgressUse,
    LatestRuns,
    RunDetail,
    RunInfo,
    RunList,
    UsageDay,
    UsageList,
    wire_view,
)
from runnerd.api.ops import INSTALL_ID, Op, Param, int_query, json_response
from runnerd.api.state import AppState
from runnerd.errors import RunNotFound
from runnerd.govern.results import may_see_output
from runnerd.limits import MAX_DESTINATION_CHARS, MAX_ID_CHARS, MAX_NAME_CHARS
from runnerd.store import RunRow

__all__ = ["OPS"]


def _run_info(r: RunRow) -> RunInfo:
    info = wire_view(RunInfo, r, id="run_id")
    if r.egress is not None:
        info.egress = [_egress_use(figure) for figure in r.egress]
    return info


def _egress_use(figure: Any) -> EgressUse:
    """One stored egress figure for the wire. A figure this runnerd cannot show as it is
    (a refusal reason it does not name, a key it does not know) still shows, without the
    part it cannot: a history is never a 500."""
    try:
        return msgspec.convert(figure, EgressUse)
    except msgspec.ValidationError:
        pass
    known: dict[str, Any] = figure if isinstance(figure, dict) else {}

    def count(key: str) -> int:
        value = known.get(key)
        return value if isinstance(value, int) and value >= 0 else 0

    return EgressUse(
        destination=str(known.get("destination", "?"))[:MAX_DESTINATION_CHARS],
        connections=count("connections"),
        bytes_sent=count("bytesSent"),
        bytes_received=count("bytesReceived"),
    )


async def get_run(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    user_id = caller.need_person()
    row = await caller.visible(
        state.store, state.store.get_run, request.path_params["runId"], RunNotFound
    )
    member = await caller.member(state.store, row.workspace_id, role="viewer")
    detail = RunDetail(run=_run_info(row))
    approval = (
        await state.store.io(state.store.get_approval, row.approval_id) if row.approval_id else None
    )
    entitled = may_see_output(
        user_id,
        role=None if member is None else member.role,
        ran_for=row.user_id,
        released_by=None if approval is None else approval.decided_by,
    )
    if entitled and row.status != "running":  # from the node that holds it, or why not
        found = await state.governor.recorded(row.id)
        detail = RunDetail(
            run=detail.run,
            output=found.output,
            error=found.error,
            output_available=found.output_available,
            output_missing=found.missing,
        )
    return json_response(detail)


async def list_runs(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    caller.need_person()
    install = await install_of(request, state, caller, "viewer")
    limit = int_query(request, "limit", 50, 1, 500)
    rows = await state.store.io(
        state.store.list_runs,
        install.id,
        tool=request.query_params.get("tool"),
        status=request.query_params.get("status"),
        surface=request.query_params.get("surface"),
        since=request.query_params.get("since"),
        before=request.query_params.get("cursor"),
        limit=limit,
    )
    next_cursor = rows[-1].id if len(rows) == limit else None
    return json_response(RunList(data=[_run_info(r) for r in rows], next_cursor=next_cursor))


async def usage(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    caller.need_person()
    install = await install_of(request, state, caller, "viewer")
    days = int_query(request, "days", 30, 1, 366)
    rows = await state.store.io(state.store.usage_by_day, install.id, days)
    return json_response(UsageList(data=[UsageDay(**r) for r in rows]))


async def latest_runs(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    caller.need_person()
    install = await install_of(request, state, caller, "viewer")
    found = await state.store.io(
        state.store.latest_runs, install.id, int_query(request, "perTool", 5, 1, 50)
    )
    return json_response(
        LatestRuns(data={t: [_run_info(r) for r in rs] for t, rs in found.items()})
    )


OPS = [
    Op(
        "GET",
        "/api/v2/apps/installs/{installId}/runs",
        "listRuns",
        "The runs of an install, newest first (never inputs or outputs)",
        list_runs,
        RunList,
        params=(
            INSTALL_ID,
            Param("tool", "Only this tool.", max_length=MAX_NAME_CHARS),
            Param("status", "Only this status.", max_length=16),
            Param("surface", "Only runs from this surface (app, chat, api...).", max_length=16),
            Param(
                "since",
                "Only runs started on or after this date or time (UTC, YYYY-MM-DD[THH:MM...]).",
                max_length=32,
                pattern=r"^\d{4}-\d{2}-\d{2}([T ][0-9:.]+Z?)?$",
            ),
            Param("cursor", "nextCursor of the previous page.", max_length=MAX_ID_CHARS),
            Param("limit", "1 to 500 (default 50).", integer=(1, 500)),
        ),
    ),
    Op(
        "GET",
        "/api/v2/apps/installs/{installId}/runs/latest",
        "latestRuns",
        "The last runs of each tool of an install",
        latest_runs,
        LatestRuns,
        params=(INSTALL_ID, Param("perTool", "1 to 50 (default 5).", integer=(1, 50))),
    ),
    Op(
        "GET",
        "/api/v2/apps/installs/{installId}/usage",
        "installUsage",
        "Runs per day by status, and sandbox time per day, of an install",
        usage,
        UsageList,
        params=(INSTALL_ID, Param("days", "1 to 366 (default 30).", integer=(1, 366))),
        description="Days are UTC; a day without runs is absent.",
    ),
    Op(
        "GET",
        "/api/v2/runs/{runId}",
        "getRun",
        "One run, with its output while held in memory",
        get_run,
        RunDetail,
        params=(Param("runId", "The run.", required=True, max_length=MAX_ID_CHARS, where="path"),),
    ),
]
