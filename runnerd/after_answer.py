"""Work that waits until the answer to the current HTTP request has been sent.

A call's run ends by starting the next waiting jail of its kind. That start (its
pipes, its uid, handing nsjail's fork to the spawner thread) takes the event loop and
the GIL for a while, more under load: done before the answer is written, it is paid by
the caller who is waiting for that answer. So the run machine hands such work to
``after_answer``, and ``AnswerFirst`` (runnerd/daemon/middleware.py), the outermost
middleware, runs it as soon as the response's last byte has been handed to the socket,
in the same turn of the event loop. Outside a request (a background task, ``runnerd
tool test``) the work runs on the next turn of the loop.

A run's end (row, ledger, audit) is never such work: it is written before the answer,
so whoever holds a success can already read it in the ledger, and a daemon killed
after answering cannot leave a success recorded as interrupted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextvars import ContextVar

__all__ = ["PENDING", "Pending", "after_answer"]


class Pending:
    """The work of one request; ``open`` until its answer is sent."""

    __slots__ = ("open", "work")

    def __init__(self) -> None:
        self.open = True
        self.work: list[Callable[[], None]] = []


# Set by AnswerFirst for the length of each HTTP request.
PENDING: ContextVar[Pending | None] = ContextVar("runnerd_after_answer", default=None)


def after_answer(work: Callable[[], None]) -> None:
    """Run ``work`` once the current request's answer is sent (on the next turn of the
    loop when there is no request, or its answer is already sent)."""
    pending = PENDING.get()
    if pending is not None and pending.open:
        pending.work.append(work)
    else:
        asyncio.get_running_loop().call_soon(work)
