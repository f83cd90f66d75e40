"""Secrets of an install: set one, list their names, delete one. A secret's value goes
in, sealed by the vault, and never comes out: no endpoint returns it."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import caller_of, install_of
from runnerd.api.bodies import Deleted, SecretBody, SecretInfo, SecretList
from runnerd.api.ops import INSTALL_ID, Op, Param, json_response
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.errors import SecretNotFound
from runnerd.govern.secrets import SECRET_NAME, check_secret_name, check_secret_value
from runnerd.limits import MAX_SECRET_BODY_BYTES, MAX_SECRET_NAME_CHARS

__all__ = ["OPS"]


async def put_secret(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "apps:write")
    install = await install_of(request, state, caller, "admin")
    name = check_secret_name(str(request.path_params["name"]))
    body = await read_body(request, SecretBody, MAX_SECRET_BODY_BYTES)
    check_secret_value(body.value)
    sealed = state.governor.vault.seal(install.id, name, body.value)
    updated = await state.store.io(
        state.store.put_secret,
        install.id,
        name,
        sealed,
        workspace_id=install.workspace_id,
        user_id=caller.user_id,
        key_id=caller.key.id,
    )
    return json_response(SecretInfo(name=name, updated_at=updated))


async def list_secrets(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "api:read")
    install = await install_of(request, state, caller, "builder")
    names = await state.store.io(state.store.secret_names, install.id)
    return json_response(SecretList(data=[SecretInfo(name=n, updated_at=u) for n, u in names]))


async def delete_secret(request: Request, state: AppState) -> Response:
    caller = await caller_of(request, state, "apps:write")
    install = await install_of(request, state, caller, "admin")
    name = check_secret_name(str(request.path_params["name"]))
    if not await state.store.io(
        state.store.delete_secret,
        install.id,
        name,
        workspace_id=install.workspace_id,
        user_id=caller.user_id,
        key_id=caller.key.id,
    ):
        raise SecretNotFound(name)
    return json_response(Deleted(name=name, deleted=True))


_NAME = Param(
    "name",
    "The secret's name (an environment variable name).",
    required=True,
    max_length=MAX_SECRET_NAME_CHARS,
    where="path",
    pattern=f"^{SECRET_NAME.pattern}$",
)


OPS = [
    Op(
        "PUT",
        "/api/v2/apps/installs/{installId}/secrets/{name}",
        "setSecret",
        "Set a secret of an install (admins)",
        put_secret,
        SecretInfo,
        body=SecretBody,
        params=(INSTALL_ID, _NAME),
        description="The value is encrypted at rest and never returned by any endpoint.",
    ),
    Op(
        "DELETE",
        "/api/v2/apps/installs/{installId}/secrets/{name}",
        "deleteSecret",
        "Delete a secret of an install (admins)",
        delete_secret,
        Deleted,
        params=(INSTALL_ID, _NAME),
    ),
    Op(
        "GET",
        "/api/v2/apps/installs/{installId}/secrets",
        "listSecrets",
        "List the names of an install's secrets (builders and admins)",
        list_secrets,
        SecretList,
        params=(INSTALL_ID,),
    ),
]
