"""The Manage page's routes: the page itself (one HTML file and its scripts and styles,
all shipped in the wheel, nothing fetched from anywhere else), the usage chart, and the
security headers every answer of the daemon carries."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runnerd.api.auth import install_for
from runnerd.api.errors import ApiError
from runnerd.api.state import AppState
from runnerd.web.chart import usage_svg

__all__ = ["SecurityHeaders", "web_routes"]

STATIC = Path(__file__).with_name("static")

# No inline script or style, nothing from another origin, no framing.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


class SecurityHeaders:
    """Adds the security headers to every answer (the API's JSON too)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (name, value) for name, value in HEADERS if name not in present
                ]
            await send(message)

        await self.app(scope, receive, with_headers)


async def page(request: Request) -> Response:
    """The page: one HTML shell; the script draws every screen from the API."""
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})


async def usage_chart(request: Request) -> Response:
    state: AppState = request.app.state.runnerd
    try:
        install, _ = await install_for(request, state, scope="api:read", role="viewer")
    except ApiError as exc:
        return Response(exc.message, status_code=exc.status, media_type="text/plain")
    days = 30
    svg = usage_svg(await state.store.io(state.store.usage_by_day, install.id, days), days)
    return Response(svg, media_type="image/svg+xml", headers={"Cache-Control": "no-store"})


def web_routes() -> list[Route | Mount]:
    return [
        Route("/", page, methods=["GET"]),
        Route("/login", page, methods=["GET"]),
        Route("/manage/installs/{installId}/usage.svg", usage_chart, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
