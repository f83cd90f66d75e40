"""List the tools of a workspace's installs, and run one (by install or by reference)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import Caller, authenticate, caller_of, install_for
from runnerd.api.bodies import (
    InputVerdict,
    PendingApproval,
    RunBody,
    RunResponse,
    RunResponseWithoutOutput,
    ToolDetail,
    ToolInfo,
    ToolList,
)
from runnerd.api.ops import INSTALL_ID, WORKSPACE, Op, Param, json_response, query_param
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.api.surfaces import proven_surface
from runnerd.errors import (
    InstallNotFound,
    InsufficientRole,
    InsufficientScope,
    RateLimited,
    RunnerdError,
    SurfaceNotProven,
    WorkspaceKeyNotAllowed,
)
from runnerd.govern.admission import may_run
from runnerd.govern.results import Pending
from runnerd.limits import MAX_CALL_BODY_BYTES, MAX_ID_CHARS, MAX_NAME_CHARS, MAX_SLUG_CHARS
from runnerd.run.pipeline import tool_key
from runnerd.store import InstallRecord, ToolRecord

__all__ = ["OPS"]

INSTALL = Param("installId", "Only the tools of this install.", max_length=MAX_ID_CHARS)
TOOL_NAME = Param(
    "toolName", "The tool's name.", required=True, max_length=MAX_NAME_CHARS, where="path"
)


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
            raise InstallNotFound("No such install in this workspace")
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
    The governor decides (and audits) every refusal; this translates its answer. The
    surface is the one the credential proves (api/surfaces.py: an OAuth token's calls are
    chat, a relay's token's relay, the app bridge's app); a body naming another is
    refused, and audited as a refusal of the call."""
    try:
        surface = proven_surface(request, caller, install, body.surface)
    except SurfaceNotProven as exc:
        await state.governor.refused_caller(
            exc, install, tool_name, user_id=caller.user_id, key_id=caller.key.id
        )
        raise
    outcome = await state.governor.call(
        install,
        tool_name,
        body.input,
        who=caller.principal(),
        surface=surface,
        workflow_run_id=body.workflow_run_id,
        idempotency_key=request.headers.get("idempotency-key"),
    )
    if isinstance(outcome, Pending):
        return json_response(
            PendingApproval(
                status="pending_approval",
                approval_id=outcome.approval_id,
                expires_at=outcome.expires_at,
            ),
            status=202,
        )
    answer = dict(
        run_id=outcome.run_id,
        status=outcome.status,
        output=outcome.output,
        error=outcome.error,
        duration_ms=outcome.duration_ms,
    )
    if outcome.missing is not None:  # a replay no node holds the output of: say why
        return json_response(
            RunResponseWithoutOutput(
                **answer, output_available=False, output_missing=outcome.missing
            )
        )
    return json_response(RunResponse(**answer))


# The install a run route names, if the caller sees it (None otherwise): in a store hop.
_Find = Callable[[Caller], InstallRecord | None]


async def _caller_for_run(request: Request, state: AppState, find: _Find) -> Caller:
    """The caller of a run: a person (not a workspace key) whose key may run tools, in
    caller_of's order (401, 403, 429). Either refusal is audited as a refusal of the call
    (``tool.refuse``, as the governor files every refusal once the install is known) when
    the install ``find`` finds is one the caller sees; a token's missing scope only while
    its key has a rate-limit token to spend, so refusals cannot flood the trail."""
    caller = await authenticate(request, state.store, state.signer)
    try:
        caller.need_scope("tools:run")
    except InsufficientScope as exc:
        with contextlib.suppress(RateLimited):
            state.limiter.take(caller.key.rate_bucket)
            await _audit_refused(request, state, caller, find, exc)
        raise
    state.limiter.take(caller.key.rate_bucket)
    try:
        caller.need_person()
    except WorkspaceKeyNotAllowed as exc:
        await _audit_refused(request, state, caller, find, exc)
        raise
    return caller


async def _audit_refused(
    request: Request, state: AppState, caller: Caller, find: _Find, exc: RunnerdError
) -> None:
    install = await state.store.io(find, caller)
    if install is not None:
        await state.governor.refused_caller(
            exc,
            install,
            str(request.path_params["toolName"]),
            user_id=caller.user_id,
            key_id=caller.key.id,
        )


async def run_tool(request: Request, state: AppState) -> Response:
    store = state.store

    def find(caller: Caller) -> InstallRecord | None:
        install = store.get_install(request.path_params["installId"])
        return install if install and caller.sees(store, install.workspace_id) else None

    caller = await _caller_for_run(request, state, find)
    install = await caller.visible(
        store, store.get_install, request.path_params["installId"], InstallNotFound
    )
    body = await read_body(request, RunBody, MAX_CALL_BODY_BYTES, free_form=True)
    return await _run(request, state, caller, install, request.path_params["toolName"], body)


async def run_by_reference(request: Request, state: AppState) -> Response:
    """The governor decides who may run (and audits a refusal, as for ``run_tool``); the
    workspace's install of the app is found first, only for someone in the workspace."""
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    store = state.store

    def find(caller: Caller) -> InstallRecord | None:
        if not caller.sees(store, workspace_id):
            return None
        return store.install_of_app(workspace_id, request.path_params["appSlug"])

    caller = await _caller_for_run(request, state, find)
    member = await caller.member(state.store, workspace_id, role="viewer", apps=False)
    install = await state.store.io(
        state.store.install_of_app, workspace_id, request.path_params["appSlug"]
    )
    if install is None:
        if not may_run(member):  # nothing to call, and no call it could make: as before
            raise InsufficientRole
        raise InstallNotFound("The workspace has no install of this app")
    body = await read_body(request, RunBody, MAX_CALL_BODY_BYTES, free_form=True)
    return await _run(request, state, caller, install, request.path_params["toolName"], body)


def _tool_info(install: InstallRecord, tool: ToolRecord) -> ToolInfo:
    return ToolInfo(
        reference=f"{install.app_slug}/{tool.name}",
        name=tool.name,
        description=tool.description,
        effect=tool.effect,
        language=tool.language,
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
    body = await read_body(request, RunBody, MAX_CALL_BODY_BYTES, free_form=True)
    await state.governor.pipeline.check_input(
        tool, body.input, key=tool_key(tool, install.version_id)
    )
    return json_response(InputVerdict(valid=True))


_TOOL_PARAMS = (INSTALL_ID, TOOL_NAME)

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
        params=_TOOL_PARAMS,
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
            Param(
                "appSlug", "The app's slug.", required=True, max_length=MAX_SLUG_CHARS, where="path"
            ),
            TOOL_NAME,
        ),
        errors=(400, 401, 403, 404, 409, 429, 500, 503),
        extra_responses={202: PendingApproval},
        description="The same call by reference, as the workflow App Tool block makes it; "
        "pass workflowRunId when a workflow run calls it.",
    ),
]
