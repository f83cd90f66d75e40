"""The daemon's app in the test process, for the API's contract: ``create_app`` with its
lifespan and middleware, on an event loop in a thread of its own, reached through httpx's
ASGI transport; a data dir and a real store (a SQLite file, or a PostgreSQL database) of
its own; no port, no warm jails, and an nsjail that fails loudly if a test runs a tool.

``InProcess`` is ``daemon.Daemon``'s twin (the same ``Runnerd`` helpers), so a module
moves between the two by its fixture: ``app_daemon`` here, ``daemon`` for a real
``runnerd serve``. What needs a real daemon stays on one: running tools, the transport
(ports, slow connections, streams), stopping, and the hostile suites.
"""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio.from_thread
import httpx

from daemon import Runnerd, new_data_dir, runnerd_env
from runnerd.config import load_settings
from runnerd.daemon.app import create_app
from runnerd.govern.people import bootstrap
from runnerd.run.runtimes import Runtimes, find_runtimes
from runnerd.store import Store

# No socket serves it: a client that is not one of ``InProcess.client()``'s fails to
# resolve the host (.invalid never resolves) instead of reaching something else.
URL = "http://in-process.invalid"
# What the app's ASGI scope says about its caller, as a loopback client of a daemon.
CLIENT = ("127.0.0.1", 50_000)

# The fast tier starts no jail: a test that runs a tool is marked ``jail`` and uses the
# ``daemon`` fixture. The nsjail of an in-process app only leaves a mark and says so.
JAIL_STARTED = (
    "nsjail started by an in-process test: a test that runs a tool is marked jail and uses "
    "the daemon fixture"
)
JAIL_MARK = "nsjail-was-started"  # in the data dir, beside NO_NSJAIL
NO_NSJAIL = f"""#!/bin/sh
touch "$(dirname "$0")/{JAIL_MARK}"
echo "{JAIL_STARTED}" >&2
exit 111
"""


class _AppTransport(httpx.BaseTransport):
    """httpx's ASGI transport for a sync client: each request goes to the app on the
    portal's event loop, and its answer comes back whole (no streaming)."""

    def __init__(self, app: Any, portal: anyio.from_thread.BlockingPortal) -> None:
        self._asgi = httpx.ASGITransport(app, client=CLIENT, raise_app_exceptions=False)
        self._portal = portal

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # a body given as an iterator, whole: the ASGI transport reads it
        return self._portal.call(self._answer, request)

    async def _answer(self, request: httpx.Request) -> httpx.Response:
        response = await self._asgi.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        raw = b"".join([part async for part in response.stream])
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=httpx.ByteStream(raw),
            extensions=response.extensions,
        )


class InProcess(Runnerd):
    """The daemon's app in this process: ``http`` and ``client()`` reach it, ``store()``
    opens its store, ``env`` runs a local ``runnerd`` command on its data dir. It has no
    port, no process and no URL another program could use."""

    def __init__(
        self,
        data_dir: Path,
        workspace_id: str,
        admin_key: str,
        env: dict[str, str],
        transport: httpx.BaseTransport,
    ) -> None:
        super().__init__(data_dir, URL, workspace_id, admin_key, env, transport)

    @property
    def jail_started(self) -> bool:
        """Whether anything started this app's nsjail (NO_NSJAIL) since it began, or
        since ``forget_jail_start``."""
        return (self.data_dir / JAIL_MARK).exists()

    def forget_jail_start(self) -> None:
        (self.data_dir / JAIL_MARK).unlink(missing_ok=True)


@functools.cache
def _runtimes(python: str | None, node: str) -> Runtimes:
    """The Python and Node an app checks uploads with, found once for every in-process
    app (finding them runs each one); never staged for jails, since none runs here."""
    return find_runtimes(python, node)


def _bootstrap(store: Store) -> tuple[str, str]:
    """What ``runnerd admin bootstrap --workspace Acme --email ada@example.com`` makes:
    the workspace, its admin and a personal key; (workspace id, key)."""
    made = bootstrap(store, "Acme", "ada@example.com")
    return made.workspace_id, made.api_key


@contextmanager
def _logged_to(path: Path) -> Iterator[None]:
    """The app's log records of warnings and worse in ``path``, as a daemon's serve.log
    has them (the test process's log levels are left as they are)."""
    handler = logging.FileHandler(path)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("runnerd")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


@contextmanager
def in_process(toolchain_dir: Path, **settings: str) -> Iterator[InProcess]:
    """The daemon's app with these settings (setting name -> value, as RUNNERD_*
    variables give them), bootstrapped as ``running_daemon`` bootstraps a daemon, its
    lifespan started; stopped, and its data dir removed, on the way out. Fails when a
    test made it start nsjail."""
    data = new_data_dir()
    guard = data / "no-nsjail"
    guard.write_text(NO_NSJAIL)
    guard.chmod(0o755)
    # The in-process URL's host is served (/mcp checks Host), unless a test says otherwise.
    served = {"allowed_hosts": urlsplit(URL).hostname or ""}
    env = runnerd_env(
        data, toolchain_dir, {"warm_jails": "0", "nsjail": str(guard), **served, **settings}
    )
    loaded = load_settings(env=env)
    store = Store.open(loaded, migrate=True)  # a new PostgreSQL database needs its schema
    try:
        workspace_id, admin_key = _bootstrap(store)
    finally:
        store.close()
    runtimes = _runtimes(loaded.python, loaded.node)
    app = create_app(loaded, freeze_heap=False, runtimes=runtimes)  # the process outlives it
    try:
        with (
            _logged_to(data / "serve.log"),
            anyio.from_thread.start_blocking_portal("asyncio") as portal,
            portal.wrap_async_context_manager(app.router.lifespan_context(app)),
        ):
            found = InProcess(data, workspace_id, admin_key, env, _AppTransport(app, portal))
            try:
                yield found
            finally:
                found.http.close()
        assert not found.jail_started, JAIL_STARTED
    finally:
        shutil.rmtree(data, ignore_errors=True)
