"""App lifecycle endpoints: deploy, list, publish, install, switch, roll back.

Builders deploy and publish (in the workspace that owns the app); admins install and
switch. Tool source and compiled code are never returned by any endpoint.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Annotated

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import caller_of, install_for
from runnerd.api.bodies import (
    AppInfo,
    AppList,
    DeployBody,
    DeployResult,
    EgressBody,
    EgressGrant,
    InstallBody,
    InstallInfo,
    InstallList,
    Problem,
    SwitchBody,
    VersionInfo,
    wire_view,
)
from runnerd.api.ops import INSTALL_ID, WORKSPACE, Op, Param, json_response, query_param
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.errors import InvalidBody, VersionNotFound
from runnerd.govern import apps as governed
from runnerd.limits import (
    MAX_DEPLOY_BODY_BYTES,
    MAX_DEPLOY_BODY_TOKENS,
    MAX_SLUG_CHARS,
    MAX_SMALL_BODY_BYTES,
    MAX_VERSION_CHARS,
)
from runnerd.model import Bundle
from runnerd.store import InstallRecord, Store, VersionRecord
from runnerd.upload.deploy import check_upload

__all__ = ["OPS", "store_version", "version_info"]


def version_info(store: Store, v: VersionRecord) -> VersionInfo:
    return VersionInfo(
        app_id=v.app_id,
        app_slug=v.app_slug,
        version_id=v.id,
        version=v.version,
        content_hash=v.content_hash,
        created_at=v.created_at,
        tools=list(v.tool_names),
        published_at=store.published_at(v.id),
        egress=list(v.egress),
        commit=v.commit,
        ref=v.ref,
    )


def _install_info(i: InstallRecord) -> msgspec.Struct:
    return wire_view(InstallInfo, i, id="install_id")


class _UnreadFiles(msgspec.Struct, forbid_unknown_fields=True):
    """A DeployBody whose file contents are left as the JSON text they came in.

    Reading 34 MB of JSON strings is one msgspec call that holds the GIL for ~45 ms,
    and the event loop waits as long, even with the call in a thread. Finding where each
    string lies takes ~12 ms; each file is then read on its own (``_file_bytes``), so
    the loop never waits more than one file's worth."""

    files: dict[str, msgspec.Raw]
    commit: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{40}([0-9a-f]{24})?$")] | None = None
    ref: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None


def _file_bytes(path: str, raw: msgspec.Raw) -> bytes:
    """One file's content: its JSON string, base64-decoded."""
    text = bytes(raw)
    if text[:1] == b'"' and b"\\" not in text:
        data: str | memoryview = memoryview(text)[1:-1]  # no escapes: the string's bytes
    else:
        try:
            data = msgspec.json.decode(text, type=str)  # "\/" and the like
        except msgspec.ValidationError:
            raise InvalidBody(
                f"invalid request body: files[{path!r}] must be a base64 string"
            ) from None
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidBody(f"every file must be base64; files[{path!r}] is not") from None


async def store_version(
    state: AppState,
    bundle: Bundle,
    *,
    workspace_id: str,
    user_id: str | None,
    key_id: str | None,
    git: tuple[str, str | None] | None = None,
) -> tuple[VersionInfo, list[Problem]]:
    """Store a checked bundle as a new version (a deploy's, a Git push's): its answer's
    version and warnings."""

    def store() -> VersionRecord:
        # Tens of MB of code in one transaction: in a thread, on a connection of its own
        # (a connection is not shared between threads; WAL lets both see the commit).
        own = Store.open(state.settings)
        try:
            return governed.add_version(
                own, bundle, workspace_id=workspace_id, user_id=user_id, key_id=key_id, git=git
            )
        finally:
            own.close()

    version = await asyncio.to_thread(store)
    warnings = [Problem(file=w.file, message=w.message, line=w.line) for w in bundle.warnings]
    return await state.store.io(version_info, state.store, version), warnings


