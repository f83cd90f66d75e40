"""The daemon's lifespan: what it holds while it serves, from start to drain.

At start: the run machine, the data dir's lock, the store (and its checks of the audit
key and the secrets key), this node's place in the database, the governor, the app's
state, the background upkeep (approval expiry, the node's lease, the package envs its
installs need: run/package_envs.py EnvWarmer) and warm jails. At stop, in this order:
MCP's sessions, the upkeep, the governor's drain of calls still going, the jails, the
ends of runs the database missed, the node's lease, the store, the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import gc
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

from starlette.applications import Starlette

from runnerd import __version__
from runnerd.api import frames
from runnerd.api.ratelimit import RateLimiter
from runnerd.api.sessions import CookieSigner
from runnerd.api.state import AppState
from runnerd.config import Settings
from runnerd.daemon.metrics_route import watch
from runnerd.errors import DatabaseUnavailable, StoreUnavailable
from runnerd.govern.governor import Governor
from runnerd.limits import (
    APPROVAL_EXPIRY_EVERY_S,
    APPROVED_RUNS_DRAIN_S,
    DEV_PAGES_TTL_S,
    WARM_START_WAIT_S,
)
from runnerd.mcp.endpoint import McpEndpoint
from runnerd.model import Language
from runnerd.run.jail import JailKind
from runnerd.run.machine import Machine, build_machine
from runnerd.run.package_envs import EnvWarmer
from runnerd.run.runtimes import Runtimes
from runnerd.store import Store
from runnerd.vault import Vault

__all__ = ["lifespan"]

log = logging.getLogger("runnerd")


@contextlib.asynccontextmanager
async def lifespan(
    app: Starlette,
    *,
    settings: Settings,
    mcp: McpEndpoint,
    freeze_heap: bool = True,
    runtimes: Runtimes | None = None,
) -> AsyncIterator[None]:
    """Open everything the daemon serves with, put it in ``app.state.runnerd``, and
    close it all on the way out, draining calls still going (30 s at most). Exits
    (SystemExit) when another daemon holds the data dir, the store cannot be used, or
    the stored secrets are sealed under another key than this node's. ``freeze_heap``:
    what start loaded leaves the collector's sight (the daemon owns its process).
    ``runtimes``: the machine's, found already (else build_machine finds them)."""
    machine = build_machine(settings, warm=settings.warm_jails, runtimes=runtimes)
    for line in machine.report():
        log.info("%s", line)
    for warning in machine.warnings():
        log.warning("%s", warning)
    lock = _hold_data_dir(settings.data_dir)
    store, vault = _open_store(settings)
    _join(store, settings)
    governor = Governor.from_settings(settings, store=store, pipeline=machine.pipeline, vault=vault)
    if machine.sandbox.proxy is not None:  # a revoked grant stops runs already going
        machine.sandbox.proxy.follow_grants(functools.partial(_current_egress, store))
    app.state.runnerd = AppState(
        settings=settings,
        store=store,
        machine=machine,
        limiter=RateLimiter.from_settings(settings, store),  # this node's share of the limits
        governor=governor,
        signer=CookieSigner.from_file(settings.data_dir / "session.key"),
        call_signer=CookieSigner(vault.derive("mcp request state")),
        frame_key=vault.derive(frames.FRAME_KEY_LABEL),
    )
    frames.use_key(app.state.runnerd.frame_key)  # verify_frame_token accepts its tokens
    mcp.state = app.state.runnerd
    governor.on_tools_changed(mcp.tools_changed)  # installs and switches reach MCP sessions
    watch(app.state.runnerd)
    expiry = asyncio.ensure_future(_expire_approvals(governor))
    leases = asyncio.ensure_future(_keep_lease(store, governor, settings.node_lease_s))
    shares = asyncio.ensure_future(app.state.runnerd.limiter.follow(store))
    envs = EnvWarmer(machine.envs, store)  # installed versions' envs, built in the background
    await envs.start()
    await _warm_up(machine)
    log.info("runnerd %s serving data dir %s", __version__, settings.data_dir)
    # Everything loaded so far lives as long as the daemon: out of the collector's
    # sight, a full collection stays short (tens of ms less) whatever runs later.
    if freeze_heap:
        gc.collect()
        gc.freeze()
    sessions = asyncio.ensure_future(mcp.serve())
    try:
        yield
    finally:
        frames.drop_key(app.state.runnerd.frame_key)
        mcp.stop()
        try:
            await sessions
        except Exception as exc:  # MCP's sessions must not keep the rest from stopping
            log.error("the MCP session manager failed: %s", type(exc).__name__)
        envs.stop()
        expiry.cancel()
        leases.cancel()
        shares.cancel()
        await governor.drain(timeout=APPROVED_RUNS_DRAIN_S)
        await governor.peers.close()
        await machine.sandbox.close()
        with contextlib.suppress(DatabaseUnavailable):  # else the lease runs out
            await governor.retry_unfinished()
            await store.io(store.leave)
        store.close()
        lock.close()


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


