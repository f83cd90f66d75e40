"""MCP for chat agents, on the official MCP Python SDK's lowlevel server: what the tools
of ``/mcp?workspaceId=…`` are, and how a call of one is translated to the governor and
back. Who may talk MCP, and the sessions they open, are mcp/sessions.py's.

- ``tools/list``: the tools the person may run there (member and up, Apps module),
  named ``<app-slug>__<tool_name>``; ``annotations`` say read or write. One more tool,
  ``runnerd.approval``, reads what became of a call held for approval.
- ``tools/call``: the same governed call as the API (govern/governor.py), surface
  ``chat``, the person recorded: role, budget, rate limit, audit (refusals included),
  ledger and approvals all apply. A run that started is a result (``isError`` when it
  failed or timed out); a refusal is an ``isError`` result whose text (JSON) and
  ``_meta["runnerd/error"]`` carry the API's code, reason, message and details; an
  unknown tool is an MCP error. No error result ever has structuredContent (a client
  checks it against the tool's output schema): a success's is the checked output. Each refusal is
  counted in ``runnerd_refusals_total`` as the API's are.
- A ``write`` tool asks the person first, in the form the session's revision has: from
  2026-07-28 an ``InputRequiredResult``, before it an ``elicitation/create`` request
  during the call. The form shows the tool, its effect and the exact input; the answer
  decides the approval held for that input (accept: the run, and its result; anything
  else, a client's error included: denied, nothing runs), through ``Governor.decide``
  as the API's decisions go. A client that cannot elicit gets an ``isError`` answer
  that says the call waits, with the approval id, its expiry and the Manage page's
  URL (also in ``_meta["runnerd/approval"]``); someone decides through the API or the
  Manage page, and ``runnerd.approval`` reads the outcome.
- Installing, switching or rolling back sends ``notifications/tools/list_changed``: in
  the 2025 eras on each initialized session's GET stream (the handshake announces
  ``tools.listChanged``), from 2026-07-28 to the streams listening
  (``subscriptions/listen``).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import is_version_at_least
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from runnerd import __version__
from runnerd.api.auth import Caller
from runnerd.api.errors import ApiError, count_refusal, envelope
from runnerd.errors import (
    ApprovalNotFound,
    ApprovalOfAnotherCall,
    InstallNotFound,
    InsufficientRole,
    RunnerdError,
    ToolNotFound,
)
from runnerd.govern.admission import Principal
from runnerd.govern.approvals import CallOf
from runnerd.govern.results import OUTPUT_MISSING, CallResult, Pending, may_see_output
from runnerd.limits import APPROVAL_POLL_S, MAX_MCP_SESSIONS
from runnerd.mcp.sessions import SessionGuard, authorize
from runnerd.model import Surface

if TYPE_CHECKING:
    from runnerd.api.state import AppState

__all__ = ["APPROVAL_TOOL", "SEPARATOR", "McpGateway", "mcp_name"]

SEPARATOR = "__"  # app slug and tool name: slugs have single hyphens, so no clash
APPROVAL_TOOL = "runnerd.approval"  # a dot: no app tool can be named so
INSTRUCTIONS = (
    "Tools of the apps installed in this runnerd workspace. Each runs in a sandbox and is "
    "metered; a tool marked destructive (effect write) asks the person before it runs."
)
# The first revision that asks inside the call's result (InputRequiredResult); older
# ones ask with a server-to-client elicitation/create request during the call.
INPUT_REQUIRED_VERSION = "2026-07-28"
_NOT_THIS_CALL = "the confirmation does not match this call"

log = logging.getLogger(__name__)


def mcp_name(app_slug: str, tool: str) -> str:
    return f"{app_slug}{SEPARATOR}{tool}"


class _Server(Server[Any]):
    """The lowlevel server, whose handshake says ``tools.listChanged``: the 2025 eras are
    told on their session's stream when tools change (from 2026-07-28 the SDK derives it
    from ``subscriptions/listen``, which is served)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


