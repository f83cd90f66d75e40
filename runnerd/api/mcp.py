"""The MCP endpoint for chat agents: ``/mcp?workspaceId=…`` (streamable HTTP), built on
the official MCP Python SDK's lowlevel server.

- Who: a personal API key or token (``Authorization: Bearer …`` or ``X-API-Key``), checked
  on every HTTP request before MCP sees it; workspace keys are refused, as on the API.
  The session is bound to the workspace of the ``workspaceId`` query parameter.
- ``tools/list``: the tools the person may run there (member and up, Apps module),
  named ``<app-slug>__<tool_name>``; ``annotations`` say read or write. One more tool,
  ``runnerd.approval``, reads what became of a call held for approval.
- ``tools/call``: the same governed call as the API (calls.py), surface ``chat``, the
  person recorded: budget, rate limit, audit, ledger and approvals all apply. A run
  that started is a result (``isError`` when it failed or timed out); a refusal is an
  ``isError`` result whose structuredContent carries the API's code and reason; an
  unknown tool is an MCP error.
- A ``write`` tool asks the person first. A client that can elicit gets an
  ``InputRequiredResult`` with a form that shows the tool, its effect and the exact
  input; its answer decides the approval held for that input (accept: the run, and
  its result; decline: nothing runs). A client that cannot elicit gets a
  ``pending_approval`` result; someone decides through the API or the Manage page, and
  ``runnerd.approval`` reads the outcome.
- Installing, switching or rolling back publishes ``notifications/tools/list_changed``
  to the sessions listening (``subscriptions/listen``).
"""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from runnerd import __version__
from runnerd.api.auth import Caller, bearer_or_key
from runnerd.api.errors import ApiError, error_response, from_domain
from runnerd.calls import CallResult, Pending, Who, request_hash
from runnerd.errors import RunnerdError

if TYPE_CHECKING:
    from runnerd.api.state import AppState

__all__ = ["APPROVAL_TOOL", "SEPARATOR", "McpGateway", "mcp_name"]

SEPARATOR = "__"  # app slug and tool name: slugs have single hyphens, so no clash
APPROVAL_TOOL = "runnerd.approval"  # a dot: no app tool can be named so
INSTRUCTIONS = (
    "Tools of the apps installed in this runnerd workspace. Each runs in a sandbox and is "
    "metered; a tool marked destructive (effect write) asks the person before it runs."
)


def mcp_name(app_slug: str, tool: str) -> str:
    return f"{app_slug}{SEPARATOR}{tool}"


