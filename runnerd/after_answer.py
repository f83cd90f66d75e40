"""Work that waits until the answer to the current HTTP request has been sent.

A call's run ends by starting the next waiting jail of its kind. That start (its
pipes, its uid, handing nsjail's fork to the spawner thread) takes the event loop and
the GIL for a while, more under load: done before the answer is written, it is paid by
the caller who is waiting for that answer. So the run engine hands such work to
``after_answer``, and ``AnswerFirst``, the outermost middleware, runs it as soon as the
response's last byte has been handed to the socket, in the same turn of the event loop.
Outside a request (a background task, ``runnerd tool test``) the work runs on the next
turn of the loop.

A run's end (row, ledger, audit) is never such work: it is written before the answer,
so whoever holds a success can already read it in the ledger, and a daemon killed
after answering cannot leave a success recorded as interrupted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["AnswerFirst", "after_answer"]

log = logging.getLogger(__name__)


class _Pending:
    """The work of one request; ``open`` until its answer is sent."""

    __slots__ = ("open", "work")

    def __init__(self) -> None:
        self.open = True
        self.work: list[Callable[[], None]] = []


_PENDING: ContextVar[_Pending | None] = ContextVar("runnerd_after_answer", default=None)


def after_answer(work: Callable[[], None]) -> None:
    """Run ``work`` once the current request's answer is sent (on the next turn of the
    loop when there is no request, or its answer is already sent)."""
    pending = _PENDING.get()
    if pending is not None and pending.open:
        pending.work.append(work)
    else:
        asyncio.get_running_loop().call_soon(work)


class AnswerFirst:
    """Runs what ``after_answer`` was given right after the request's last response
    message is sent (uvicorn has written it to the socket when ``send`` returns), before
    anything else on the loop. Work left when the app returns without a last message (a
    client gone, an error) runs then."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        pending = _Pending()

        async def send_then_work(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                _run(pending)

        token = _PENDING.set(pending)
        try:
            await self.app(scope, receive, send_then_work)
        finally:
            _PENDING.reset(token)
            _run(pending)


def _run(pending: _Pending) -> None:
    pending.open = False
    work, pending.work = pending.work, []
    for one in work:
        try:
            one()
        except Exception:
            log.exception("work after an answer failed")
