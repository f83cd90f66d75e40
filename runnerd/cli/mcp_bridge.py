"""``runnerd mcp``: a stdio MCP server for desktop agents that launch servers as processes,
forwarding to a daemon's ``/mcp`` endpoint over streamable HTTP.

Tools, calls and confirmations pass through unchanged: a write tool's
``InputRequiredResult`` goes to the agent, and its answer back to the daemon, which
decides; a 2025-era agent, which cannot read one, is asked the same form with
``elicitation/create`` by the bridge, and the call retried with its answer. An agent
that cannot elicit is forwarded on a connection that says so, and gets the daemon's
pending-approval result. Tool-list changes the daemon announces are
announced to the agent too, in its revision: ``notifications/tools/list_changed`` on the
pipe for a 2025-era agent (the handshake says ``tools.listChanged``), on its
``subscriptions/listen`` stream from 2026-07-28.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, cast

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.session import ElicitationFnT
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types.version import is_version_at_least

from runnerd import __version__

__all__ = ["Bridge", "cmd_mcp"]

INPUT_REQUIRED_VERSION = "2026-07-28"  # the first revision with InputRequiredResult


async def _confirm_upstream(ctx: Any, params: Any) -> types.ElicitResult:
    # Never called: calls pass allow_input_required, so the agent answers, not the bridge.
    return types.ElicitResult(action="cancel")


async def _ask_agent(ctx: Any, asked: Any) -> types.ElicitResult:
    """A form the daemon asks for, put to a 2025-era agent as ``elicitation/create``; its
    error, or a request that is no form, is a cancel (nothing runs)."""
    if not isinstance(asked, types.ElicitRequest) or not isinstance(
        asked.params, types.ElicitRequestFormParams
    ):
        return types.ElicitResult(action="cancel")
    try:
        answer: types.ElicitResult = await ctx.session.elicit_form(
            asked.params.message, asked.params.requested_schema, related_request_id=ctx.request_id
        )
    except Exception:
        return types.ElicitResult(action="cancel")
    return answer


class Bridge:
    def __init__(self, url: str, api_key: str, workspace_id: str) -> None:
        self.endpoint = f"{url.rstrip('/')}/mcp?workspaceId={workspace_id}"
        self.api_key = api_key
        self.bus = InMemorySubscriptionBus()
        self.upstream: dict[bool, Client] = {}  # by whether the agent can elicit
        self.agent: ServerSession | None = None  # the agent's session, once initialized

    def _client(self, eliciting: bool) -> Client:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {self.api_key}"})
        transport = streamable_http_client(self.endpoint, http_client=http)
        if eliciting:  # declares the capability; the agent answers through the bridge
            return Client(transport, elicitation_callback=cast("ElicitationFnT", _confirm_upstream))
        return Client(transport)

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return await self.upstream[False].list_tools()

    async def call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        capabilities = ctx.session.client_capabilities
        eliciting = capabilities is not None and capabilities.elicitation is not None
        session = self.upstream[eliciting].session
        result = await session.call_tool(
            params.name,
            params.arguments,
            input_responses=params.input_responses,
            request_state=params.request_state,
            allow_input_required=True,
        )
        if isinstance(result, types.InputRequiredResult) and not is_version_at_least(
            ctx.protocol_version, INPUT_REQUIRED_VERSION
        ):
            # A 2025-era agent cannot read an InputRequiredResult: the bridge asks it
            # with elicitation/create, and retries with its answer (the daemon decides).
            answers: dict[str, Any] = {
                name: await _ask_agent(ctx, asked)
                for name, asked in (result.input_requests or {}).items()
            }
            result = await session.call_tool(
                params.name,
                params.arguments,
                input_responses=answers,
                request_state=result.request_state,
            )
        return result

    async def initialized(self, ctx: Any, params: types.NotificationParams) -> None:
        """The agent finished its handshake (the 2025 eras): it may be told of changes."""
        self.agent = ctx.session

    async def relay_changes(self) -> None:
        """Announce the daemon's tool-list changes to the agent: on its listen stream
        (2026-07-28), or as a notification on the pipe (the 2025 eras; the SDK drops that
        one on a 2026-07-28 connection, which has the listen stream instead)."""
        with contextlib.suppress(Exception):
            async with self.upstream[False].listen(tools_list_changed=True) as events:
                async for _ in events:
                    await self.bus.publish(ToolsListChanged())
                    if self.agent is not None:
                        await self.agent.send_tool_list_changed()

    async def serve(self) -> None:
        server: Server[Any] = Server(
            "runnerd",
            version=__version__,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_subscriptions_listen=ListenHandler(self.bus),
        )
        server.add_notification_handler(
            "notifications/initialized", types.NotificationParams, self.initialized
        )
        options = server.create_initialization_options(NotificationOptions(tools_changed=True))
        async with contextlib.AsyncExitStack() as stack:
            for eliciting in (False, True):
                self.upstream[eliciting] = await stack.enter_async_context(self._client(eliciting))
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self.relay_changes)
                async with stdio_server() as (read, write):
                    await server.run(read, write, options)
                tasks.cancel_scope.cancel()


def cmd_mcp(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get("RUNNERD_URL") or "http://127.0.0.1:8686"
    key = args.api_key or os.environ.get("RUNNERD_API_KEY")
    workspace = args.workspace or os.environ.get("RUNNERD_WORKSPACE")
    if not key or not workspace:
        print(
            "runnerd mcp: give --api-key (or RUNNERD_API_KEY) and --workspace "
            "(or RUNNERD_WORKSPACE)",
            file=sys.stderr,
        )
        return 2
    refused = _refusal(url, key, workspace)
    if refused is not None:
        print(f"runnerd mcp: {refused}", file=sys.stderr)
        return 1
    try:
        anyio.run(Bridge(url, key, workspace).serve)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line, not the SDK's task-group traceback
        print(f"runnerd mcp: {_first_cause(exc)}", file=sys.stderr)
        return 1
    return 0


def _refusal(url: str, key: str, workspace: str) -> str | None:
    """Why the daemon refuses this key at /mcp, as one line (None when it does not):
    asked once before the bridge starts, so a bad key, a workspace key, a missing
    scope or a wrong workspace is said plainly instead of failing inside MCP."""
    import httpx

    endpoint = f"{url.rstrip('/')}/mcp"
    probe = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
    try:
        answer = httpx.post(
            endpoint,
            params={"workspaceId": workspace},
            json=probe,
            headers={
                "Authorization": f"Bearer {key}",
                "Accept": "application/json, text/event-stream",
            },
            timeout=10,
        )
    except httpx.HTTPError as exc:
        return f"cannot reach {endpoint}: {exc}"
    try:
        error = answer.json().get("error")
    except ValueError:
        error = None
    if (
        answer.status_code < 400
        or not isinstance(error, dict)
        or not isinstance(error.get("code"), str)
    ):
        return None  # MCP's own answer (a JSON-RPC error has a number): the key was let in
    details = error.get("details") or {}
    reason = details.get("code") or error.get("code")
    return f"{answer.status_code} {reason}: {error['message']}"


def _first_cause(exc: BaseException) -> str:
    """The innermost error of an exception group, as ``Type: message``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"