class McpGateway:
    """The MCP server of the daemon, behind its session guard, and its tools-changed bus."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.bus = InMemorySubscriptionBus()
        self.server: Server[Any] = _Server(
            "runnerd",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self.bus),
        )
        # A 2025-era session is told of tool changes once its client is initialized.
        self.server.add_notification_handler(
            "notifications/initialized", types.NotificationParams, self._initialized
        )
        # The key on every request is the protection; no cookie is ever honoured here.
        self.server.streamable_http_app(
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            session_idle_timeout=state.settings.mcp_session_idle_s,
            max_sessions=MAX_MCP_SESSIONS,  # the last guard, behind the guard's caps
        )
        manager = self.server.session_manager
        self.guard = SessionGuard(
            state, StreamableHTTPASGIApp(manager), manager.session_idle_timeout
        )

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The session manager's task group, and the guard's watch that ends the sessions
        and streams of revoked keys, for the daemon's lifespan."""
        async with self.server.session_manager.run(), anyio.create_task_group() as tasks:
            tasks.start_soon(self.guard.watch)
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()

    async def tools_changed(self) -> None:
        await self.bus.publish(ToolsListChanged())  # 2026-07-28: subscriptions/listen
        await self.guard.tools_changed()  # the 2025 eras: each session's GET stream

    async def _initialized(self, ctx: Any, params: types.NotificationParams) -> None:
        """``notifications/initialized`` of a 2025-era session: from now on it is sent
        ``notifications/tools/list_changed`` (on its standalone channel, the GET stream)."""
        if isinstance(ctx.request, Request):
            session_id = ctx.request.headers.get(MCP_SESSION_ID_HEADER)
            if session_id:
                self.guard.listens(session_id, ctx.session)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.guard(scope, receive, send)

    async def _context(self, ctx: Any) -> tuple[AppState, Caller, str]:
        if not isinstance(ctx.request, Request):
            raise MCPError(types.INVALID_REQUEST, "runnerd serves MCP over HTTP only")
        try:
            caller, workspace_id = await authorize(self.state, ctx.request, spend=False)
        except RunnerdError as exc:
            error = _counted(exc)
            raise MCPError(types.INVALID_REQUEST, error.message, _wire(error)) from None
        return self.state, caller, workspace_id

    # --- tools/list ----------------------------------------------------------------------

    async def _list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        state, caller, workspace_id = await self._context(ctx)
        try:
            await caller.member(state.store, workspace_id, role="member")
        except InsufficientRole:
            return types.ListToolsResult(tools=[])  # a viewer may run nothing
        tools = [
            types.Tool(
                name=mcp_name(install.app_slug, tool.name),
                title=f"{install.app_slug}/{tool.name}",
                description=tool.description,
                input_schema=tool.input_schema,
                output_schema=tool.output_schema,
                annotations=types.ToolAnnotations(
                    title=f"{install.app_slug}/{tool.name}",
                    read_only_hint=tool.effect == "read",
                    destructive_hint=tool.effect == "write",
                    open_world_hint=bool(install.egress),
                ),
            )
            for install, tool in await state.store.io(
                state.store.installed_tools, workspace_id, None
            )
        ]
        tools.append(
            types.Tool(
                name=APPROVAL_TOOL,
                title="What became of a call held for approval",
                description="The status of a write call that waits for approval, and once "
                "approved and run, its result. Pass the approvalId the call returned.",
                input_schema={
                    "type": "object",
                    "properties": {"approvalId": {"type": "string", "minLength": 1}},
                    "required": ["approvalId"],
                    "additionalProperties": False,
                },
                annotations=types.ToolAnnotations(read_only_hint=True),
            )
        )
        return types.ListToolsResult(tools=tools)

    # --- tools/call ----------------------------------------------------------------------

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        state, caller, workspace_id = await self._context(ctx)
        who = caller.principal()
        arguments = params.arguments or {}
        if params.name == APPROVAL_TOOL:
            return await self._approval_result(state, who, workspace_id, arguments)
        slug, sep, tool_name = params.name.partition(SEPARATOR)
        install = (
            await state.store.io(state.store.install_of_app, workspace_id, slug) if sep else None
        )
        if install is None:
            raise _unknown_tool(
                params.name, InstallNotFound("The workspace has no install of this app")
            )
        try:
            # The governor finds the tool, and audits an unknown one as the API's refusal.
            await state.governor.tool_to_call(
                install, tool_name, who=who, surface=mcp_surface(caller)
            )
        except ToolNotFound as exc:
            raise _unknown_tool(params.name, exc) from None
        try:
            if params.request_state is not None:
                return await self._confirmed(state, who, install, tool_name, arguments, params)
            # The governor checks the person's role, and audits its refusals as the API's.
            outcome = await state.governor.call(
                install, tool_name, arguments, who=who, surface=mcp_surface(caller)
            )
            if isinstance(outcome, Pending):
                if mcp_surface(caller) == "relay":  # its approvers decide, not the asker
                    return _pending(state, outcome)
                asking = _Asking(install.app_slug, tool_name, arguments)
                return await self._ask(state, ctx, who, asking, outcome)
        except RunnerdError as exc:
            return _refused(exc)
        return _result(outcome)

    async def _ask(
        self, state: AppState, ctx: Any, who: Principal, asking: _Asking, held: Pending
    ) -> types.CallToolResult | types.InputRequiredResult:
        """A held write call: ask the person in the form the session's protocol revision
        has, or say it waits. From 2026-07-28 an ``InputRequiredResult`` (the retry
        decides, ``_confirmed``); before it, an ``elicitation/create`` request during the
        call (``_elicit``): an older client cannot read an ``InputRequiredResult``."""
        capabilities = ctx.session.client_capabilities
        if capabilities is None or capabilities.elicitation is None:
            return _pending(state, held)
        if is_version_at_least(ctx.protocol_version, INPUT_REQUIRED_VERSION):
            return types.InputRequiredResult(
                input_requests={"confirm": types.ElicitRequest(params=_confirm_form(asking))},
                request_state=state.call_signer.sign(held.approval_id),  # unforgeable
            )
        if not ctx.session.can_send_request:
            return _pending(state, held)  # no channel to ask on: it waits
        if _url_only(capabilities.elicitation):
            return await self._elicit_url(state, ctx, who, held)
        return await self._elicit(state, ctx, who, asking, held)

    async def _elicit_url(
        self, state: AppState, ctx: Any, who: Principal, held: Pending
    ) -> types.CallToolResult:
        """A client that shows URLs but no forms (2025-11-25's URL mode): it is asked to
        send the person to the Manage page's Approvals screen, where they approve or deny
        the call; the call waits for that decision (until the approval expires) and then
        answers as after a form: the run's result, or declined. Declined or cancelled at
        the client, or no answer: denied at once, nothing runs. Cut off after the person
        was sent: the approval stays for them to decide (``runnerd.approval`` reads it)."""
        url = approvals_url(state)
        message = (
            f"Approve or deny the write call {held.approval_id} on runnerd's Manage page "
            f"(it expires at {held.expires_at})."
        )
        answer: types.ElicitResult | None = None
        try:
            with anyio.move_on_after(state.governor.approvals.ttl_s):
                answer = await ctx.session.elicit_url(
                    message, url, held.approval_id, related_request_id=ctx.request_id
                )
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await state.governor.decide(held.approval_id, approve=False, who=who)
            raise
        except Exception as exc:  # the client's error, or an answer that is no ElicitResult
            log.info("MCP URL confirmation of %s failed (%s): denied", held.approval_id,
                     type(exc).__name__)  # fmt: skip
        if answer is None or answer.action != "accept":
            await state.governor.decide(held.approval_id, approve=False, who=who)
            said = "Declined" if answer is not None else "Not confirmed (the client gave no answer)"
            return _declined(said, held.approval_id)
        approval = await self._decision(state, held.approval_id)
        with contextlib.suppress(Exception):  # the client may retry on it; it may be gone
            await ctx.session.send_elicit_complete(held.approval_id, ctx.request_id)
        if approval is not None and approval.status == "approved" and approval.run_id:
            return _result(await state.governor.outcome(approval.run_id))
        status = "expired" if approval is None else approval.status
        return _error_result(
            f"Not approved ({status}): the call did not run ({held.approval_id}).",
            {"runnerd/approval": {"status": status, "approvalId": held.approval_id}},
        )

    @staticmethod
    async def _decision(state: AppState, approval_id: str) -> Any:
        """The approval once someone decided it on any node (or it expired): read from
        the store every ``APPROVAL_POLL_S``."""
        while True:
            await state.governor.approvals.expire()
            approval = await state.store.io(state.store.get_approval, approval_id)
            if approval is None or approval.status != "pending":
                return approval
            await anyio.sleep(APPROVAL_POLL_S)

    async def _elicit(
        self, state: AppState, ctx: Any, who: Principal, asking: _Asking, held: Pending
    ) -> types.CallToolResult:
        """The 2025 eras: ask over ``elicitation/create`` while the call waits, and
        decide its approval by the answer, at once. Anything but an accepted, ticked box
        denies it (an error, a malformed answer, no answer within the approval's time, the
        call cut off): nothing is left pending that the client was never able to show."""
        form = _confirm_form(asking)
        answer: types.ElicitResult | None = None
        try:
            with anyio.move_on_after(state.governor.approvals.ttl_s):
                answer = await ctx.session.elicit_form(
                    form.message, form.requested_schema, related_request_id=ctx.request_id
                )
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await state.governor.decide(held.approval_id, approve=False, who=who)
            raise
        except Exception as exc:  # the client's error, or an answer that is no ElicitResult
            log.info(
                "MCP confirmation of %s failed (%s): denied", held.approval_id, type(exc).__name__
            )
        accepted = (
            answer is not None
            and answer.action == "accept"
            and (answer.content or {}).get("confirm") is True
        )
        decided = await state.governor.decide(held.approval_id, approve=accepted, who=who)
        if accepted and decided.run_id is not None:
            return _result(await state.governor.outcome(decided.run_id))
        said = "Declined" if answer is not None else "Not confirmed (the client gave no answer)"
        return _declined(said, held.approval_id)

    async def _confirmed(
        self,
        state: AppState,
        who: Principal,
        install: Any,
        tool_name: str,
        arguments: dict[str, Any],
        params: types.CallToolRequestParams,
    ) -> types.CallToolResult:
        """The retry of a held call, with the person's answer: the governor decides its
        approval (expired, who may decide, whether it holds this very call)."""
        approval_id = state.call_signer.unsign(params.request_state or "")
        if approval_id is None:
            raise MCPError(types.INVALID_PARAMS, _NOT_THIS_CALL)
        answer = (params.input_responses or {}).get("confirm")
        accepted = (
            isinstance(answer, types.ElicitResult)
            and answer.action == "accept"
            # The form's schema: a boolean. Only JSON true runs the write; "false", "0",
            # "yes", 1 or anything else a client sends for an unticked box does not.
            and (answer.content or {}).get("confirm") is True
        )
        try:
            decided = await state.governor.decide(
                approval_id,
                approve=accepted,
                who=who,
                call=CallOf(install.id, tool_name, arguments),
            )
        except (ApprovalNotFound, ApprovalOfAnotherCall):
            raise MCPError(types.INVALID_PARAMS, _NOT_THIS_CALL) from None
        if not accepted or decided.run_id is None:
            return _declined("Declined", decided.id)
        return _result(await state.governor.outcome(decided.run_id))

    async def _approval_result(
        self, state: AppState, who: Principal, workspace_id: str, arguments: dict[str, Any]
    ) -> types.CallToolResult:
        approval = await state.store.io(
            state.store.get_approval, str(arguments.get("approvalId", ""))
        )
        if approval is None or approval.workspace_id != workspace_id:
            return _refused(ApprovalNotFound())
        await state.governor.approvals.expire()
        approval = await state.store.io(state.store.get_approval, approval.id) or approval
        found: dict[str, Any] = {"approvalId": approval.id, "status": approval.status}
        if approval.run_id is None:
            return types.CallToolResult(
                content=[types.TextContent(text=json.dumps(found))], structured_content=found
            )
        run = await state.governor.outcome(approval.run_id)
        member = await state.store.io(state.store.membership, workspace_id, who.user_id)
        entitled = may_see_output(  # GET /api/v2/runs/{id}'s rule
            who.user_id,
            role=None if member is None else member.role,
            ran_for=approval.requested_by,
            released_by=approval.decided_by,
        )
        found["run"] = _run_fields(run) | {"outputAvailable": entitled and run.output_available}
        if entitled and run.missing is not None:
            found["run"]["outputMissing"] = run.missing
        if not entitled:
            found["run"] |= {"output": None, "error": None}
        text = json.dumps(found, ensure_ascii=False)
        if run.status != "succeeded":  # an error result: the same, without structuredContent
            return _error_result(text, {"runnerd/approval": found})
        return types.CallToolResult(
            content=[types.TextContent(text=text)], structured_content=found
        )


