"""The apps origin: a second listener of the daemon that serves apps' pages, and nothing
else (issue 26).

The daemon listens on ``apps_port`` too (default: port + 1; 0: no pages), in the same
uvicorn server and event loop (daemon/server.py adds the listener); ``ByListener`` sends
each request to the app of the socket it came in on: the apps port's to ``AppsOrigin``,
the rest to the daemon's app (which also runs the lifespan). So the apps origin shares
the store and the frame keys, and it can never answer the API, the Manage page, /mcp or
anything of a tool: it knows two routes.

``GET /f/<token>/<path>`` (and HEAD): the page ``path`` of the version the token's install
runs now (one query: a switch or rollback changes it at once), while the token verifies
(api/frames.py) and its person is still a member with Apps access there. ``/f/<token>/``
is the entry page. ``GET /d/<token>/<path>``: the same for the dev pages the token's
person holds for its install (``runnerd app dev``, api/dev_pages.py: in the store, so
any node serves them, one file row a request), with the same checks and headers; anyone
else's token finds none. The path is read from the raw request
path, segment by segment: an encoded slash or backslash, a NUL, an empty, ``.`` or ``..``
segment is no page. Every other request is 404. Answers carry a strict CSP (scripts and
everything else from the apps origin only, no connections, framed only by the Manage
page's origin), nosniff, no referrer, an ETag from the page's sha256; no cookie is read or
set.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from runnerd import limits as L
from runnerd.api.frames import verify_frame_token
from runnerd.config import Settings
from runnerd.govern.admission import may_run
from runnerd.store import Store

__all__ = ["AppsOrigin", "ByListener", "HideFrameTokens", "page_csp"]

log = logging.getLogger("runnerd")

_TOKEN_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")


def page_csp(settings: Settings) -> str:
    """The Content-Security-Policy of every answer of the apps origin: everything from the
    apps origin only ('self'), no connection anywhere (a page's calls go through the
    bridge, postMessage to the Manage page), framed by the Manage page's origin only."""
    public = urlsplit(settings.public_base)
    manage = f"{public.scheme}://{public.netloc}"
    # sandbox: a page opened on its own (a link, not the frame) is as confined as in the
    # frame: an opaque origin, so it can neither read nor set a cookie of any host (a page
    # could otherwise toss a session cookie onto the Manage page's host or a parent domain).
    return (
        "default-src 'self'; script-src 'self'; connect-src 'none'; object-src 'none'; "
        f"base-uri 'self'; frame-ancestors {manage}; "
        "sandbox allow-scripts allow-forms"
    )


class ByListener:
    """The ASGI app uvicorn serves: a request that came in on the apps port goes to
    ``apps``; everything else (the lifespan too) to ``main``, as before."""

    def __init__(self, main: ASGIApp, apps: ASGIApp, apps_port: int) -> None:
        self.main = main
        self.apps = apps
        self.apps_port = apps_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if (
            self.apps_port
            and scope["type"] in ("http", "websocket")
            and server is not None
            and server[1] == self.apps_port
        ):
            await self.apps(scope, receive, send)
        else:
            await self.main(scope, receive, send)