async def deploy(request: Request, state: AppState) -> Response:
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    caller = await caller_of(request, state, "apps:write")
    await caller.member(state.store, workspace_id, role="builder")
    # Its keys are found without building its strings (a repeated path is refused).
    body = await read_body(
        request, _UnreadFiles, MAX_DEPLOY_BODY_BYTES, sparse_tokens=MAX_DEPLOY_BODY_TOKENS
    )
    machine = state.machine

    def check() -> Bundle:
        files = {path: _file_bytes(path, raw) for path, raw in body.files.items()}
        return check_upload(files, toolchain=machine.toolchain, envs=machine.envs)

    # Decoding, compiling, checking and building package envs: off the event loop.
    bundle = await asyncio.to_thread(check)
    git = (body.commit, body.ref) if body.commit is not None else None
    info, warnings = await store_version(
        state, bundle, workspace_id=workspace_id, user_id=caller.user_id, key_id=caller.key.id,
        git=git,
    )  # fmt: skip
    return json_response(
        DeployResult(version=info, warnings=warnings, pages=len(bundle.pages)), status=201
    )


async def list_apps(request: Request, state: AppState) -> Response:
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    caller = await caller_of(request, state, "api:read")
    await caller.member(state.store, workspace_id, role="viewer")
    data = await state.store.io(_app_infos, state.store, workspace_id)
    return json_response(AppList(data=[a for a in data if a.versions]))


def _app_infos(store: Store, workspace_id: str) -> list[AppInfo]:
    """Every app with the versions ``workspace_id`` sees: its own, and published ones."""
    return [
        AppInfo(
            app_id=a.id,
            app_slug=a.slug,
            name=a.name,
            workspace_id=a.workspace_id,
            versions=[
                version_info(store, v)
                for v in store.list_versions(a.id)
                if a.workspace_id == workspace_id or store.published_at(v.id)
            ],
        )
        for a in store.list_apps()
    ]


async def publish(request: Request, state: AppState) -> Response:
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    caller = await caller_of(request, state, "apps:write")
    await caller.member(state.store, workspace_id, role="builder")
    app = await state.store.io(
        governed.owned_app, state.store, request.path_params["appSlug"], workspace_id
    )
    version = await state.store.io(state.store.find_version, app.id, request.path_params["version"])
    if version is None:
        raise VersionNotFound
    await state.store.io(
        state.store.publish,
        version.id,
        caller.user_id,
        workspace_id=workspace_id,
        key_id=caller.key.id,
    )
    return json_response(await state.store.io(version_info, state.store, version))


async def list_installs(request: Request, state: AppState) -> Response:
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    caller = await caller_of(request, state, "api:read")
    await caller.member(state.store, workspace_id, role="viewer")
    installs = await state.store.io(state.store.list_installs, workspace_id)
    return json_response(InstallList(data=[_install_info(i) for i in installs]))


async def create_install(request: Request, state: AppState) -> Response:
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    caller = await caller_of(request, state, "apps:write")
    who = caller.principal()
    await caller.member(state.store, workspace_id, role="admin")
    body = await read_body(request, InstallBody, MAX_SMALL_BODY_BYTES)
    install = await governed.install_version(
        state.governor, workspace_id, body.app_slug, body.version, who=who
    )
    return json_response(_install_info(install), status=201)


async def switch_install(request: Request, state: AppState) -> Response:
    install, caller = await install_for(request, state)
    body = await read_body(request, SwitchBody, MAX_SMALL_BODY_BYTES)
    switched = await governed.switch_install(
        state.governor, install, body.version, who=caller.principal()
    )
    return json_response(_install_info(switched))


async def rollback_install(request: Request, state: AppState) -> Response:
    install, caller = await install_for(request, state)
    rolled = await governed.rollback_install(state.governor, install, who=caller.principal())
    return json_response(_install_info(rolled))