@dataclass(frozen=True)
class _Asking:
    """A held write call, as the person is asked about it."""

    slug: str
    tool: str
    arguments: dict[str, Any]


def _confirm_form(asking: _Asking) -> types.ElicitRequestFormParams:
    """The form that asks: the tool, what a write tool's run does, the exact input."""
    shown = json.dumps(asking.arguments, indent=2, ensure_ascii=False)
    ref = f"{asking.slug}/{asking.tool}"
    return types.ElicitRequestFormParams(
        message=f"Run {ref}? It is a write tool: the run is real, metered, and makes real "
        f"changes. Input:\n{shown}",
        requested_schema={
            "type": "object",
            "properties": {"confirm": {"type": "boolean", "title": f"Run {ref} with this input"}},
            "required": ["confirm"],
        },
    )


def _error_result(text: str, meta: dict[str, Any]) -> types.CallToolResult:
    """An ``isError`` result: ``text``, and ``meta`` as its ``_meta``; never
    structuredContent, which a client would check against the tool's output schema."""
    return types.CallToolResult.model_validate(
        {"content": [{"type": "text", "text": text}], "isError": True, "_meta": meta}
    )


def _declined(said: str, approval_id: str) -> types.CallToolResult:
    """A confirmation that did not approve: nothing ran; the approval's id and status in
    ``_meta["runnerd/approval"]``."""
    return _error_result(
        f"{said}: the call did not run ({approval_id}).",
        {"runnerd/approval": {"status": "declined", "approvalId": approval_id}},
    )


