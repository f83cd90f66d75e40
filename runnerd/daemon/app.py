"""The daemon's ASGI app: routes from the op table, resources in the lifespan, and one
error path for everything that goes wrong."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import gc
import logging
import os
import socket
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from runnerd import __version__
from runnerd.after_answer import AnswerFirst
from runnerd.api.errors import ApiError, code_for_status, error_response, from_domain
from runnerd.api.ops import Op, refuse_body, require_json
from runnerd.api.ratelimit import RateLimiter
from runnerd.api.routes import OPS
from runnerd.api.sessions import CookieSigner
from runnerd.api.state import AppState
from runnerd.config import Settings
from runnerd.daemon.metrics_route import metrics, watch
from runnerd.errors import DatabaseUnavailable
from runnerd.govern.governor import Governor
from runnerd.logs import RequestIds
from runnerd.mcp.endpoint import McpEndpoint
from runnerd.run.jail import JailKind
from runnerd.run.machine import build_machine
from runnerd.store import Store, StoreUnavailable
from runnerd.vault import Vault
from runnerd.web.pages import SecurityHeaders, web_routes

__all__ = ["OPS", "create_app"]

log = logging.getLogger("runnerd")


def _endpoint(op: Op) -> Any:
    changes_state = op.method != "GET"

    async def endpoint(request: Request) -> Response:
        try:
            # Before anything else: what changes state takes a JSON body (415 for any
            # other type, so no cross-site form gets in), or none at all.
            if op.body is not None:
                require_json(request.headers)
            elif changes_state:
                await refuse_body(request)
            return await op.handler(request, request.app.state.runnerd)
        except ApiError as exc:
            return error_response(exc)
        except ClientDisconnect:
            # The client went away mid-body (or its body stalled and was cut): nobody
            # reads an answer, and it is no internal error. Nothing was changed.
            log.debug("%s %s: the client went away before its body ended", op.method, op.path)
            return Response(status_code=400)
        except Exception as exc:
            return _unexpected(request, exc)

    endpoint.__name__ = op.operation_id
    return endpoint


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = code_for_status(exc.status_code)
    headers = dict(exc.headers or {})
    error = ApiError(code, headers=headers)
    return error_response(error)


def _unexpected(request: Request, exc: Exception) -> Response:
    mapped = from_domain(exc)
    if mapped is not None:
        return error_response(mapped)
    # The message may quote an input or a secret: log the type and where, never the text.
    where = "".join(traceback.format_tb(exc.__traceback__))
    log.error(
        "internal error %s on %s %s\n%s",
        type(exc).__name__,
        request.method,
        request.url.path,
        where,
    )
    return error_response(ApiError("INTERNAL_ERROR"))


def _hold_data_dir(data_dir: Path) -> IO[str]:
    """One daemon per data dir: a second one would close the first one's runs as
    interrupted. The lock is released when the process ends, however it ends."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / "daemon.lock", "w")  # noqa: SIM115 - held while serving
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise SystemExit(f"runnerd: another daemon is serving {data_dir}") from None
    return handle


async def _keep_lease(store: Store, calls: Governor, lease_s: float) -> None:
    """Renew this node's lease, close the runs of nodes whose lease ran out, and write
    the ends of runs that finished while the database was away."""
    while True:
        await asyncio.sleep(lease_s / 3)
        try:
            await calls.retry_unfinished()
            if not await store.io(store.renew_lease, lease_s):
                log.error(
                    "this node's lease on the database ran out and another node closed its "
                    "runs; results of runs still going here will not be recorded"
                )
                await store.io(store.join, socket.gethostname(), os.getpid(), __version__, lease_s)
            closed = await store.io(store.recover_lost_nodes)
            if closed:
                log.warning("closed %d run(s) of a node that stopped answering", len(closed))
            await store.io(store.checkpoint_audit)
        except Exception as exc:
            log.error("node lease upkeep failed: %s", type(exc).__name__)


async def _current_egress(store: Store, install_id: str) -> tuple[str, ...] | None:
    """An install's egress grant as stored now (None once it is uninstalled): the proxy
    reads it at each connection of the install's runs, so a narrowing on any node holds."""
    install = await store.io(store.get_install, install_id)
    return None if install is None else install.egress


async def _expire_approvals(calls: Governor) -> None:
    """Expire (and audit) approvals past their time, every few seconds."""
    while True:
        await asyncio.sleep(5)
        try:
            await calls.expire()
        except Exception as exc:
            log.error("approval expiry failed: %s", type(exc).__name__)


