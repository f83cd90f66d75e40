"""Serving the app with uvicorn, and stopping gracefully.

On SIGTERM (or SIGINT) the daemon first stops admitting runs: every new call gets 503
``RUNNERD_STOPPING`` with Retry-After, while runs already in their jails go on for up to
``stop_grace_s``. Runs still going then are ended as ``failed``/``interrupted`` with their
run, ledger and audit rows, as a restart would end them; then uvicorn stops (closing the
port, ending open requests) and the lifespan closes the jails and the store. The exit
status is 0. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import resource
import socket
import sys
import time
from types import FrameType

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
        if self.draining is not None or state is None:
            super().handle_exit(sig, frame)  # a second signal, or not serving yet: now
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
        while state.governor.running and time.monotonic() < deadline:
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


def serve(app: Starlette, settings: Settings) -> None:
    raise_open_files(settings)
    limits = ConnectionLimits(
        header_timeout_s=settings.http_header_timeout_s,
        body_timeout_s=settings.http_body_timeout_s,
        per_client=settings.http_max_connections_per_client,
        total=settings.http_max_connections,
    )
    apps_port = settings.apps_listen_port
    served = ByListener(app, AppsOrigin(app, settings), apps_port) if apps_port else app
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
    _Server(config, app, settings.stop_grace_s, apps_port).run()
