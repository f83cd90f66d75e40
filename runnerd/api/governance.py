"""Governance endpoints: secrets, budgets, the ledger, the audit trail, approvals, and
run history. Secret values go in and never come out; inputs and outputs are never
recorded."""

from __future__ import annotations

import csv
import io
import re
from typing import Any, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import caller_of, install_of
from runnerd.api.bodies import (
    ApprovalInfo,
    ApprovalList,
    AuditInfo,
    AuditList,
    BudgetBody,
    BudgetInfo,
    Deleted,
    EgressUse,
    LatestRuns,
    LedgerList,
    LedgerRow,
    RunDetail,
    RunInfo,
    RunList,
    SecretBody,
    SecretInfo,
    SecretList,
    UsageDay,
    UsageList,
    wire_view,
)
from runnerd.api.ops import (
    INSTALL_ID,
    WORKSPACE,
    Op,
    Param,
    int_query,
    json_response,
    query_param,
)
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.errors import (
    InvalidQuery,
    RunNotFound,
    SecretNotFound,
)
from runnerd.govern.results import may_see_output
from runnerd.govern.secrets import SECRET_NAME, check_secret_name, check_secret_value
from runnerd.limits import (
    MAX_DESTINATION_CHARS,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_SECRET_BODY_BYTES,
    MAX_SECRET_NAME_CHARS,
    MAX_SMALL_BODY_BYTES,
)
from runnerd.store import ApprovalRow, RunRow

__all__ = ["OPS"]


# --- secrets ----------------------------------------------------------------------------------


async def put_secret(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "apps:write")
    install = await install_of(request, state, caller, "admin")
    name = check_secret_name(str(request.path_params["name"]))
    body = await read_body(request, SecretBody, MAX_SECRET_BODY_BYTES)
    check_secret_value(body.value)
    sealed = state.governor.vault.seal(install.id, name, body.value)
    updated = await state.store.io(
        state.store.put_secret,
        install.id,
        name,
        sealed,
        workspace_id=install.workspace_id,
        user_id=caller.user_id,
        key_id=caller.key.id,
    )
    return json_response(SecretInfo(name=name, updated_at=updated))


async def list_secrets(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    install = await install_of(request, state, caller, "builder")
    names = await state.store.io(state.store.secret_names, install.id)
    return json_response(SecretList(data=[SecretInfo(name=n, updated_at=u) for n, u in names]))


async def delete_secret(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "apps:write")
    install = await install_of(request, state, caller, "admin")
    name = check_secret_name(str(request.path_params["name"]))
    if not await state.store.io(
        state.store.delete_secret,
        install.id,
        name,
        workspace_id=install.workspace_id,
        user_id=caller.user_id,
        key_id=caller.key.id,
    ):
        raise SecretNotFound(name)
    return json_response(Deleted(name=name, deleted=True))


# --- budgets ----------------------------------------------------------------------------------


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


# --- ledger and audit -------------------------------------------------------------------------

MONTH = re.compile(r"\d{4}-(0[1-9]|1[0-2])")


def ledger_month(month: str | None) -> str | None:
    """The ledger's month filter on every surface (this API, ``runnerd ledger export``):
    none, or YYYY-MM; InvalidQuery otherwise."""
    if month is not None and not MONTH.fullmatch(month):
        raise InvalidQuery("month", "month is YYYY-MM")
    return month


async def _admin_of_workspace(request: Request, state: AppState) -> str:
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    caller = await caller_of(request, state, "api:read")
    caller.need_person()
    await caller.member(state.store, workspace_id, role="admin", apps=False)
    return workspace_id


async def get_ledger(request: Request, state: AppState) -> Response:
    workspace_id = await _admin_of_workspace(request, state)
    month = ledger_month(request.query_params.get("month"))
    rows = await state.store.io(
        state.store.ledger,
        month=month,
        workspace_id=workspace_id,
        install_id=request.query_params.get("installId"),
        app_id=request.query_params.get("appId"),
        payer_id=request.query_params.get("payer"),
    )
    if request.query_params.get("format") == "csv":
        return _csv(rows, f"runnerd-ledger-{month or 'all'}.csv")
    return json_response(LedgerList(data=[LedgerRow(**r) for r in rows]))


def ledger_csv(
    rows: list[dict[str, Any]],
    *,
    header: Literal["wire", "columns"] = "wire",
    line_end: str = "\r\n",
) -> str:
    """Ledger rows as CSV on every surface, an empty cell for null: the wire's names
    (camelCase) as the header of this API's download; the store's column names, and
    newline line ends, for ``runnerd ledger export``."""
    fields = list(LedgerRow.__struct_fields__)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator=line_end)
    writer.writerow([_camel(f) for f in fields] if header == "wire" else fields)
    for row in rows:
        writer.writerow(["" if row.get(f) is None else row[f] for f in fields])
    return out.getvalue()


