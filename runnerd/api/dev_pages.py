"""Dev pages: an app's pages from a person's own machine, shown in the Manage page's frame
while its tools run as installed (issue 26, ``runnerd app dev DIR``).

``PUT /api/v2/apps/installs/{installId}/dev-pages`` (a person's session or personal key,
not a token; a member with Apps access to the install) keeps the body's page files
``{"entry", "files": {path: base64}}`` in the store (store/dev_pages.py), for that person
and that install only, replacing what they held before in one transaction (the revision
counts the PUTs): so every node of a cluster answers ``GET`` and serves the frame's pages,
whichever node took the PUT. They are a developer's page files, not secrets, but they
are never listed or served to anyone else, and they are dropped an hour after the last
PUT (DEV_PAGES_TTL_S, on the database's clock: never served past it, deleted by the next
PUT), when the person DELETEs them (the CLI does, when it stops), or with the install. A
node's restart keeps them. The store holds at most DEV_PAGES_MAX_BYTES of them together,
every node's: past that the oldest person's are dropped. ``runnerd admin copy`` does not
copy them (store/copy.py).

The apps origin (daemon/apps_origin.py) serves them at ``<apps_url>/d/<token>/<path>``,
with the same CSP, headers and checks as a deployed page, to a frame token of that
person and install only (the token binds both: another person's token finds none of
them). The frame's bridge calls are the ordinary ones: ``X-Runnerd-Frame`` proves surface
``app``, and the tools that run are the install's current version's.

The answer (and ``GET``'s, which the Manage page polls to reload the frame when the
revision changes) gives the frame's URL, a fresh token, the revision, and the Manage
page's address of the dev frame, ``<public_url>/#/apps/<installId>?dev=1``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from datetime import UTC, datetime
from urllib.parse import quote

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd import limits as L
from runnerd.api.bodies import Deleted
from runnerd.api.frames import frame_caller, issue_frame_token
from runnerd.api.ops import INSTALL_ID, Op, json_response
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.errors import InvalidBody, NoDevPages
from runnerd.ids import stamp
from runnerd.store import DevPagesRow
from runnerd.upload.pages import content_type

__all__ = ["OPS"]

DEV_PAGES_ARE = "Dev pages are a person's"  # frame_caller's refusal of a token


class DevPagesBody(msgspec.Struct, forbid_unknown_fields=True):
    """The page files of a ``runnerd app dev``: each path relative to the pages folder,
    its content in base64."""

    files: dict[str, str]
    entry: str = L.DEFAULT_PAGE_ENTRY


class DevPagesInfo(msgspec.Struct, rename="camel"):
    """Where the Manage page opens a person's dev pages, and their revision."""

    url: str  # <apps_url>/d/<token>/<entry>
    origin: str  # the apps origin
    token: str  # a frame token: the X-Runnerd-Frame header of the frame's calls
    expires_at: str  # the token's
    revision: int  # counts the PUTs: the Manage page reloads the frame when it changes
    files: int
    bytes: int
    manage_url: str  # <public_url>/#/apps/<installId>?dev=1


def _path_problem(path: str) -> str | None:
    if not path or len(path) > L.MAX_PATH_CHARS:
        return "is not a file path"
    if path.startswith("/") or "\\" in path or "\0" in path:
        return "is a path inside the pages folder, relative to it"
    if any(seg in ("", ".", "..") for seg in path.split("/")):
        return "has an empty, '.' or '..' segment"
    if path.lower().endswith(L.TOOL_SUFFIX) or path.rsplit("/", 1)[-1].lower() == L.MANIFEST_NAME:
        return "is a tool file or a manifest, which is never a page"
    return None


def _checked(body: DevPagesBody) -> dict[str, tuple[bytes, str, str]]:
    if len(body.files) > L.MAX_PAGE_FILES:
        raise InvalidBody(f"files: at most {L.MAX_PAGE_FILES:,} page files")
    files: dict[str, tuple[bytes, str, str]] = {}
    total = 0
    for path, encoded in body.files.items():
        why = _path_problem(path)
        if why is not None:
            raise InvalidBody(f"files: {path[:200]!r} {why}")
        try:
            content = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidBody(f"files: {path!r} is not base64") from None
        if len(content) > L.MAX_PAGE_BYTES:
            raise InvalidBody(
                f"files: {path!r} is larger than {L.MAX_PAGE_BYTES // L.MB} MB, a page file's limit"
            )
        total += len(content)
        files[path] = (content, content_type(path), hashlib.sha256(content).hexdigest())
    if total > L.MAX_PAGES_BYTES:
        raise InvalidBody(
            f"files: more than {L.MAX_PAGES_BYTES // L.MB} MB together, the limit of an app's pages"
        )
    if _path_problem(body.entry) is not None or body.entry not in files:
        raise InvalidBody(f"entry: {body.entry[:200]!r} is not among the files")
    return files


