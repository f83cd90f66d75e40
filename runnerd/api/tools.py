"""List the tools of a workspace's installs, and run one (by install or by reference)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import Caller, caller_of, install_for
from runnerd.api.bodies import (
    InputVerdict,
    PendingApproval,
    RunBody,
    RunResponse,
    ToolDetail,
    ToolInfo,
    ToolList,
)
from runnerd.api.errors import ApiError, from_domain
from runnerd.api.ops import Op, Param, json_response, read_body
from runnerd.api.state import AppState
from runnerd.govern.governor import Pending, Principal
from runnerd.limits import MAX_INPUT_BYTES
from runnerd.run.pipeline import tool_key
from runnerd.store import InstallRecord, Store, ToolRecord

__all__ = ["OPS", "int_query", "query_param"]

WORKSPACE = Param(
    "workspaceId", "Workspace the request is authorized against.", required=True, max_length=128
)
INSTALL = Param("installId", "Only the tools of this install.", max_length=64)
# A run body is the input (256 KB) plus a little: anything far larger is refused unread.
RUN_BODY_LIMIT = MAX_INPUT_BYTES * 2 + 4096


def query_param(request: Request, param: Param) -> str | None:
    value = request.query_params.get(param.name)
    if value is None:
        if param.required:
            raise ApiError(
                "BAD_REQUEST",
                f"{param.name} is required",
                details={"code": "INVALID_QUERY", "field": param.name},
            )
        return None
    if not param.min_length <= len(value) <= param.max_length:
        raise ApiError(
            "BAD_REQUEST",
            f"{param.name} must be {param.min_length} to {param.max_length} characters",
            details={"code": "INVALID_QUERY", "field": param.name},
        )
    return value


def int_query(request: Request, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter in [low, high]; 400 INVALID_QUERY naming it otherwise."""
    text = request.query_params.get(name)
    if text is None:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise ApiError(
            "BAD_REQUEST",
            f"{name} is a whole number from {low} to {high}",
            details={"code": "INVALID_QUERY", "field": name},
        )
    return int(text)


async def list_tools(request: Request, state: AppState) -> Response:
    workspace_id = query_param(request, WORKSPACE)
    install_id = query_param(request, INSTALL)
    assert workspace_id is not None
    caller = await caller_of(request, state, "api:read")
    caller.need_person()
    await caller.member(state.store, workspace_id, role="viewer")
    if install_id is not None:
        install = await state.store.io(state.store.get_install, install_id)
        if install is None or install.workspace_id != workspace_id:
            raise ApiError(
                "NOT_FOUND",
                "No such install in this workspace",
                details={"code": "INSTALL_NOT_FOUND"},
            )
    data = [
        _tool_info(install, tool)
        for install, tool in await state.store.io(
            state.store.installed_tools, workspace_id, install_id
        )
    ]
    return json_response(ToolList(data=data, next_cursor=None))


async def _run(
    request: Request,
    state: AppState,
    caller: Caller,
    install: InstallRecord,
    tool_name: str,
    body: RunBody,
) -> Response:
    """Run ``tool_name`` of ``install`` for ``caller``: the common part of both routes.
    Every refusal after the install is known is audited with its reason."""
    store = state.store
    user_id = caller.need_person()
    key = request.headers.get("idempotency-key")
    try:
        await caller.member(store, install.workspace_id, role="member")
        if key is not None and not 1 <= len(key) <= 255:
            raise ApiError(
                "BAD_REQUEST",
                "Idempotency-Key is 1 to 255 characters",
                details={"code": "INVALID_IDEMPOTENCY_KEY"},
            )
        outcome = await state.governor.call(
            install,
            tool_name,
            body.input,
            who=Principal(user_id, caller.key.id),
            surface=body.surface,
            workflow_run_id=body.workflow_run_id,
            idempotency_key=key,
        )
    except Exception as exc:
        error = exc if isinstance(exc, ApiError) else from_domain(exc)
        if error is not None:
            await store.io(
                store.audit,
                "tool.refuse",
                workspace_id=install.workspace_id,
                actor_user_id=user_id,
                actor_key_id=caller.key.id,
                install_id=install.id,
                version_id=install.version_id,
                tool=tool_name,
                surface=body.surface,
                reason=(error.details or {}).get("code", error.code),
            )
        raise
    if isinstance(outcome, Pending):
        return json_response(
            PendingApproval(
                status="pending_approval",
                approval_id=outcome.approval_id,
                expires_at=outcome.expires_at,
            ),
            status=202,
        )
    return json_response(
        RunResponse(
            run_id=outcome.run_id,
            status=outcome.status,  # type: ignore[arg-type]
            output=outcome.output,
            error=outcome.error,
            duration_ms=outcome.duration_ms,
        )
    )


async def _caller_for_run(request: Request, state: AppState) -> Caller:
    caller = await caller_of(request, state, "tools:run")
    caller.need_person()
    return caller


def _visible_install(store: Store, install_id: str, user_id: str) -> InstallRecord | None:
    """The install, unless it is in a workspace the person is not in."""
    install = store.get_install(install_id)
    if install is None or store.membership(install.workspace_id, user_id) is None:
        return None
    return install