def check_store(settings: Settings) -> None:
    """What would keep the daemon from serving with the store (its schema, the audit and
    secrets keys: SystemExit, one line saying what to fix), found before any listener
    opens: ``runnerd serve`` calls it first, so an operator reads the reason, not a
    traceback of the server's start; and another daemon serving the data dir."""
    store, _ = _open_store(settings, quiet=True)
    store.close()
    _hold_data_dir(settings.data_dir).close()  # the lifespan takes it again, to keep


def _open_store(settings: Settings, *, quiet: bool = False) -> tuple[Store, Vault]:
    """The store the settings name and the vault for its secrets; says in the log what
    an operator should fix (no workspace yet, an audit trail another key wrote)."""
    try:
        store = Store.open(settings)
    except StoreUnavailable as error:
        raise SystemExit(f"runnerd: {error}") from None
    if not quiet and not store.has_workspace():
        log.warning(
            "no workspace yet in %s: create the first one and its admin with "
            "`runnerd admin bootstrap --data-dir %s --workspace NAME --email YOU`",
            settings.data_dir,
            settings.data_dir,
        )
    sealed_with = store.secret_key_ids()
    key_file = settings.secrets_key_path
    if sealed_with and not settings.secrets_key and not key_file.exists():
        # A restored data dir without its key: a new key made now would open nothing.
        store.close()
        raise SystemExit(
            f"runnerd: the secrets in {store.db.where} are sealed with key "
            f"{', '.join(sorted(sealed_with))}, and there is no secrets key at {key_file}: "
            f"put back the {key_file.name} kept with the backup (docs/INSTALL.md, Backup "
            "and restore), or set secrets_key or secrets_key_file to it"
        )
    vault = Vault.from_settings(settings.secrets_key, key_file)
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
    if not store.audit_key_matches():  # its first entry would break the chain for good
        store.close()
        key = "the audit_key setting" if settings.audit_key else settings.audit_key_path
        raise SystemExit(
            "runnerd: the audit trail's newest entry does not verify under this node's "
            f"audit key ({key}): another key wrote it (give every node "
            "the same audit_key or audit_key_file), or the trail was changed; run "
            "`runnerd audit verify`. Not serving: its entries would break the chain"
        )
    return store, vault


def _join(store: Store, settings: Settings) -> None:
    """Join the database as a node, closing (as interrupted) the runs no node will end."""
    # One node per SQLite file (the data dir's lock): whatever it left running is over.
    # On PostgreSQL, other nodes may be running theirs: only lost nodes' runs close.
    interrupted = store.recover_interrupted() if store.db.dialect == "sqlite" else []
    store.join(
        socket.gethostname(), os.getpid(), __version__, settings.node_lease_s,
        settings.node_base,
    )  # fmt: skip
    interrupted += store.recover_lost_nodes()
    if interrupted:
        log.warning(
            "closed %d run(s) left open by the last stop as failed (interrupted)",
            len(interrupted),
        )


async def _warm_up(machine: Machine) -> None:
    """A warm jail for each language a runtime was found for: ready means warm, so the
    first calls are fast."""
    runtimes: dict[Language, object] = {
        "python": machine.runtimes.python,
        "javascript": machine.runtimes.node,
        "typescript": machine.runtimes.node,
    }
    languages = [lang for lang, runtime in runtimes.items() if runtime is not None]
    await machine.sandbox.warm_pool.warm_up([JailKind(lang, None) for lang in languages])
    await machine.sandbox.warm_pool.wait_warm(WARM_START_WAIT_S)


async def _keep_lease(store: Store, governor: Governor, lease_s: float) -> None:
    """Renew this node's lease, close the runs of nodes whose lease ran out (once this
    node has been in touch with the database for a whole lease), and write the ends of
    runs that finished while the database was away."""
    while True:
        await asyncio.sleep(lease_s / 3)
        try:
            await governor.retry_unfinished()
            if not await store.io(store.renew_lease, lease_s):
                log.error(
                    "this node's lease on the database ran out and another node closed its "
                    "runs as interrupted; the runs still going here correct them as they end"
                )
                await store.io(store.rejoin, lease_s)
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


async def _expire_approvals(governor: Governor) -> None:
    """Expire (and audit) approvals past their time, every few seconds; and drop dev
    pages past theirs (never served once past it; this frees their rows)."""
    store = governor.store
    while True:
        await asyncio.sleep(APPROVAL_EXPIRY_EVERY_S)
        try:
            await governor.approvals.expire()
        except Exception as exc:
            log.error("approval expiry failed: %s", type(exc).__name__)
        try:
            await store.io(store.drop_stale_dev_pages, DEV_PAGES_TTL_S)
        except Exception as exc:
            log.error("dropping stale dev pages failed: %s", type(exc).__name__)
