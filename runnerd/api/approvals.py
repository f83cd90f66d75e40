"""Approvals of write calls: a workspace's list, and approving or denying one (the
governor decides, with its expiry and who may see and decide it; this translates)."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import caller_of
from runnerd.api.bodies import ApprovalInfo, ApprovalList, wire_view
from runnerd.api.ops import WORKSPACE, Op, Param, json_response, query_param
from runnerd.api.state import AppState
from runnerd.errors import InvalidQuery
from runnerd.govern.approvals import Approvals
from runnerd.limits import MAX_ID_CHARS
from runnerd.store import ApprovalRow

__all__ = ["OPS"]


_STATUSES = ("pending", "approved", "denied", "expired")


def _approval_info(a: ApprovalRow, *, may_decide: bool | None = None) -> ApprovalInfo:
    info = wire_view(ApprovalInfo, a, id="approval_id")
    return info if may_decide is None else msgspec.structs.replace(info, may_decide=may_decide)


async def list_approvals(request: Request, state: AppState) -> Response:
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    caller = await caller_of(request, state, "api:read")
    caller.need_person()
    member = await caller.member(state.store, workspace_id, role="member")
    await state.governor.approvals.expire()
    status = request.query_params.get("status") or None
    if status is not None and status not in _STATUSES:
        raise InvalidQuery("status", f"status is one of {', '.join(_STATUSES)}")
    rows = await state.store.io(state.store.list_approvals, workspace_id, status)
    user_id = caller.principal().user_id
    data = [
        _approval_info(
            a, may_decide=a.status == "pending" and Approvals.decides(a, user_id, member)
        )
        for a in rows
    ]
    return json_response(ApprovalList(data=data))


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


_APPROVAL = Param(
    "approvalId", "The approval.", required=True, max_length=MAX_ID_CHARS, where="path"
)


OPS = [
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