def _url_only(elicitation: types.ElicitationCapability) -> bool:
    """A client that declared URL-mode elicitation and not form mode (an empty
    ``elicitation: {}`` is form mode: what clients before 2025-11-25 send)."""
    return elicitation.url is not None and elicitation.form is None


def approvals_url(state: AppState) -> str:
    """The Manage page's Approvals screen, where a person decides a held call."""
    return f"{state.settings.public_base}/#/approvals"


def mcp_surface(caller: Caller) -> Surface:
    """The surface of a call over MCP: ``chat``, whatever key opened the session, except a
    relay's token (bound to ``relay``, api/surfaces.py), whose calls are ``relay`` here
    too: its write calls wait for the app's approvers, never only for the asker."""
    return "relay" if caller.key.kind == "token" and caller.key.surface == "relay" else "chat"


def _pending(state: AppState, held: Pending) -> types.CallToolResult:
    """A held call that waits for someone to decide, to a client that cannot ask the
    person: always ``isError`` without structuredContent (a client checks a non-error
    result against the tool's output schema, which a pending answer never matches), its
    text naming the approval, its deadline and the Manage page where a person decides
    it; the same in ``_meta["runnerd/approval"]``."""
    url = approvals_url(state)
    pending = {
        "status": "pending_approval",
        "approvalId": held.approval_id,
        "expiresAt": held.expires_at,
        "url": url,
    }
    text = (
        f"This write call waits for approval: approval {held.approval_id}, which expires "
        f"at {held.expires_at}. A person who may approve decides it on the Manage page, "
        f"{url} (or through the API); the call runs once approved. Read its outcome with "
        f"{APPROVAL_TOOL} and this approvalId."
    )
    return _error_result(text, {"runnerd/approval": pending})