async def run_tool(request: Request, state: AppState) -> Response:
    caller = await _caller_for_run(request, state)
    user_id = caller.need_person()
    install = await state.store.io(
        _visible_install, state.store, request.path_params["installId"], user_id
    )
    if install is None:
        raise ApiError("NOT_FOUND", "No such install", details={"code": "INSTALL_NOT_FOUND"})
    body = await read_body(request, RunBody, RUN_BODY_LIMIT, nesting_reason="INVALID_INPUT")
    return await _run(request, state, caller, install, request.path_params["toolName"], body)


async def run_by_reference(request: Request, state: AppState) -> Response:
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    caller = await _caller_for_run(request, state)
    await caller.member(state.store, workspace_id, role="member")
    install = await state.store.io(
        state.store.install_of_app, workspace_id, request.path_params["appSlug"]
    )
    if install is None:
        raise ApiError(
            "NOT_FOUND",
            "The workspace has no install of this app",
            details={"code": "INSTALL_NOT_FOUND"},
        )
    body = await read_body(request, RunBody, RUN_BODY_LIMIT, nesting_reason="INVALID_INPUT")
    return await _run(request, state, caller, install, request.path_params["toolName"], body)


def _tool_info(install: InstallRecord, tool: ToolRecord) -> ToolInfo:
    return ToolInfo(
        reference=f"{install.app_slug}/{tool.name}",
        name=tool.name,
        description=tool.description,
        effect=tool.effect,  # type: ignore[arg-type]
        language=tool.language,  # type: ignore[arg-type]
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        timeout_ms=tool.timeout_ms,
        app_id=install.app_id,
        app_slug=install.app_slug,
        install_id=install.id,
        version_id=install.version_id,
        version=install.version,
    )


async def get_tool(request: Request, state: AppState) -> Response:
    install, _ = await install_for(request, state, scope="api:read", role="viewer")
    tool = await state.governor.tool(install, request.path_params["toolName"])
    return json_response(
        ToolDetail(
            tool=_tool_info(install, tool),
            packages=list(tool.packages),
            egress=list(install.egress),
        )
    )


async def check_tool_input(request: Request, state: AppState) -> Response:
    """The run's own input check, without the run: what the Manage page's test form asks
    before it sends, so it can show a refusal next to its field."""
    install, _ = await install_for(request, state, scope="tools:run", role="member")
    tool = await state.governor.tool(install, request.path_params["toolName"])
    body = await read_body(request, RunBody, RUN_BODY_LIMIT, nesting_reason="INVALID_INPUT")
    await state.governor.pipeline.check_input(
        tool, body.input, key=tool_key(tool, install.version_id)
    )
    return json_response(InputVerdict(valid=True))


_TOOL_PARAMS = (
    Param("installId", "The install.", required=True, max_length=64, where="path"),
    Param("toolName", "The tool's name.", required=True, max_length=40, where="path"),
)

OPS = [
    Op(
        "GET",
        "/api/v2/apps/installs/{installId}/tools/{toolName}",
        "getTool",
        "A tool of an install, with its packages and the install's egress grant",
        get_tool,
        ToolDetail,
        params=_TOOL_PARAMS,
    ),
    Op(
        "POST",
        "/api/v2/apps/installs/{installId}/tools/{toolName}/check",
        "checkToolInput",
        "Check an input against the tool's input schema, without running it",
        check_tool_input,
        InputVerdict,
        body=RunBody,
        params=_TOOL_PARAMS,
        errors=(400, 401, 403, 404, 409, 429, 500),
        description="The same checks a run makes before its sandbox starts (size, nesting, "
        "schema), with the same refusals (INVALID_INPUT with its pointer, INPUT_TOO_LARGE); "
        "nothing runs, nothing is metered.",
    ),
    Op(
        "GET",
        "/api/v2/apps/tools",
        "listAppTools",
        "List App Tools",
        list_tools,
        ToolList,
        params=(WORKSPACE, INSTALL),
        description="The code tools the workspace's installed apps ship, at the version "
        "each install runs, with their input and output schemas. Requires read "
        "access and the Apps module. Returns the complete set in one page; "
        "nextCursor is always null. Workspace API keys return 403.",
    ),
    Op(
        "POST",
        "/api/v2/apps/installs/{installId}/tools/{toolName}/run",
        "runTool",
        "Run a tool of an install",
        run_tool,
        RunResponse,
        body=RunBody,
        params=(
            Param("installId", "The install.", required=True, max_length=64, where="path"),
            Param("toolName", "The tool's name.", required=True, max_length=40, where="path"),
        ),
        errors=(400, 401, 403, 404, 409, 429, 500, 503),
        extra_responses={202: PendingApproval},
        description="Runs the tool once in a fresh sandbox. Answers 200 for every run that "
        "started, whatever its status; refusals before the start are errors. "
        "Workspace API keys return 403.",
    ),
    Op(
        "POST",
        "/api/v2/apps/tools/{appSlug}/{toolName}/run",
        "runToolByReference",
        "Run a tool by its reference (app-slug/tool_name)",
        run_by_reference,
        RunResponse,
        body=RunBody,
        params=(
            WORKSPACE,
            Param("appSlug", "The app's slug.", required=True, max_length=64, where="path"),
            Param("toolName", "The tool's name.", required=True, max_length=40, where="path"),
        ),
        errors=(400, 401, 403, 404, 409, 429, 500, 503),
        extra_responses={202: PendingApproval},
        description="The same call by reference, as the workflow App Tool block makes it; "
        "pass workflowRunId when a workflow run calls it.",
    ),
]
