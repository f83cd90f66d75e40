"""The Manage page's routes: the page itself (one HTML file and its scripts and styles,
all shipped in the wheel, nothing fetched from anywhere else) and the usage chart. The
security headers every answer carries are added by runnerd/daemon/middleware.py."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from runnerd.api.auth import install_for
from runnerd.api.errors import envelope
from runnerd.api.state import AppState
from runnerd.errors import RunnerdError
from runnerd.web.chart import usage_svg
from runnerd.web.csp import CSP

__all__ = ["web_routes"]

STATIC = Path(__file__).with_name("static")


async def page(request: Request) -> Response:
    """The page: one HTML shell; the script draws every screen from the API. Its CSP is
    every answer's, but that it may frame the apps origin (an app's pages, bridge.js)."""
    state: AppState = request.app.state.runnerd
    headers = {"Cache-Control": "no-store"}
    apps = state.settings.apps_base
    if apps is not None:
        headers["Content-Security-Policy"] = f"{CSP}; frame-src {_origin(apps)}"
    return FileResponse(STATIC / "index.html", headers=headers)


def _origin(url: str) -> str:
    """The origin of ``url`` (scheme, host and port), as a CSP source."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


async def usage_chart(request: Request) -> Response:
    state: AppState = request.app.state.runnerd
    try:
        install, _ = await install_for(request, state, scope="api:read", role="viewer")
    except RunnerdError as exc:
        error = envelope(exc)
        return Response(error.message, status_code=error.status, media_type="text/plain")
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
