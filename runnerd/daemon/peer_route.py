"""``GET /internal/results/{runId}``: another node of the cluster asks for a result this
node holds in memory (runnerd/govern/peers.py). Not part of the public API: a request
without a node's signature, for a run this node holds nothing of, with a signature of
another run, made too long ago or seen before, is 404 alike; a good one made for another
node is 421 (the nodes table gives this node's address to another)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.state import AppState
from runnerd.govern.peers import PEER_ANSWER_HEADER, PEER_HEADER

__all__ = ["peer_result"]


async def peer_result(request: Request) -> Response:
    state: AppState = request.app.state.runnerd
    headers = {"Cache-Control": "no-store"}
    token = request.headers.get(PEER_HEADER, "")
    if not token:
        return Response(status_code=404, headers=headers)
    status, body, mac = state.governor.peers.answer(request.path_params["run_id"], token)
    if mac is None:
        return Response(status_code=status, headers=headers)
    headers[PEER_ANSWER_HEADER] = mac
    return Response(body, media_type="application/json", headers=headers)