def _run_fields(run: CallResult) -> dict[str, Any]:
    return {
        "runId": run.run_id,
        "status": run.status,
        "output": run.output,
        "error": run.error,
        "durationMs": run.duration_ms,
    }


def _result(run: CallResult) -> types.CallToolResult:
    """A run that started: its output as structuredContent (and as JSON text), or its
    scrubbed error with isError; the run's id and figures in ``_meta["runnerd/run"]``."""
    meta = {"runnerd/run": {"runId": run.run_id, "status": run.status,
                            "durationMs": run.duration_ms}}  # fmt: skip
    if run.missing is not None:  # a replay no node holds the output of: say so, no content
        meta["runnerd/run"]["outputMissing"] = run.missing
        return _error_result(
            f"The run {run.status}, but its output is not available: "
            f"{OUTPUT_MISSING[run.missing]} ({run.missing})",
            meta,
        )
    if run.status == "succeeded":
        text = json.dumps(run.output, ensure_ascii=False)
        return types.CallToolResult.model_validate(
            {"content": [{"type": "text", "text": text}], "structuredContent": run.output,
             "_meta": meta}
        )  # fmt: skip
    return _error_result(f"The run {run.status}: {run.error}", meta)


def _wire(exc: ApiError) -> dict[str, Any]:
    details = dict(exc.details or {})
    return {
        "code": exc.code,
        "reason": details.get("code", exc.code),
        "status": exc.status,
        "message": exc.message,
        "details": details,
    }


def _unknown_tool(name: str, exc: RunnerdError) -> MCPError:
    """The MCP error of a tool name the workspace has no tool of, its refusal counted."""
    _counted(exc)
    return MCPError(types.INVALID_PARAMS, f"no tool {name!r} in this workspace")


def _counted(exc: RunnerdError) -> ApiError:
    """The API's envelope of a refusal, counted as the API counts its own."""
    error = envelope(exc)
    count_refusal(error)
    return error


def _refused(exc: RunnerdError) -> types.CallToolResult:
    """A refusal before any run: isError, no structuredContent (it would be checked
    against the tool's output schema); the API's code, reason, message and details (a
    bad field's pointer) as JSON text, and the same in ``_meta["runnerd/error"]``."""
    wire = _wire(_counted(exc))
    return _error_result(json.dumps({"error": wire}, ensure_ascii=False), {"runnerd/error": wire})