def _egress_grant(store: Store, install: InstallRecord) -> EgressGrant:
    return EgressGrant(
        install_id=install.id,
        requested=list(store.requested_egress(install.version_id)),
        granted=list(install.egress),
    )


async def show_egress(request: Request, state: AppState) -> Response:
    install, _ = await install_for(request, state, scope="api:read", role="viewer")
    return json_response(await state.store.io(_egress_grant, state.store, install))


async def narrow_egress(request: Request, state: AppState) -> Response:
    install, caller = await install_for(request, state)
    body = await read_body(request, EgressBody, MAX_SMALL_BODY_BYTES)
    requested = await state.store.io(state.store.requested_egress, install.version_id)
    granted = governed.narrowed_grant(requested, body.egress, install.version)
    narrowed = await state.store.io(
        state.store.narrow_egress,
        install.id,
        granted,
        user_id=caller.user_id,
        key_id=caller.key.id,
    )
    return json_response(await state.store.io(_egress_grant, state.store, narrowed))


_SLUG = Param("appSlug", "The app's slug.", required=True, max_length=MAX_SLUG_CHARS, where="path")

OPS = [
    Op(
        "POST",
        "/api/v2/apps/deploy",
        "deployApp",
        "Deploy an app bundle as a new version",
        deploy,
        DeployResult,
        status=201,
        body=DeployBody,
        params=(WORKSPACE,),
        errors=(400, 401, 403, 409, 429, 500),
        description="Uploads the manifest, the files its tools globs name and the files "
        "of its pages folder (the answer's pages counts them). Every check "
        "runs first; any problem refuses the whole upload (400, details.problems "
        "lists every one with file and line) and stores nothing.",
    ),
    Op(
        "GET",
        "/api/v2/apps",
        "listApps",
        "List apps and their versions",
        list_apps,
        AppList,
        params=(WORKSPACE,),
    ),
    Op(
        "POST",
        "/api/v2/apps/{appSlug}/versions/{version}/publish",
        "publishVersion",
        "Publish a version, so workspaces can install it",
        publish,
        VersionInfo,
        params=(
            WORKSPACE,
            _SLUG,
            Param(
                "version",
                "The version string.",
                required=True,
                max_length=MAX_VERSION_CHARS,
                where="path",
            ),
        ),
    ),
    Op(
        "GET",
        "/api/v2/apps/installs",
        "listInstalls",
        "List the workspace's installs",
        list_installs,
        InstallList,
        params=(WORKSPACE,),
    ),
    Op(
        "POST",
        "/api/v2/apps/installs",
        "installApp",
        "Install a published version into the workspace",
        create_install,
        InstallInfo,
        status=201,
        body=InstallBody,
        params=(WORKSPACE,),
    ),
    Op(
        "POST",
        "/api/v2/apps/installs/{installId}/switch",
        "switchInstall",
        "Switch an install to another published version",
        switch_install,
        InstallInfo,
        body=SwitchBody,
        params=(INSTALL_ID,),
    ),
    Op(
        "GET",
        "/api/v2/apps/installs/{installId}/egress",
        "showEgress",
        "What an install may reach: requested by its version, granted to it",
        show_egress,
        EgressGrant,
        params=(INSTALL_ID,),
    ),
    Op(
        "PUT",
        "/api/v2/apps/installs/{installId}/egress",
        "narrowEgress",
        "Narrow an install's egress grant (never beyond what its version asks for)",
        narrow_egress,
        EgressGrant,
        body=EgressBody,
        params=(INSTALL_ID,),
        description="Admins only. Each destination must be covered by the installed "
        "version's egress list; installing or switching grants that list again.",
    ),
    Op(
        "POST",
        "/api/v2/apps/installs/{installId}/rollback",
        "rollbackInstall",
        "Roll an install back to its previous version",
        rollback_install,
        InstallInfo,
        params=(INSTALL_ID,),
    ),
]
