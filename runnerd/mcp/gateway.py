"""The MCP endpoint for chat agents: ``/mcp?workspaceId=…`` (streamable HTTP), built on
the official MCP Python SDK's lowlevel server.

- Who: a personal API key or token (``Authorization: Bearer …`` or ``X-API-Key``), checked
  on every HTTP request before MCP sees it; workspace keys are refused, as on the API.
  The session is bound to the workspace of the ``workspaceId`` query parameter.
- ``tools/list``: the tools the person may run there (member and up, Apps module),
  named ``<app-slug>__<tool_name>``; ``annotations`` say read or write. One more tool,
  ``runnerd.approval``, reads what became of a call held for approval.
- ``tools/call``: the same governed call as the API (govern/governor.py), surface
  ``chat``, the person recorded: role, budget, rate limit, audit (refusals included),
  ledger and approvals all apply. A run that started is a result (``isError`` when it
  failed or timed out); a refusal is an ``isError`` result whose structuredContent
  carries the API's code and reason; an unknown tool is an MCP error.
- A ``write`` tool asks the person first, in the form the session's revision has: from
  2026-07-28 an ``InputRequiredResult``, before it an ``elicitation/create`` request
  during the call. The form shows the tool, its effect and the exact input; the answer
  decides the approval held for that input (accept: the run, and its result; anything
  else, a client's error included: denied, nothing runs). A client that cannot elicit
  gets a ``pending_approval`` answer (structuredContent only if the tool's output schema
  admits it, else ``isError``; always in ``_meta["runnerd/approval"]``); someone decides
  through the API or the Manage page, and ``runnerd.approval`` reads the outcome.
- Installing, switching or rolling back publishes ``notifications/tools/list_changed``
  to the sessions listening (``subscriptions/listen``).
- A session (``Mcp-Session-Id``, the 2025 handshake era) is bound to the key and the
  workspace that opened it: any other key, or another workspace, gets 404 before the SDK
  sees the request. When the key is revoked or its person leaves the workspace, its
  sessions are ended and its open streams closed (checked every
  ``MCP_REVOCATION_CHECK_S``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import is_version_at_least
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from runnerd import __version__
from runnerd.api.auth import Caller, bearer_or_key
from runnerd.api.errors import ApiError, envelope, error_response
from runnerd.errors import (
    ApprovalNotFound,
    DuplicateSessionId,
    InsufficientRole,
    InvalidApiKey,
    MissingWorkspace,
    RunnerdError,
    Unauthenticated,
)
from runnerd.govern.admission import Principal
from runnerd.govern.idempotency import request_hash
from runnerd.govern.results import CallResult, Pending
from runnerd.limits import MCP_REVOCATION_CHECK_S

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

_NO_SESSION = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Session not found"}}'

log = logging.getLogger(__name__)


def mcp_name(app_slug: str, tool: str) -> str:
    return f"{app_slug}{SEPARATOR}{tool}"


@dataclass(frozen=True)
class _Grant:
    """What a request or a session acts under: a key, in a workspace."""

    key_id: str
    workspace_id: str


@dataclass
class _Session:
    """A session opened over the handshake: whose it is, and how it is in use."""

    grant: _Grant
    in_flight: int = 0
    used: float = field(default_factory=time.monotonic)


class _Watched:
    """The ``send`` of one request, watched: its status, whether it finished."""

    def __init__(self, send: Send, opened: Callable[[str], None] | None = None) -> None:
        self._send = send
        self._opened = opened  # told of a session the answer opens, before it goes out
        self.status: int | None = None
        self.session_id: str | None = None  # the header the SDK set on its answer
        self.done = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            for name, value in message.get("headers", []):
                if name.lower() == MCP_SESSION_ID_HEADER.encode():
                    self.session_id = value.decode("latin-1")
            if self._opened is not None and self.session_id and self.status < 400:
                # Bound before the client can read the id: its next request may come
                # before this one's handler returns.
                self._opened(self.session_id)
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            self.done = True
        await self._send(message)


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
        self._sessions: dict[str, _Session] = {}  # Mcp-Session-Id: who opened it
        self._streams: dict[_Grant, set[anyio.CancelScope]] = {}  # requests being served

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The session manager's task group, and the watch that ends the sessions and
        streams of revoked keys, for the daemon's lifespan."""
        async with self.server.session_manager.run(), anyio.create_task_group() as tasks:
            tasks.start_soon(self._watch)
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()

    async def tools_changed(self) -> None:
        await self.bus.publish(ToolsListChanged())

    # --- HTTP: who may talk MCP at all -------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            caller, workspace_id = await self._authorize(request)
            session_id = _session_id(request)
        except RunnerdError as exc:
            await error_response(envelope(exc))(scope, receive, send)
            return
        grant = _Grant(caller.key.id, workspace_id)
        session = None if session_id is None else self._sessions.get(session_id)
        if session_id is not None and (session is None or session.grant != grant):
            # Another key's session, or one of another workspace: as if it did not exist.
            await _session_not_found(send)
            return
        watched = _Watched(send, None if session_id is not None else partial(self._opened, grant))
        if session is not None:
            session.in_flight += 1
        try:
            await self._serve(grant, scope, receive, watched)
        finally:
            if session is not None:
                session.in_flight -= 1
                session.used = time.monotonic()
        if session_id is not None and (
            watched.status == 404 or (request.method == "DELETE" and (watched.status or 500) < 400)
        ):
            self._sessions.pop(session_id, None)  # ended by its owner, or by the SDK

    def _opened(self, grant: _Grant, session_id: str) -> None:
        """The handshake opened ``session_id`` for ``grant``."""
        self._sessions.setdefault(session_id, _Session(grant))

    async def _serve(self, grant: _Grant, scope: Scope, receive: Receive, send: _Watched) -> None:
        """Hand the request to the SDK, cancellable when its grant ends (``_end``)."""
        with anyio.CancelScope() as cancel:
            streams = self._streams.setdefault(grant, set())
            streams.add(cancel)
            try:
                await self._endpoint(scope, receive, send)
            finally:
                streams.discard(cancel)
                if not streams:
                    self._streams.pop(grant, None)
        if not cancel.cancelled_caught or send.done:
            return
        if send.status is None:
            ended = Unauthenticated("The key was revoked, or left the workspace")
            await error_response(envelope(ended))(scope, receive, send)
        else:  # a stream: end it cleanly
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch(self) -> None:
        """Every ``MCP_REVOCATION_CHECK_S``: end the sessions and streams whose key was
        revoked (here, on another node, or by ``runnerd admin revoke-key``) or whose person
        left the workspace, and forget sessions the SDK has let go idle."""
        while True:
            await anyio.sleep(MCP_REVOCATION_CHECK_S)
            state = self.state
            grants = {s.grant for s in self._sessions.values()} | set(self._streams)
            if state is None or not grants:
                continue
            pairs = [(g.key_id, g.workspace_id) for g in grants]
            try:
                live = await state.store.io(state.store.live_grants, pairs)
            except Exception as exc:
                # The database is away (PostgreSQL down, SQLite locked): try again next
                # time. Raising would end the task group, and every MCP session with it.
                log.warning("MCP sessions not checked against revoked keys: %r", exc)
                continue
            for grant in grants:
                if (grant.key_id, grant.workspace_id) not in live:
                    await self._end(grant)
            self._forget_idle()

    async def _end(self, grant: _Grant) -> None:
        """End everything ``grant`` holds: its sessions answer 404 from now on (and the
        SDK terminates them), its requests and streams are cut."""
        ended = [sid for sid, s in self._sessions.items() if s.grant == grant]
        for session_id in ended:
            del self._sessions[session_id]
        for cancel in list(self._streams.get(grant, ())):
            cancel.cancel()
        for session_id in ended:
            await self._terminate(session_id)

    async def _terminate(self, session_id: str) -> None:
        """Terminate a session in the SDK as its client would: a DELETE with its id."""
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "DELETE",
            "scheme": "http",
            "path": "/mcp",
            "raw_path": b"/mcp",
            "root_path": "",
            "query_string": b"",
            "headers": [(MCP_SESSION_ID_HEADER.encode(), session_id.encode())],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
        }

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            return None

        await self._endpoint(scope, receive, send)

    def _forget_idle(self) -> None:
        """Forget sessions idle past the SDK's own timeout: it has ended them."""
        idle_s = self.server.session_manager.session_idle_timeout
        if idle_s is None:
            return
        now = time.monotonic()
        for session_id, session in list(self._sessions.items()):
            if not session.in_flight and now - session.used > idle_s + MCP_REVOCATION_CHECK_S:
                del self._sessions[session_id]

    async def _authorize(self, request: Request, *, spend: bool = True) -> tuple[Caller, str]:
        """The caller and workspace of an MCP request: 401, 403 or 429 as on the API
        (one rate-limit token per HTTP request: the handlers do not spend another)."""
        state = self.state
        assert state is not None, "the daemon's lifespan sets the state"
        plaintext = bearer_or_key(request)
        if not plaintext:
            raise Unauthenticated("Send a personal API key as a Bearer token")
        key = await state.store.io(state.store.find_key, plaintext)
        if key is None:
            raise InvalidApiKey
        caller = Caller(key)
        caller.need_person()
        caller.need_scope("tools:run")
        workspace_id = request.query_params.get("workspaceId", "")
        if not workspace_id:
            raise MissingWorkspace
        await caller.member(state.store, workspace_id, role="viewer")
        if spend:
            state.limiter.take(key.id)
        return caller, workspace_id

    async def _context(self, ctx: Any) -> tuple[AppState, Caller, str]:
        if not isinstance(ctx.request, Request) or self.state is None:
            raise MCPError(types.INVALID_REQUEST, "runnerd serves MCP over HTTP only")
        try:
            caller, workspace_id = await self._authorize(ctx.request, spend=False)
        except RunnerdError as exc:
            error = envelope(exc)
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
        who = Principal(user_id=caller.need_person(), key_id=caller.key.id)
        arguments = params.arguments or {}
        if params.name == APPROVAL_TOOL:
            return await self._approval_result(state, who, workspace_id, arguments)
        slug, sep, tool_name = params.name.partition(SEPARATOR)
        install = (
            await state.store.io(state.store.install_of_app, workspace_id, slug) if sep else None
        )
        tool = (
            None
            if install is None
            else await state.store.io(state.store.get_tool, install.version_id, tool_name)
        )
        if install is None or tool is None:
            raise MCPError(types.INVALID_PARAMS, f"no tool {params.name!r} in this workspace")
        try:
            if params.request_state is not None:
                await caller.member(state.store, workspace_id, role="member")
                return await self._confirmed(state, who, install, tool_name, arguments, params)
            # The governor checks the person's role, and audits its refusals as the API's.
            outcome = await state.governor.call(
                install, tool_name, arguments, who=who, surface="chat"
            )
            if isinstance(outcome, Pending):
                asking = _Asking(install.app_slug, tool_name, tool.output_schema, arguments)
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
            return _pending(held, asking.output_schema)
        if is_version_at_least(ctx.protocol_version, INPUT_REQUIRED_VERSION):
            return types.InputRequiredResult(
                input_requests={"confirm": types.ElicitRequest(params=_confirm_form(asking))},
                request_state=state.cookies.sign(held.approval_id),  # unforgeable
            )
        if not ctx.session.can_send_request:
            return _pending(held, asking.output_schema)  # no channel to ask on: it waits
        return await self._elicit(state, ctx, who, asking, held)

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
        return types.CallToolResult(
            content=[types.TextContent(text=f"{said}: the call did not run.")],
            structured_content={"status": "declined", "approvalId": held.approval_id},
            is_error=True,
        )

    async def _confirmed(
        self,
        state: AppState,
        who: Principal,
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
            # The form's schema: a boolean. Only JSON true runs the write; "false", "0",
            # "yes", 1 or anything else a client sends for an unticked box does not.
            and (answer.content or {}).get("confirm") is True
        )
        decided = await state.governor.decide(approval.id, approve=accepted, who=who)
        if not accepted or decided.run_id is None:
            return types.CallToolResult(
                content=[types.TextContent(text="Declined: the call did not run.")],
                structured_content={"status": "declined", "approvalId": approval.id},
                is_error=True,
            )
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
        # GET /api/v2/runs/{id}'s rule: the output is the asker's, the approver's who
        # released it, or an admin's; anyone else of the workspace sees the status only.
        member = await state.store.io(state.store.membership, workspace_id, who.user_id)
        entitled = who.user_id in (approval.requested_by, approval.decided_by) or (
            member is not None and member.role == "admin"
        )
        found["run"] = _run_fields(run) | {"outputAvailable": entitled}
        if not entitled:
            found["run"] |= {"output": None, "error": None}
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(found, ensure_ascii=False))],
            structured_content=found,
            is_error=run.status != "succeeded",
        )


