"""Work after an answer (runnerd/after_answer.py, AnswerFirst in
runnerd/daemon/middleware.py): the next warm jail's start waits until
the answer that made room for it has been sent."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from runnerd.after_answer import after_answer
from runnerd.daemon.middleware import AnswerFirst


def _scope() -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": "/", "raw_path": b"/", "root_path": "",
            "scheme": "http", "query_string": b"", "headers": [], "http_version": "1.1",
            "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1234)}  # fmt: skip


def test_work_given_during_a_request_runs_once_its_answer_is_sent() -> None:
    events: list[str] = []

    async def endpoint(request: Request) -> PlainTextResponse:
        after_answer(lambda: events.append("work"))
        # A task the request started (the pipeline's own) hands work over the same way.
        await asyncio.ensure_future(_later(events))
        return PlainTextResponse("ok")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        events.append(message["type"])

    inner = Starlette(routes=[Route("/", endpoint)])

    async def app_then_note(scope: Any, receive: Any, send: Any) -> None:
        await inner(scope, receive, send)
        events.append("app returned")

    app = AnswerFirst(app_then_note)
    asyncio.run(app(_scope(), receive, send))
    # The work runs as soon as the last byte is handed over, before the app (and the loop)
    # moves on: nothing else is served in between.
    assert events == [
        "http.response.start",
        "http.response.body",
        "work",
        "task work",
        "app returned",
    ]


def test_work_of_a_request_that_sent_no_answer_runs_when_it_ends() -> None:
    events: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        after_answer(lambda: events.append("work"))
        raise ConnectionResetError("the client went away")

    async def main() -> None:
        try:
            await AnswerFirst(app)(_scope(), None, None)  # type: ignore[arg-type]
        except ConnectionResetError:
            events.append("raised")

    asyncio.run(main())
    assert events == ["work", "raised"]


async def _later(events: list[str]) -> None:
    after_answer(lambda: events.append("task work"))


def test_work_outside_a_request_runs_on_the_next_turn_of_the_loop() -> None:
    events: list[str] = []

    async def main() -> None:
        after_answer(lambda: events.append("work"))
        events.append("after the call")
        await asyncio.sleep(0)

    asyncio.run(main())
    assert events == ["after the call", "work"]
