"""The surface a run came from, proven by how the call came, never taken on a body's word.

Which credential proves which surface (docs/GOVERNANCE.md has the table):

- an OAuth access token: ``chat`` (a chat client the person consented to); calls over
  MCP are ``chat`` (mcp/gateway.py's ``mcp_surface``), but a relay's token stays
  ``relay`` there too, so MCP is no way around its approval rules;
- a token bound to a surface when it was made (``relay``, ``workflow``, ``chat``: the keys
  API's ``surface``, ``runnerd admin token --surface``): that surface;
- a Manage-page session with an ``X-Runnerd-Frame`` header that verifies (api/frames.py)
  for the install called and the session's person: ``app`` (the app bridge);
- any other personal key, token or session: ``api``; a session may name ``test`` (the
  Manage page's test-run form).

The host CLI calls the API with a personal key like any other program, so nothing proves
it is the CLI: its runs are ``api``.

A body's ``surface`` is a claim checked against that: ``api`` (the default, which every
client sent before surfaces were proven) is no claim and is ignored, so the proven surface
is recorded; any other surface must be the proven one, or the run is refused with
SURFACE_NOT_PROVEN. So a relay's token cannot leave the approval its write calls wait for
by naming another surface: naming ``api`` records ``relay`` anyway, naming anything else is
refused.
"""

from __future__ import annotations

from starlette.requests import Request

from runnerd.api.auth import Caller
from runnerd.api.frames import verify_frame_token
from runnerd.errors import SurfaceNotProven
from runnerd.model import Surface
from runnerd.store import InstallRecord

__all__ = ["FRAME_HEADER", "credential_surface", "proven_surface"]

FRAME_HEADER = "X-Runnerd-Frame"


def credential_surface(caller: Caller) -> Surface | None:
    """The surface ``caller``'s key proves by itself: ``chat`` for an OAuth token, a
    token's bound surface; None for a key that proves none (``api`` unless a frame
    proves ``app``)."""
    if caller.key.is_oauth:
        return "chat"
    if caller.key.kind == "token" and caller.key.surface is not None:
        return caller.key.surface  # type: ignore[return-value]  # one of BOUND_SURFACES
    return None


def proven_surface(
    request: Request, caller: Caller, install: InstallRecord, claimed: Surface
) -> Surface:
    """The surface the run of ``install``'s tool by ``caller`` is recorded as (this
    module's rules); SurfaceNotProven for a frame header that does not verify for this
    install and person, or a ``claimed`` surface (the body's) that is neither ``api`` nor
    the proven one."""
    bound = credential_surface(caller)
    frames = request.headers.getlist(FRAME_HEADER.lower())
    if frames:
        if bound is not None or caller.session is None or len(frames) != 1:
            raise SurfaceNotProven(
                f"{FRAME_HEADER} is the app bridge's: it comes once, with the Manage "
                "page's session of the person the frame was opened for",
                field=FRAME_HEADER,
            )
        frame = verify_frame_token(frames[0].strip())
        if frame is None or frame != (install.id, caller.user_id):
            raise SurfaceNotProven(
                f"{FRAME_HEADER} does not verify for this install and person (a frame "
                "runs only its own app's tools, for an hour after it was opened)",
                field=FRAME_HEADER,
            )
        bound = "app"
    proven: Surface = bound or "api"
    if claimed in ("api", proven):
        return proven
    if claimed == "test" and proven == "api" and caller.session is not None:
        return "test"  # the Manage page's test-run form
    raise SurfaceNotProven(
        f"this credential proves the surface {proven}, not {claimed}: leave surface out "
        "(see docs/GOVERNANCE.md, which credential proves which surface)"
    )