@dataclass(frozen=True)
class _Asking:
    """A held write call, as the person is asked about it."""

    slug: str
    tool: str
    output_schema: dict[str, Any] | None
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


# The keywords of an output schema that admits any object: only then may the pending
# answer ride structuredContent (a client checks it against the schema unless isError).
_OPEN_SCHEMA_KEYS = frozenset({"type", "title", "description", "$schema", "$id", "$comment"})


def _pending(held: Pending, output_schema: dict[str, Any] | None) -> types.CallToolResult:
    """A held call that waits for someone to decide: its approval id and deadline in
    ``_meta["runnerd/approval"]`` and the text, and as structuredContent only when the
    tool's output schema admits it; otherwise ``isError``, with no structuredContent,
    so a client that checks results against the schema still shows the agent the id."""
    pending = {
        "status": "pending_approval",
        "approvalId": held.approval_id,
        "expiresAt": held.expires_at,
    }
    text = (
        f"This write call waits for approval ({held.approval_id}); it runs once approved, "
        f"through the API or the Manage page, before {held.expires_at}. Read its outcome "
        f"with {APPROVAL_TOOL}."
    )
    found: dict[str, Any] = {
        "content": [{"type": "text", "text": text}],
        "_meta": {"runnerd/approval": pending},
    }
    schema = output_schema or {}
    if set(schema) <= _OPEN_SCHEMA_KEYS and schema.get("type", "object") == "object":
        found["structuredContent"] = pending
    else:
        found["isError"] = True
    return types.CallToolResult.model_validate(found)


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


def _session_id(request: Request) -> str | None:
    """The request's ``Mcp-Session-Id``; 400 when it carries more than one."""
    found = request.headers.getlist(MCP_SESSION_ID_HEADER)
    if len(found) > 1:
        raise DuplicateSessionId(MCP_SESSION_ID_HEADER)
    return found[0] if found else None


async def _session_not_found(send: Send) -> None:
    """The SDK's own answer to an unknown session id: 404, a JSON-RPC error."""
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": _NO_SESSION, "more_body": False})


def _wire(exc: ApiError) -> dict[str, Any]:
    details = dict(exc.details or {})
    return {
        "code": exc.code,
        "reason": details.get("code", exc.code),
        "status": exc.status,
        "message": exc.message,
        "details": details,
    }


def _refused(exc: RunnerdError) -> types.CallToolResult:
    """A refusal before any run: isError, with the API's code and reason."""
    error = envelope(exc)
    wire = _wire(error)
    return types.CallToolResult(
        content=[types.TextContent(text=f"Refused ({wire['reason']}): {error.message}")],
        structured_content={"error": wire},
        is_error=True,
    )
