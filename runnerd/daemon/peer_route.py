"""``GET /internal/results/{runId}``: another node of the cluster asks for a result this
node holds in memory (runnerd/govern/peers.py). Not part of the public API: a request
without a node's signature, for a run this node holds nothing of, or with a signature of
another run or made too long ago, is 404 alike."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.state import AppState
from runnerd.govern.peers import PEER_HEADER

__all__ = ["peer_result"]


async def peer_result(request: Request) -> Response:
    state: AppState = request.app.state.runnerd
    token = request.headers.get(PEER_HEADER, "")
    held = state.governor.peers.answer(request.path_params["run_id"], token) if token else None
    if held is None:
        return Response(status_code=404, headers={"Cache-Control": "no-store"})
    return Response(held, media_type="application/json", headers={"Cache-Control": "no-store"})
