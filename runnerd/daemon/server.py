"""Serving the app with uvicorn, and stopping gracefully.

On SIGTERM (or SIGINT) the daemon first stops admitting runs: every new call gets 503
``RUNNERD_STOPPING`` with Retry-After, while runs already in their jails go on for up to
``stop_grace_s``. Runs still going then are ended as ``failed``/``interrupted`` with their
run, ledger and audit rows, as a restart would end them; then uvicorn stops (closing the
port, ending open requests) and the lifespan closes the jails and the store. The exit
status is 0. A second signal cuts the grace short: the runs still going end at once, as
interrupted (their callers are answered so, never a 500), and the stop goes on as
above, still 0. A third stops without waiting for anything (exit 128 + the signal).

What keeps the daemon from starting (the ports taken; a refusal of the lifespan: another
daemon on the data dir, the store, its keys) is one line on stderr saying what to do, and
exit status 1: never a traceback of the server's start.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import resource
import socket
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from uvicorn.config import STARTUP_FAILURE

from runnerd.config import Settings
from runnerd.daemon.apps_origin import AppsOrigin, ByListener, HideFrameTokens
from runnerd.daemon.connections import ConnectionLimits, protocol_class
from runnerd.limits import (
    ACCEPT_BATCH,
    FILES_PER_EGRESS_CONNECTION,
    FILES_PER_JAIL,
    LISTEN_BACKLOG,
    OPEN_FILES,
    SPARE_FILES,
)

__all__ = ["raise_open_files", "sd_notify", "serve"]

log = logging.getLogger("runnerd")


def sd_notify(message: str) -> bool:
    """Tell systemd (Type=notify) how the service is: READY=1, STOPPING=1, STATUS=...
    Nothing happens outside systemd (no NOTIFY_SOCKET)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), address)
        except OSError:
            return False
    return True


class _Server(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, app: Starlette, grace_s: float, apps_port: int = 0
    ) -> None:
        super().__init__(config)
        self.app = app
        self.grace_s = grace_s
        self.apps_port = apps_port
        self.draining: asyncio.Task[None] | None = None
        self.signals = 0  # how many stop signals came (the 2nd hurries, the 3rd forces)
        self.hurry = asyncio.Event()  # the grace is over: interrupt the runs now

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit and self.apps_port:
            await self._listen_for_apps()
        for server in getattr(self, "servers", []):
            for listener in server.sockets:  # asyncio listened with ACCEPT_BATCH: more room
                with listener.dup() as sock:
                    sock.listen(LISTEN_BACKLOG)
        if not self.should_exit:  # the lifespan ran: the store is open, warm jails are up
            sd_notify(f"READY=1\nSTATUS=serving on {self.config.host}:{self.config.port}")

    async def _listen_for_apps(self) -> None:
        """The apps origin's listener (daemon/apps_origin.py), on the same host, protocol,
        connection caps and event loop as the daemon's port; ByListener sends what comes
        in on it to the pages. A port that cannot be had stops the start, as the main
        port's does."""
        config = self.config
        protocol = functools.partial(
            config.http_protocol_class,  # as uvicorn's startup makes its protocols
            config=config,  # type: ignore[call-arg]
            server_state=self.server_state,
            app_state=self.lifespan.state,
        )
        try:
            server = await asyncio.get_running_loop().create_server(
                protocol, host=config.host, port=self.apps_port, backlog=config.backlog
            )
        except OSError as exc:
            log.error("the apps origin cannot listen on port %d: %s", self.apps_port, exc)
            for opened in self.servers:
                opened.close()
            await self.lifespan.shutdown()
            sys.exit(STARTUP_FAILURE)
        self.servers.append(server)
        log.info("serving apps' pages on %s:%d", config.host, self.apps_port)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state = getattr(self.app.state, "runnerd", None)
        self.signals += 1
        if state is None or self.signals > 2:
            super().handle_exit(sig, frame)  # not serving yet, or a third signal: now
            if self.signals > 2:
                self.force_exit = True
            return
        if self.draining is not None:  # a second signal: the runs still going end now
            log.warning("stopping: a second signal: ending the runs still going now")
            self.hurry.set()
            return
        state.governor.gate.closing = True
        sd_notify("STOPPING=1\nSTATUS=draining runs")
        self.draining = asyncio.get_event_loop().create_task(self._drain(sig, frame))

    async def _drain(self, sig: int, frame: FrameType | None) -> None:
        state = self.app.state.runnerd
        running = state.governor.running
        log.info(
            "stopping: %d run(s) in their jails get %g s to finish", len(running), self.grace_s
        )
        deadline = time.monotonic() + self.grace_s
        while state.governor.running and time.monotonic() < deadline and not self.hurry.is_set():
            await asyncio.sleep(0.05)
        left = await state.governor.interrupt(state.governor.running)
        if left:
            log.warning("stopping: ended %d run(s) as failed (interrupted)", len(left))
        # Not handle_exit: uvicorn would raise the signal again once stopped, and a
        # drained stop exits 0.
        self.should_exit = True