def _info(state: AppState, install_id: str, user_id: str, pages: DevPagesRow) -> DevPagesInfo:
    base = state.settings.apps_base
    assert base is not None
    token, expires = issue_frame_token(state.frame_key, install_id, user_id)
    return DevPagesInfo(
        url=f"{base}/d/{token}/{quote(pages.entry)}",
        origin=base,
        token=token,
        expires_at=stamp(datetime.fromtimestamp(expires, UTC)),
        revision=pages.revision,
        files=pages.files,
        bytes=pages.size,
        manage_url=f"{state.settings.public_base}/#/apps/{install_id}?dev=1",
    )


async def put_dev_pages(request: Request, state: AppState) -> Response:
    install, user_id, key_id, _ = await frame_caller(request, state, DEV_PAGES_ARE)
    body = await read_body(request, DevPagesBody, L.MAX_DEPLOY_BODY_BYTES)
    files = _checked(body)
    store = state.store
    pages = await store.io(
        store.put_dev_pages,
        install.id,
        user_id,
        body.entry,
        files,
        ttl_s=L.DEV_PAGES_TTL_S,
        max_bytes=L.DEV_PAGES_MAX_BYTES,
    )
    if pages.revision == 1:  # none were held: the first PUT of a `runnerd app dev`
        await store.io(
            store.audit,
            "app.dev",
            workspace_id=install.workspace_id,
            install_id=install.id,
            version_id=install.version_id,
            actor_user_id=user_id,
            actor_key_id=key_id,
            detail={"files": pages.files, "bytes": pages.size},
        )
    return json_response(_info(state, install.id, user_id, pages))


async def get_dev_pages(request: Request, state: AppState) -> Response:
    install, user_id, _, _ = await frame_caller(request, state, DEV_PAGES_ARE)
    store = state.store
    pages = await store.io(store.dev_pages, install.id, user_id, ttl_s=L.DEV_PAGES_TTL_S)
    if pages is None:
        raise NoDevPages
    return json_response(_info(state, install.id, user_id, pages))


async def delete_dev_pages(request: Request, state: AppState) -> Response:
    install, user_id, _, _ = await frame_caller(request, state, DEV_PAGES_ARE)
    store = state.store
    held = await store.io(store.drop_dev_pages, install.id, user_id)
    return json_response(Deleted(name="dev-pages", deleted=held))


_ABOUT = (
    "A person's pages from their own machine (runnerd app dev), kept in the store for them "
    "and this install only, so every node serves them (never listed or served to anyone "
    "else, dropped an hour after the last PUT), on the apps origin at "
    "<apps_url>/d/<token>/<path> with a deployed page's CSP. Their frame's bridge calls run "
    "the installed version's tools, as surface app."
)

OPS = [
    Op(
        "PUT",
        "/api/v2/apps/installs/{installId}/dev-pages",
        "putDevPages",
        "Show your local pages in the install's frame (runnerd app dev)",
        put_dev_pages,
        DevPagesInfo,
        body=DevPagesBody,
        params=(INSTALL_ID,),
        errors=(400, 401, 403, 404, 409, 415, 429, 500),
        description=_ABOUT + " The body replaces what you held, in one transaction; audited "
        "as app.dev when none was held. 409 PAGES_OFF when apps_port is 0.",
    ),
    Op(
        "GET",
        "/api/v2/apps/installs/{installId}/dev-pages",
        "getDevPages",
        "Your dev pages of the install: the frame's URL and revision",
        get_dev_pages,
        DevPagesInfo,
        params=(INSTALL_ID,),
        errors=(401, 403, 404, 409, 429, 500),
        description=_ABOUT + " 404 NO_DEV_PAGES when you hold none.",
    ),
    Op(
        "DELETE",
        "/api/v2/apps/installs/{installId}/dev-pages",
        "deleteDevPages",
        "Drop your dev pages of the install",
        delete_dev_pages,
        Deleted,
        params=(INSTALL_ID,),
        errors=(401, 403, 404, 409, 429, 500),
        description=_ABOUT,
    ),
]