def create_app(settings: Settings) -> Starlette:
    gateway = McpEndpoint()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        machine = build_machine(settings, warm=settings.warm_jails)
        for line in machine.report():
            log.info("%s", line)
        for warning in machine.warnings():
            log.warning("%s", warning)
        lock = _hold_data_dir(settings.data_dir)
        try:
            store = Store.open(settings)
        except StoreUnavailable as error:
            raise SystemExit(f"runnerd: {error}") from None
        if not store.db.execute("SELECT 1 FROM workspaces LIMIT 1").fetchone():
            log.warning(
                "no workspace yet in %s: create the first one and its admin with "
                "`runnerd admin bootstrap --data-dir %s --workspace NAME --email YOU`",
                settings.data_dir,
                settings.data_dir,
            )
        if not store.audit_key_matches():
            log.error(
                "the audit trail's newest entry does not verify under this node's audit key "
                "(%s): another key wrote it (give every node the same audit_key or "
                "audit_key_file), or the trail was changed; run `runnerd audit verify`",
                settings.audit_key_path,
            )
        vault = Vault.from_settings(settings.secrets_key, settings.secrets_key_path)
        sealed_with = store.secret_key_ids()
        if sealed_with:  # runs will open secrets: load the cipher now, not in a call
            vault.load()
        foreign = sealed_with - {vault.key_id}
        if foreign:  # never seal new secrets under another key than the stored ones'
            store.close()
            raise SystemExit(
                f"runnerd: the secrets in {store.db.where} are sealed with key "
                f"{', '.join(sorted(foreign))}, and this node's secrets key is {vault.key_id}: "
                "give every node the same key (secrets_key or secrets_key_file)"
            )
        # One node per SQLite file (the data dir's lock): whatever it left running is over.
        # On PostgreSQL, other nodes may be running theirs: only lost nodes' runs close.
        interrupted = store.recover_interrupted() if store.db.dialect == "sqlite" else []
        store.join(socket.gethostname(), os.getpid(), __version__, settings.node_lease_s)
        interrupted += store.recover_lost_nodes()
        if interrupted:
            log.warning(
                "closed %d run(s) left open by the last stop as failed (interrupted)",
                len(interrupted),
            )
        calls = Governor.from_settings(
            settings, store=store, pipeline=machine.pipeline, vault=vault
        )
        if machine.sandbox.proxy is not None:  # a revoked grant stops runs already going
            machine.sandbox.proxy.follow_grants(functools.partial(_current_egress, store))
        app.state.runnerd = AppState(
            settings=settings,
            store=store,
            machine=machine,
            limiter=RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst),
            governor=calls,
            cookies=CookieSigner.from_file(settings.data_dir / "session.key"),
            mcp=gateway,
        )
        gateway.state = app.state.runnerd
        watch(app.state.runnerd)
        expiry = asyncio.ensure_future(_expire_approvals(calls))
        leases = asyncio.ensure_future(_keep_lease(store, calls, settings.node_lease_s))
        languages = [
            lang
            for lang, runtime in (
                ("python", machine.runtimes.python),
                ("javascript", machine.runtimes.node),
                ("typescript", machine.runtimes.node),
            )
            if runtime is not None
        ]
        await machine.sandbox.warm_up([JailKind(lang, None) for lang in languages])
        await machine.sandbox.wait_warm(10)  # ready means warm: the first calls are fast
        log.info("runnerd %s serving data dir %s", __version__, settings.data_dir)
        # Everything loaded so far lives as long as the daemon: out of the collector's
        # sight, a full collection stays short (tens of ms less) whatever runs later.
        gc.collect()
        gc.freeze()
        mcp = asyncio.ensure_future(gateway.serve())
        try:
            yield
        finally:
            gateway.stop()
            try:
                await mcp
            except Exception as exc:  # MCP's sessions must not keep the rest from stopping
                log.error("the MCP session manager failed: %s", type(exc).__name__)
            expiry.cancel()
            leases.cancel()
            await calls.drain(timeout=30)
            await machine.sandbox.close()
            with contextlib.suppress(DatabaseUnavailable):  # else the lease runs out
                await calls.retry_unfinished()
                await store.io(store.leave)
            store.close()
            lock.close()

    routes: list[BaseRoute] = [Route(op.path, _endpoint(op), methods=[op.method]) for op in OPS]
    routes += web_routes()
    routes.append(Route("/mcp", gateway, methods=["GET", "POST", "DELETE"]))
    routes.append(Route("/metrics", metrics, methods=["GET"]))
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        # AnswerFirst outermost: what runs after an answer waits for all of it.
        middleware=[Middleware(AnswerFirst), Middleware(RequestIds), Middleware(SecurityHeaders)],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error},
    )
