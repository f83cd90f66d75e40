"""``GET /metrics``: Prometheus text format, for admins only.

A scraper sends the key of a person who is an admin of at least one workspace, as
``Authorization: Bearer …`` (Prometheus' ``authorization`` setting) or ``X-API-Key``.
The numbers are the daemon's, not a workspace's: they carry app slugs and tool names,
never inputs, outputs, secrets or people.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import bearer_or_key
from runnerd.api.errors import envelope, error_response
from runnerd.api.state import AppState
from runnerd.errors import InsufficientRole, RunnerdError, Unauthenticated
from runnerd.metrics import METRICS

__all__ = ["metrics", "watch"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def watch(state: AppState) -> None:
    """The gauges read at each scrape."""
    METRICS.read(METRICS.running, lambda: len(state.governor.running))
    METRICS.read(METRICS.queued, lambda: state.governor.gate.waiting)
    METRICS.read(METRICS.warm, lambda: state.machine.sandbox.warm_pool.waiting)
    METRICS.read(METRICS.approvals, lambda: state.store.pending_approvals())


async def metrics(request: Request) -> Response:
    state: AppState = request.app.state.runnerd
    plaintext = bearer_or_key(request)
    try:
        key = await state.store.io(state.store.find_key, plaintext) if plaintext else None
        if key is None:
            raise Unauthenticated("Send an admin's API key as a Bearer token")
        if key.user_id is None or not await state.store.io(
            state.store.is_admin_anywhere, key.user_id
        ):
            raise InsufficientRole("metrics are for admins of a workspace")
        state.limiter.take(key.rate_bucket)
    except RunnerdError as exc:
        return error_response(envelope(exc))
    # The gauges read the store (pending approvals): off the event loop on PostgreSQL.
    return Response(await state.store.io(METRICS.exposition), media_type=CONTENT_TYPE)