class AppsOrigin:
    """The apps listener's app: pages only (this module's docstring). ``main``: the
    daemon's app, whose state (``state.runnerd``: the store) it reads."""

    def __init__(self, main: Any, settings: Settings) -> None:
        self.main = main
        self.manage = settings.public_base
        self.headers = [
            (b"content-security-policy", page_csp(settings).encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
            (b"cross-origin-opener-policy", b"same-origin"),
            # The frame has an opaque origin (sandbox, no allow-same-origin): its module
            # scripts and fonts are CORS requests. The token in the URL is what opens a
            # page, whoever asks; no credential is ever read.
            (b"access-control-allow-origin", b"*"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        status, body, headers = await self._answer(scope)
        if scope["method"] == "HEAD":
            body = b""
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _not_found(self) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        body = b"Not found\n"
        return (
            404,
            body,
            [
                *self.headers,
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
            ],
        )

    def _not_in_frame(self) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        body = (
            f"An app's page opens in its frame on the Manage page ({self.manage}), "
            "not on its own.\n"
        ).encode()
        return (
            403,
            body,
            [
                *self.headers,
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
            ],
        )

    async def _answer(self, scope: Scope) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        if scope["method"] not in ("GET", "HEAD"):
            return self._not_found()
        if _fetch_dest(scope) in _NOT_A_FRAME:
            return self._not_in_frame()  # a browser opening a page as a window, or embedding it
        raw = scope.get("raw_path") or scope["path"].encode()
        dev = raw.startswith(b"/d/")  # a person's dev pages (api/dev_pages.py), not a version's
        found = _page_address(b"/f/" + raw[3:] if dev else raw)
        if found is None:
            return self._not_found()
        token, path = found
        frame = verify_frame_token(token)
        state = getattr(self.main.state, "runnerd", None)
        if frame is None or state is None:
            return self._not_found()
        install_id, user_id = frame
        store: Store = state.store

        def lookup() -> tuple[bytes, str, str] | None:
            install = store.get_install(install_id)
            if install is None or not may_run(store.membership(install.workspace_id, user_id)):
                return None  # the person left, or lost Apps access, since the frame opened
            if dev:  # the token's person's only, one file row, whichever node took the PUT
                return store.dev_page(install_id, user_id, path, ttl_s=L.DEV_PAGES_TTL_S)
            page = path
            if page is None:
                page = store.page_entry(install.version_id)
                if page is None:
                    return None
            return store.installed_page(install_id, page)

        served = await store.io(lookup)
        if served is None:
            return self._not_found()
        content, content_type, sha256 = served
        etag = f'"{sha256}"'.encode()
        headers = [
            *self.headers,
            (b"etag", etag),
            (b"cache-control", b"private, no-cache"),
        ]
        if etag in _if_none_match(scope):
            return 304, b"", headers
        headers += [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(content)).encode()),
        ]
        return 200, content, headers


class HideFrameTokens(logging.Filter):
    """uvicorn's access lines with each ``/f/<token>/`` as ``/f/…/``: a frame token opens
    a person's frame for an hour, and a log is no place for it."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            path = args[2]
            if path.startswith(("/f/", "/d/")):
                _, slash, rest = path[3:].partition("/")
                record.args = (*args[:2], path[:3] + "…" + slash + rest, *args[3:])
        return True


# What a browser loads a page as (Sec-Fetch-Dest) when it is not the frame or one of the
# frame's own files: a top-level window (a link opened on its own), <embed>, <object>.
_NOT_A_FRAME = frozenset({b"document", b"embed", b"object"})


def _fetch_dest(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", []):
        if name == b"sec-fetch-dest":
            return bytes(value)
    return None


def _if_none_match(scope: Scope) -> list[bytes]:
    tags: list[bytes] = []
    for name, value in scope.get("headers", []):
        if name == b"if-none-match":
            tags += [t.strip().removeprefix(b"W/") for t in value.split(b",")]
    return tags


def _page_address(raw: bytes) -> tuple[str, str | None] | None:
    """(token, page path) of a raw request path ``/f/<token>/<path>``; the path None for
    ``/f/<token>/`` (the entry page); None when it is no page's address."""
    if not raw.startswith(b"/f/"):
        return None
    token, slash, rest = raw[3:].partition(b"/")
    if not token or not slash or not set(token) <= _TOKEN_CHARS:
        return None
    if rest == b"":
        return token.decode(), None
    segments = []
    for segment in rest.split(b"/"):
        try:
            decoded = unquote_to_bytes(segment).decode("utf-8")
        except UnicodeDecodeError:
            return None
        if decoded in ("", ".", "..") or any(c in decoded for c in "/\\\0"):
            return None
        segments.append(decoded)
    return token.decode(), "/".join(segments)
