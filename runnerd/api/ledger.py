"""The usage ledger and the audit trail of a workspace (admins): the ledger as JSON or as
a CSV download (ledger_month and ledger_csv serve ``runnerd ledger export`` too), the
audit trail's entries, and the verdict on its hash chain."""

from __future__ import annotations

import csv
import io
import re
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import caller_of
from runnerd.api.bodies import AuditInfo, AuditList, AuditVerdict, LedgerList, LedgerRow, wire_view
from runnerd.api.ops import WORKSPACE, Op, Param, int_query, json_response, query_param
from runnerd.api.state import AppState
from runnerd.errors import InvalidQuery
from runnerd.limits import MAX_ID_CHARS

__all__ = ["OPS", "ledger_csv", "ledger_month"]


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


async def verify_audit(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    caller.need_person()
    workspace_id = request.query_params.get("workspaceId", "")
    await caller.member(state.store, workspace_id, role="admin", apps=False)
    # The workspace's own chain (and the trail written before chains): its trail.
    found = await state.store.io(state.store.audit_verdict, workspace_id=workspace_id)
    return json_response(
        AuditVerdict(
            ok=found.first_break is None,
            entries=found.entries,
            first_break=found.first_break,
            problem=found.problem,
            head_seq=found.head_seq,
            head_hash=found.head_hash,
        )
    )


OPS = [
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
        "POST",
        "/api/v2/audit/verify",
        "verifyAudit",
        "Verify the workspace's audit chain and the trail before chains (admins)",
        verify_audit,
        AuditVerdict,
        params=(Param("workspaceId", "The workspace.", required=True, max_length=MAX_ID_CHARS),),
    ),
]