class McpGateway:
    """The MCP server of the daemon, its auth guard and its tools-changed bus."""

    def __init__(self) -> None:
        self.state: AppState | None = None  # set by the daemon's lifespan
        self.bus = InMemorySubscriptionBus()
        self.server: Server[Any] = Server(
            "runnerd",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self.bus),
        )
        # The key on every request is the protection; no cookie is ever honoured here.
        self.server.streamable_http_app(
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
        )
        self._endpoint = StreamableHTTPASGIApp(self.server.session_manager)

    def run(self) -> AbstractAsyncContextManager[None]:
        """The session manager's task group, for the daemon's lifespan."""
        return self.server.session_manager.run()

    async def tools_changed(self) -> None:
        await self.bus.publish(ToolsListChanged())

    # --- HTTP: who may talk MCP at all -------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            await self._authorize(request)
        except ApiError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await self._endpoint(scope, receive, send)

    async def _authorize(self, request: Request, *, spend: bool = True) -> tuple[Caller, str]:
        """The caller and workspace of an MCP request: 401, 403 or 429 as on the API
        (one rate-limit token per HTTP request: the handlers do not spend another)."""
        state = self.state
        assert state is not None, "the daemon's lifespan sets the state"
        plaintext = bearer_or_key(request)
        if not plaintext:
            raise ApiError("UNAUTHORIZED", "Send a personal API key as a Bearer token")
        key = await state.store.io(state.store.find_key, plaintext)
        if key is None:
            raise ApiError("UNAUTHORIZED", "Invalid or revoked API key")
        caller = Caller(key)
        caller.need_person()
        caller.need_scope("tools:run")
        workspace_id = request.query_params.get("workspaceId", "")
        if not workspace_id:
            raise ApiError(
                "BAD_REQUEST",
                "connect to /mcp?workspaceId=…: a session belongs to one workspace",
                details={"code": "MISSING_WORKSPACE"},
            )
        await caller.member(state.store, workspace_id, role="viewer")
        if spend:
            state.limiter.take(key.id)
        return caller, workspace_id

    async def _context(self, ctx: Any) -> tuple[AppState, Caller, str]:
        if not isinstance(ctx.request, Request) or self.state is None:
            raise MCPError(types.INVALID_REQUEST, "runnerd serves MCP over HTTP only")
        try:
            caller, workspace_id = await self._authorize(ctx.request, spend=False)
        except ApiError as exc:
            raise MCPError(types.INVALID_REQUEST, exc.message, _wire(exc)) from None
        return self.state, caller, workspace_id

    # --- tools/list ----------------------------------------------------------------------

    async def _list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        state, caller, workspace_id = await self._context(ctx)
        try:
            await caller.member(state.store, workspace_id, role="member")
        except ApiError:
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
        who = Who(user_id=caller.need_person(), key_id=caller.key.id)
        arguments = params.arguments or {}
        if params.name == APPROVAL_TOOL:
            return await self._approval_result(state, who, workspace_id, arguments)
        slug, sep, tool_name = params.name.partition(SEPARATOR)
        install = (
            await state.store.io(state.store.install_of_app, workspace_id, slug) if sep else None
        )
        if (
            install is None
            or await state.store.io(state.store.get_tool, install.version_id, tool_name) is None
        ):
            raise MCPError(types.INVALID_PARAMS, f"no tool {params.name!r} in this workspace")
        try:
            await caller.member(state.store, workspace_id, role="member")
            if params.request_state is not None:
                return await self._confirmed(state, who, install, tool_name, arguments, params)
            outcome = await state.calls.call(install, tool_name, arguments, who=who, surface="chat")
        except (ApiError, RunnerdError) as exc:
            return _refused(exc)
        if isinstance(outcome, Pending):
            return self._ask(state, ctx, install.app_slug, tool_name, arguments, outcome)
        return _result(outcome)

    def _ask(
        self,
        state: AppState,
        ctx: Any,
        slug: str,
        tool: str,
        arguments: dict[str, Any],
        held: Pending,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """A held write call: ask the person (elicitation), or say it waits."""
        capabilities = ctx.session.client_capabilities
        if capabilities is not None and capabilities.elicitation is not None:
            shown = json.dumps(arguments, indent=2, ensure_ascii=False)
            message = (
                f"Run {slug}/{tool}? It is a write tool: the run is real, metered, and makes "
                f"real changes. Input:\n{shown}"
            )
            form = types.ElicitRequest(
                params=types.ElicitRequestFormParams(
                    message=message,
                    requested_schema={
                        "type": "object",
                        "properties": {
                            "confirm": {
                                "type": "boolean",
                                "title": f"Run {slug}/{tool} with this input",
                            }
                        },
                        "required": ["confirm"],
                    },
                )
            )
            return types.InputRequiredResult(
                input_requests={"confirm": form},
                request_state=state.cookies.sign(held.approval_id),  # unforgeable
            )
        pending = {
            "status": "pending_approval",
            "approvalId": held.approval_id,
            "expiresAt": held.expires_at,
        }
        return types.CallToolResult(
            content=[
                types.TextContent(
                    text=f"This write call waits for approval ({held.approval_id}); it runs "
                    f"once approved, through the API or the Manage page, before "
                    f"{held.expires_at}. Read its outcome with {APPROVAL_TOOL}."
                )
            ],
            structured_content=pending,
        )

    async def _confirmed(
        self,
        state: AppState,
        who: Who,
        install: Any,
        tool_name: str,
        arguments: dict[str, Any],
        params: types.CallToolRequestParams,
    ) -> types.CallToolResult:
        """The retry of a held call, with the person's answer: decide its approval."""
        approval_id = state.cookies.unsign(params.request_state or "")
        approval = (
            await state.store.io(state.store.get_approval, approval_id) if approval_id else None
        )
        if (
            approval is None
            or approval.install_id != install.id
            or approval.tool != tool_name
            or approval.input_hash
            != request_hash(install.id, approval.version_id, tool_name, arguments)
        ):
            raise MCPError(types.INVALID_PARAMS, "the confirmation does not match this call")
        answer = (params.input_responses or {}).get("confirm")
        accepted = (
            isinstance(answer, types.ElicitResult)
            and answer.action == "accept"
            and bool((answer.content or {}).get("confirm"))
        )
        decided = await state.calls.decide(approval.id, approve=accepted, who=who)
        if not accepted or decided.run_id is None:
            return types.CallToolResult(
                content=[types.TextContent(text="Declined: the call did not run.")],
                structured_content={"status": "declined", "approvalId": approval.id},
                is_error=True,
            )
        return _result(await state.calls.outcome(decided.run_id))

    async def _approval_result(
        self, state: AppState, who: Who, workspace_id: str, arguments: dict[str, Any]
    ) -> types.CallToolResult:
        approval = await state.store.io(
            state.store.get_approval, str(arguments.get("approvalId", ""))
        )
        if approval is None or approval.workspace_id != workspace_id:
            return _refused(
                ApiError("NOT_FOUND", "No such approval", details={"code": "APPROVAL_NOT_FOUND"})
            )
        await state.calls.expire()
        approval = await state.store.io(state.store.get_approval, approval.id) or approval
        found: dict[str, Any] = {"approvalId": approval.id, "status": approval.status}
        if approval.run_id is None:
            return types.CallToolResult(
                content=[types.TextContent(text=json.dumps(found))], structured_content=found
            )
        run = await state.calls.outcome(approval.run_id)
        found["run"] = _run_fields(run)
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(found, ensure_ascii=False))],
            structured_content=found,
            is_error=run.status != "succeeded",
        )


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
    meta = {"runnerd/run": _run_fields(run) | {"output": None}}
    if run.status == "succeeded":
        text = json.dumps(run.output, ensure_ascii=False)
        return types.CallToolResult.model_validate(
            {"content": [{"type": "text", "text": text}], "structuredContent": run.output,
             "_meta": meta}
        )  # fmt: skip
    return types.CallToolResult.model_validate(
        {"content": [{"type": "text", "text": f"The run {run.status}: {run.error}"}],
         "isError": True, "_meta": meta}
    )  # fmt: skip


def _wire(exc: ApiError) -> dict[str, Any]:
    details = dict(exc.details or {})
    return {
        "code": exc.code,
        "reason": details.get("code", exc.code),
        "status": exc.status,
        "message": exc.message,
        "details": details,
    }


def _refused(exc: Exception) -> types.CallToolResult:
    """A refusal before any run: isError, with the API's code and reason."""
    error = exc if isinstance(exc, ApiError) else from_domain(exc)
    if error is None:
        raise exc
    wire = _wire(error)
    return types.CallToolResult(
        content=[types.TextContent(text=f"Refused ({wire['reason']}): {error.message}")],
        structured_content={"error": wire},
        is_error=True,
    )
