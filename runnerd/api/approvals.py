"""Approvals of write calls: a workspace's list, one approval, and approving or denying
one (the governor decides, with its expiry and who may see and decide it; this
translates). The people who may decide a pending approval also get its held input. And
what a workspace's admins set around them: each app's approval rule (who approves its
relay calls) and the workspace's webhook (told when an approval waits)."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import caller_of, workspace_admin
from runnerd.api.bodies import (
    ApprovalInfo,
    ApprovalList,
    ApprovalRuleBody,
    ApprovalRuleInfo,
    ApprovalRuleList,
    WebhookBody,
    WebhookDeleted,
    WebhookInfo,
    wire_view,
)
from runnerd.api.ops import WORKSPACE, Op, Param, json_response, query_param
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.errors import (
    AppNotFound,
    ApprovalNotFound,
    InsufficientRole,
    InvalidApprovalRule,
    InvalidQuery,
    WebhookNotFound,
)
from runnerd.govern.admission import has_role, may_run
from runnerd.govern.approvals import Approvals
from runnerd.govern.notify import new_webhook_secret, webhook_url
from runnerd.limits import MAX_ID_CHARS, MAX_SLUG_CHARS, MAX_SMALL_BODY_BYTES
from runnerd.model import Role
from runnerd.store import (
    ApprovalRow,
    ApprovalRule,
    InstallRecord,
    MembershipRecord,
    Store,
    WebhookRow,
)
from runnerd.store.approval_rules import webhook_sealed_name

__all__ = ["OPS"]


_STATUSES = ("pending", "approved", "denied", "expired")


def _approval_info(a: ApprovalRow, *, may_decide: bool | None = None) -> ApprovalInfo:
    info = wire_view(ApprovalInfo, a, id="approval_id")
    return info if may_decide is None else msgspec.structs.replace(info, may_decide=may_decide)


def _for_deciders(
    store: Store, approvals: Approvals, shown: list[tuple[ApprovalInfo, ApprovalRow]]
) -> list[ApprovalInfo]:
    """Each ``info`` with what only a person who may decide its approval sees: the
    asker's email, the held input and the tool's input schema (called once, through
    ``store.io``, for all the rows a caller may decide)."""
    found = []
    for info, a in shown:
        asker = store.get_user(a.requested_by)
        tool = store.get_tool(a.version_id, a.tool)
        held, value = approvals.held_input(a)
        found.append(
            msgspec.structs.replace(
                info,
                requested_by_email=asker.email if asker else msgspec.UNSET,
                input=value if held else msgspec.UNSET,
                input_schema=tool.input_schema if tool else msgspec.UNSET,
            )
        )
    return found


async def _shown(
    state: AppState,
    rows: list[tuple[ApprovalRow, ApprovalRule | None]],
    user_id: str,
    member: MembershipRecord | None,
) -> list[ApprovalInfo]:
    """Approvals (each with its app's rule) as ``user_id`` sees them: ``mayDecide``,
    and to a decider the input."""
    infos: list[ApprovalInfo] = []
    deciding: list[tuple[int, ApprovalRow]] = []
    for a, rule in rows:
        may = a.status == "pending" and Approvals.decides(a, user_id, member, rule)
        if may:
            deciding.append((len(infos), a))
        infos.append(_approval_info(a, may_decide=may))
    if deciding:
        opened = await state.store.io(
            _for_deciders,
            state.store,
            state.governor.approvals,
            [(infos[i], a) for i, a in deciding],
        )
        for (i, _), info in zip(deciding, opened, strict=True):
            infos[i] = info
    return infos


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
    rules = {r.app_slug: r for r in await state.store.io(state.store.approval_rules, workspace_id)}
    user_id = caller.principal().user_id
    data = await _shown(state, [(a, rules.get(a.app_slug or "")) for a in rows], user_id, member)
    return json_response(ApprovalList(data=data))


async def get_approval(request: Request, state: AppState) -> Response:
    """One approval, to the members of its workspace (members and up, as the list);
    APPROVAL_NOT_FOUND for anyone else."""
    caller = await caller_of(request, state, "api:read")
    user_id = caller.need_person()
    await state.governor.approvals.expire()
    store = state.store
    approval = await store.io(store.find_approval, str(request.path_params["approvalId"]))
    member = (
        None
        if approval is None
        else await store.io(store.membership, approval.workspace_id, user_id)
    )
    if approval is None or member is None:
        raise ApprovalNotFound
    if not has_role(member, "member"):
        raise InsufficientRole
    rule = await store.io(store.approval_rule_of_install, approval.install_id)
    [shown] = await _shown(state, [(approval, rule)], user_id, member)
    return json_response(shown)


async def _decide(request: Request, state: AppState, approve: bool) -> Response:
    """The governor decides (expiry, who may see and decide it); this translates."""
    caller = await caller_of(request, state, "tools:run")
    decided = await state.governor.decide(
        str(request.path_params["approvalId"]), approve=approve, who=caller.principal()
    )
    # As the list shows it: with its app and version (decided: nobody may decide it now).
    shown = await state.store.io(state.store.find_approval, decided.id) or decided
    return json_response(_approval_info(shown, may_decide=False))


async def approve(request: Request, state: AppState) -> Response:
    return await _decide(request, state, True)


async def deny(request: Request, state: AppState) -> Response:
    return await _decide(request, state, False)


# --- approval rules and the webhook (admins) --------------------------------------------------

_ROLE_ORDER: tuple[Role, ...] = ("admin", "builder", "member")


def _rule_info(rule: ApprovalRule) -> ApprovalRuleInfo:
    return ApprovalRuleInfo(
        app_slug=rule.app_slug,
        roles=list(rule.roles),
        user_ids=list(rule.user_ids),
        updated_at=rule.updated_at,
        updated_by=rule.updated_by,
    )


async def _rules(state: AppState, workspace_id: str) -> ApprovalRuleList:
    rules = await state.store.io(state.store.approval_rules, workspace_id)
    return ApprovalRuleList(data=[_rule_info(r) for r in rules])


async def list_rules(request: Request, state: AppState) -> Response:
    _, workspace_id = await workspace_admin(request, state, "api:read")
    return json_response(await _rules(state, workspace_id))


def _check_deciders(store: Store, workspace_id: str, user_ids: tuple[str, ...]) -> None:
    """InvalidApprovalRule unless every person named may decide here: a member who may
    run tools (a viewer, or one without the Apps module, could never decide)."""
    for user_id in user_ids:
        member = store.membership(workspace_id, user_id)
        if member is None:
            raise InvalidApprovalRule("userIds", f"{user_id} is not in this workspace")
        if not may_run(member):
            raise InvalidApprovalRule(
                "userIds", f"{user_id} may not run tools in this workspace, so cannot decide"
            )


async def _installed_app(request: Request, state: AppState, workspace_id: str) -> InstallRecord:
    """The workspace's install of the app in the path (``{appSlug}``); APP_NOT_FOUND."""
    slug = str(request.path_params["appSlug"])
    install = await state.store.io(state.store.install_of_app, workspace_id, slug)
    if install is None:
        raise AppNotFound(slug)
    return install


async def put_rule(request: Request, state: AppState) -> Response:
    """Set who approves an app's relay calls: it replaces the workspace default (the
    approver flag, or an admin) for that app. Chat calls stay the asker's to decide."""
    caller, workspace_id = await workspace_admin(request, state, "apps:write")
    store = state.store
    install = await _installed_app(request, state, workspace_id)
    body = await read_body(request, ApprovalRuleBody, MAX_SMALL_BODY_BYTES)
    roles = tuple(r for r in _ROLE_ORDER if r in body.roles)
    user_ids = tuple(dict.fromkeys(body.user_ids))
    if not roles and not user_ids:
        raise InvalidApprovalRule(
            "roles",
            "an approval rule names at least one role or person (DELETE it to go back to "
            "the workspace's default: approvers and admins)",
        )
    await store.io(_check_deciders, store, workspace_id, user_ids)
    await store.io(
        store.set_approval_rule,
        workspace_id,
        install.app_id,
        roles=roles,
        user_ids=user_ids,
        actor_user_id=caller.user_id,
        actor_key_id=caller.key.id,
    )
    rule = await store.io(store.approval_rule_of_install, install.id)
    assert rule is not None
    return json_response(_rule_info(rule))


async def delete_rule(request: Request, state: AppState) -> Response:
    """Drop an app's rule: its relay calls go back to the workspace default. The rules
    that remain (a rule already gone changes nothing)."""
    caller, workspace_id = await workspace_admin(request, state, "apps:write")
    store = state.store
    install = await _installed_app(request, state, workspace_id)
    await store.io(
        store.delete_approval_rule,
        workspace_id,
        install.app_id,
        actor_user_id=caller.user_id,
        actor_key_id=caller.key.id,
    )
    return json_response(await _rules(state, workspace_id))


def _webhook_info(row: WebhookRow, secret: str | None = None) -> WebhookInfo:
    return WebhookInfo(
        url=row.url,
        created_at=row.created_at,
        updated_at=row.updated_at,
        secret=secret if secret is not None else msgspec.UNSET,
    )


async def get_webhook(request: Request, state: AppState) -> Response:
    _, workspace_id = await workspace_admin(request, state, "api:read")
    row = await state.store.io(state.store.webhook, workspace_id)
    if row is None:
        raise WebhookNotFound
    return json_response(_webhook_info(row))


async def put_webhook(request: Request, state: AppState) -> Response:
    """Set the workspace's webhook. A new webhook (or ``newSecret``) gets a new signing
    secret, in this answer only; it is kept sealed by the vault, as secrets are."""
    caller, workspace_id = await workspace_admin(request, state, "apps:write")
    body = await read_body(request, WebhookBody, MAX_SMALL_BODY_BYTES)
    url = await webhook_url(body.url, state.settings)
    store = state.store
    current = await store.io(store.webhook, workspace_id)
    secret = new_webhook_secret() if current is None or body.new_secret else None
    sealed = (
        None
        if secret is None
        else state.governor.vault.seal(workspace_id, webhook_sealed_name(workspace_id), secret)
    )
    row = await store.io(
        store.set_webhook,
        workspace_id,
        url,
        sealed=sealed,
        actor_user_id=caller.user_id,
        actor_key_id=caller.key.id,
    )
    return json_response(_webhook_info(row, secret))


async def delete_webhook(request: Request, state: AppState) -> Response:
    caller, workspace_id = await workspace_admin(request, state, "apps:write")
    deleted = await state.store.io(
        state.store.delete_webhook,
        workspace_id,
        actor_user_id=caller.user_id,
        actor_key_id=caller.key.id,
    )
    if not deleted:
        raise WebhookNotFound
    return json_response(WebhookDeleted(deleted=True))


_APPROVAL = Param(
    "approvalId", "The approval.", required=True, max_length=MAX_ID_CHARS, where="path"
)
_WORKSPACE_PATH = Param(
    "workspaceId", "The workspace.", required=True, max_length=MAX_ID_CHARS, where="path"
)
_APP_SLUG = Param("appSlug", "The app.", required=True, max_length=MAX_SLUG_CHARS, where="path")


OPS = [
    Op(
        "GET",
        "/api/v2/approvals",
        "listApprovals",
        "Approvals of write calls",
        list_approvals,
        ApprovalList,
        params=(WORKSPACE, Param("status", "pending, approved, denied, expired", max_length=16)),
        description="To the people who may decide a pending approval (mayDecide), it also "
        "carries requestedByEmail, the held input and the tool's inputSchema.",
    ),
    Op(
        "GET",
        "/api/v2/approvals/{approvalId}",
        "getApproval",
        "One approval of a write call (members and up)",
        get_approval,
        ApprovalInfo,
        params=(_APPROVAL,),
        description="To a person who may decide it, while pending, with requestedByEmail, "
        "the held input and the tool's inputSchema.",
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
    Op(
        "GET",
        "/api/v2/workspaces/{workspaceId}/approval-rules",
        "listApprovalRules",
        "Who approves each app's write calls from relays (admins)",
        list_rules,
        ApprovalRuleList,
        params=(_WORKSPACE_PATH,),
    ),
    Op(
        "PUT",
        "/api/v2/workspaces/{workspaceId}/approval-rules/{appSlug}",
        "putApprovalRule",
        "Set who approves an app's write calls from relays (admins)",
        put_rule,
        ApprovalRuleInfo,
        body=ApprovalRuleBody,
        params=(_WORKSPACE_PATH, _APP_SLUG),
        description="The rule replaces the workspace default (the approver flag, or an "
        "admin) for the app's relay calls; chat calls stay the asker's. 400 "
        "INVALID_APPROVAL_RULE for a rule with no role and no person, or a person who may "
        "not run tools in the workspace; 404 APP_NOT_FOUND unless the app is installed here.",
    ),
    Op(
        "DELETE",
        "/api/v2/workspaces/{workspaceId}/approval-rules/{appSlug}",
        "deleteApprovalRule",
        "Drop an app's approval rule: back to the workspace default (admins)",
        delete_rule,
        ApprovalRuleList,
        params=(_WORKSPACE_PATH, _APP_SLUG),
    ),
    Op(
        "GET",
        "/api/v2/workspaces/{workspaceId}/webhook",
        "getWebhook",
        "The workspace's webhook for approvals that wait (admins); never its secret",
        get_webhook,
        WebhookInfo,
        params=(_WORKSPACE_PATH,),
    ),
    Op(
        "PUT",
        "/api/v2/workspaces/{workspaceId}/webhook",
        "putWebhook",
        "Set the workspace's webhook (admins); a new signing secret is in this answer only",
        put_webhook,
        WebhookInfo,
        body=WebhookBody,
        params=(_WORKSPACE_PATH,),
        description="400 INVALID_WEBHOOK_URL for a URL that is not http(s), or that "
        "reaches this runnerd itself. Deliveries: docs/GOVERNANCE.md.",
    ),
    Op(
        "DELETE",
        "/api/v2/workspaces/{workspaceId}/webhook",
        "deleteWebhook",
        "Remove the workspace's webhook (admins)",
        delete_webhook,
        WebhookDeleted,
        params=(_WORKSPACE_PATH,),
    ),
]