def _csv(rows: list[dict[str, Any]], filename: str) -> Response:
    """Ledger rows as a CSV download (ledger_csv)."""
    return Response(
        ledger_csv(rows),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


async def get_audit(request: Request, state: AppState) -> Response:
    workspace_id = await _admin_of_workspace(request, state)
    cursor = int_query(request, "cursor", 0, 0, 2**62)
    limit = int_query(request, "limit", 100, 1, 1000)
    entries = await state.store.io(
        state.store.audit_entries,
        workspace_id=workspace_id,
        action=request.query_params.get("action"),
        install_id=request.query_params.get("installId"),
        after_seq=cursor,
        limit=limit,
    )
    data = [wire_view(AuditInfo, e) for e in entries]
    next_cursor = str(entries[-1].seq) if len(entries) == limit else None
    return json_response(AuditList(data=data, next_cursor=next_cursor))


# --- approvals --------------------------------------------------------------------------------


def _approval_info(a: ApprovalRow) -> ApprovalInfo:
    return wire_view(ApprovalInfo, a, id="approval_id")


async def list_approvals(request: Request, state: AppState) -> Response:
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    caller = await caller_of(request, state, "api:read")
    caller.need_person()
    await caller.member(state.store, workspace_id, role="member")
    await state.governor.approvals.expire()
    status = request.query_params.get("status")
    rows = await state.store.io(state.store.list_approvals, workspace_id, status)
    return json_response(ApprovalList(data=[_approval_info(a) for a in rows]))


async def _decide(request: Request, state: AppState, approve: bool) -> Response:
    """The governor decides (expiry, who may see and decide it); this translates."""
    caller = await caller_of(request, state, "tools:run")
    decided = await state.governor.decide(
        str(request.path_params["approvalId"]), approve=approve, who=caller.principal()
    )
    return json_response(_approval_info(decided))


async def approve(request: Request, state: AppState) -> Response:
    return await _decide(request, state, True)


async def deny(request: Request, state: AppState) -> Response:
    return await _decide(request, state, False)


# --- runs -------------------------------------------------------------------------------------


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
    cached = state.governor.results.get(row.id) if row.status != "running" and entitled else None
    if cached is not None:
        detail = RunDetail(
            run=detail.run, output=cached.output, error=cached.error, output_available=True
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


_NAME = Param(
    "name",
    "The secret's name (an environment variable name).",
    required=True,
    max_length=MAX_SECRET_NAME_CHARS,
    where="path",
    pattern=f"^{SECRET_NAME.pattern}$",
)
_APPROVAL = Param(
    "approvalId", "The approval.", required=True, max_length=MAX_ID_CHARS, where="path"
)

OPS = [
    Op(
        "PUT",
        "/api/v2/apps/installs/{installId}/secrets/{name}",
        "setSecret",
        "Set a secret of an install (admins)",
        put_secret,
        SecretInfo,
        body=SecretBody,
        params=(INSTALL_ID, _NAME),
        description="The value is encrypted at rest and never returned by any endpoint.",
    ),
    Op(
        "DELETE",
        "/api/v2/apps/installs/{installId}/secrets/{name}",
        "deleteSecret",
        "Delete a secret of an install (admins)",
        delete_secret,
        Deleted,
        params=(INSTALL_ID, _NAME),
    ),
    Op(
        "GET",
        "/api/v2/apps/installs/{installId}/secrets",
        "listSecrets",
        "List the names of an install's secrets (builders and admins)",
        list_secrets,
        SecretList,
        params=(INSTALL_ID,),
    ),
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
    Op(
        "GET",
        "/api/v2/ledger",
        "getLedger",
        "The usage ledger of a workspace (admins)",
        get_ledger,
        LedgerList,
        params=(
            WORKSPACE,
            Param("month", "YYYY-MM", max_length=7, pattern=f"^{MONTH.pattern}$"),
            Param("installId", "Only this install.", max_length=MAX_ID_CHARS),
            Param("appId", "Only this app.", max_length=MAX_ID_CHARS),
            Param("payer", "Only this payer (workspace id or workflow run id).", max_length=128),
            Param(
                "format",
                "csv for a CSV download (default: JSON).",
                max_length=4,
                pattern="^(json|csv)$",
            ),
        ),
        description="With format=csv, the same rows as a CSV file (text/csv), one column "
        "per field.",
    ),
    Op(
        "GET",
        "/api/v2/audit",
        "getAudit",
        "The audit trail of a workspace (admins)",
        get_audit,
        AuditList,
        params=(
            WORKSPACE,
            Param("action", "Only this action or family (tool, app...).", max_length=MAX_ID_CHARS),
            Param("installId", "Only this install.", max_length=MAX_ID_CHARS),
            Param("cursor", "nextCursor of the previous page.", integer=(0, 2**62)),
            Param("limit", "1 to 1000 (default 100).", integer=(1, 1000)),
        ),
    ),
    Op(
        "GET",
        "/api/v2/approvals",
        "listApprovals",
        "Approvals of write calls",
        list_approvals,
        ApprovalList,
        params=(WORKSPACE, Param("status", "pending, approved, denied, expired", max_length=16)),
    ),
    Op(
        "POST",
        "/api/v2/approvals/{approvalId}/approve",
        "approve",
        "Approve a write call: releases exactly one run",
        approve,
        ApprovalInfo,
        params=(_APPROVAL,),
        errors=(400, 401, 403, 404, 409, 429, 500),
    ),
    Op(
        "POST",
        "/api/v2/approvals/{approvalId}/deny",
        "deny",
        "Deny a write call",
        deny,
        ApprovalInfo,
        params=(_APPROVAL,),
        errors=(400, 401, 403, 404, 409, 429, 500),
    ),
]