def raise_open_files(settings: Settings) -> int:
    """Raise RLIMIT_NOFILE's soft limit to OPEN_FILES (or the hard limit, if lower; never
    lower it), log it, and warn when it leaves too few for the connection caps; the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES if hard == resource.RLIM_INFINITY else min(OPEN_FILES, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("open files: cannot raise the limit from %d to %d: %s", soft, target, exc)
        else:
            log.info("open files: limit raised from %d to %d (hard limit %d)", soft, target, hard)
            soft = target
    else:
        log.info("open files: limit %d (hard limit %d)", soft, hard)
    runs = settings.max_concurrent_runs + settings.warm_jails * 2
    per_run = FILES_PER_JAIL + FILES_PER_EGRESS_CONNECTION * settings.egress_max_connections
    needed = settings.http_max_connections + SPARE_FILES + runs * per_run
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "open files: the limit %d is below the %d the settings may use "
            "(http_max_connections, runs and their egress); raise LimitNOFILE or lower them",
            soft,
            needed,
        )
    return soft


class _Refusals:
    """The app, but a refusal of its lifespan's start (SystemExit: what to fix, in one
    line; any other exception) is kept as ``refusal`` instead of reaching uvicorn's log
    as a traceback; uvicorn stops the start as it would have."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.refusal: str | None = None

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def quiet(message: Any) -> None:
            if message.get("type") == "lifespan.startup.failed":
                message = {"type": message["type"]}  # its traceback: said in one line below
            await send(message)

        try:
            await self.app(scope, receive, quiet)
        except SystemExit as exc:
            self.refusal = str(exc.code)
            raise
        except Exception as exc:
            log.debug("the start failed", exc_info=exc)
            self.refusal = f"runnerd: cannot start: {type(exc).__name__}: {exc}"
            raise


class _HideStartFailure(logging.Filter):
    """uvicorn's "Application startup failed" and "Exception in 'lifespan'": the refusal
    is printed in one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return not text.startswith(("Application startup failed", "Exception in 'lifespan'"))


def _ports_free(host: str, ports: list[tuple[int, str]]) -> None:
    """SystemExit naming the first of ``ports`` (port, what it is for) another program
    listens on, before anything starts (uvicorn would only log errno 98 once the store
    and the jails are up)."""
    for port, what in ports:
        if port == 0:
            continue
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise SystemExit(f"runnerd: cannot listen on {host}:{port}: {exc}") from None
                flag = "--port or RUNNERD_PORT" if what == "port" else "RUNNERD_APPS_PORT"
                raise SystemExit(
                    f"runnerd: port {port} on {host} ({what}) is taken, by another runnerd "
                    f"or another program: stop it, or serve on another port ({flag})"
                ) from None


def serve(app: Starlette, settings: Settings) -> None:
    """Serve ``app`` until stopped (module docstring). SystemExit with one line when it
    cannot start: a port taken (checked first), or the lifespan's refusal."""
    apps_port = settings.apps_listen_port
    _ports_free(settings.host, [(settings.port, "port"), (apps_port, "apps_port")])
    raise_open_files(settings)
    limits = ConnectionLimits(
        header_timeout_s=settings.http_header_timeout_s,
        body_timeout_s=settings.http_body_timeout_s,
        per_client=settings.http_max_connections_per_client,
        total=settings.http_max_connections,
    )
    served = _Refusals(ByListener(app, AppsOrigin(app, settings), apps_port) if apps_port else app)
    if apps_port:
        logging.getLogger("uvicorn.access").addFilter(HideFrameTokens())
    config = uvicorn.Config(
        served,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # runnerd.logs configured every logger, uvicorn's too
        # Measured (docs/BENCHMARKS.md): httptools parses a request ~0.1 ms faster than h11;
        # uvloop made calls slower (its child processes), so never pick it up by chance.
        # Its httptools protocol with a deadline for request heads and bodies and caps on
        # connections (runnerd/daemon/connections.py). Not uvicorn's limit_concurrency: it
        # answers every request 503 past N connections, /healthz too, so slow clients
        # would shut everyone out. Its keep-alive timeout (5 s) stays.
        http=protocol_class(limits),
        backlog=ACCEPT_BATCH,
        loop="asyncio",
        timeout_graceful_shutdown=2,  # runs had their grace already: end open requests
    )
    hide = _HideStartFailure()
    logging.getLogger("uvicorn.error").addFilter(hide)
    server = _Server(config, app, settings.stop_grace_s, apps_port)
    try:
        server.run()
    except SystemExit:  # uvicorn's exit when the start failed (3)
        if served.refusal is None:
            raise SystemExit("runnerd: the daemon did not start; its log above says why") from None
    finally:
        logging.getLogger("uvicorn.error").removeFilter(hide)
    if served.refusal is not None:
        raise SystemExit(served.refusal)
