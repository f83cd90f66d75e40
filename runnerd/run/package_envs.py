"""Package environments: one per (ecosystem, runtime, sorted exact pins), built once.

PyPI packages are installed with uv (``uv pip install --target``), npm packages with npm
(``--ignore-scripts`` unless ``npm_install_scripts``). Builds run in a jail of their
own that has the network but sees nothing of the data dir except its output folder and
the download cache, as the builders' uid (the uid range's last), held under its
host-wide lock for the whole build: one build at a time per host. An env is built in a
temporary folder and renamed into place, so a half-built env is never used; builds of
one key coalesce under a lock (in-process and across processes). Tools that list the
same packages share one env; tools with none use no env at all.

A call never builds: it waits, before its run starts (no row, nothing billed), for a
build under way or one it starts in the background, within its tool's timeout, and is
answered 503 ``ENV_NOT_READY`` (``Retry-After``) if the env is not ready by then
(``wait_ready``). Builds happen at deploy (the deploying node, before the version is
stored), on every other node when the deploy, an install or a switch is announced on
PostgreSQL's ``runnerd_envs`` channel (``announce``, ``EnvWarmer``), and at node start
for every installed version (``EnvWarmer``), each in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from runnerd.errors import (
    DatabaseUnavailable,
    EnvBuildFailed,
    EnvNotReady,
    SandboxUnavailable,
)
from runnerd.ids import utc_now
from runnerd.limits import (
    BUILD_KILL_SLACK_S,
    BUILD_MEMORY_MB,
    BUILD_OPEN_FILES,
    BUILD_PIDS,
    BUILD_TIMEOUT_S,
    BUILD_TMP_BYTES,
    BUILDER_UID_WAIT_S,
    ENV_BUILDING_RETRY_S,
    ENV_FAILED_RETRY_S,
    LEFTOVER_WAIT_S,
)
from runnerd.metrics import METRICS
from runnerd.model import Language
from runnerd.run.jail import JailKind
from runnerd.run.runtimes import SYSTEM_CA, npm_cli, world_readable
from runnerd.run.spawn import DIE_WITH_PARENT
from runnerd.run.uids import kill_leftovers

if TYPE_CHECKING:
    from runnerd.config import Settings
    from runnerd.run.jail import Sandbox
    from runnerd.store import Store

__all__ = ["ENV_CHANNEL", "EnvInfo", "EnvManager", "EnvWarmer", "announce"]

log = logging.getLogger("runnerd")

_META = "env.json"

# The PostgreSQL channel a node announces a version on (its id) when its tools' envs are
# needed: at deploy, install, switch and rollback. Every node LISTENs and builds.
ENV_CHANNEL = "runnerd_envs"

# Network and TLS files an installer needs, where they exist.
_NET_FILES = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/ssl",
    "/usr/share/ca-certificates",
    "/etc/ca-certificates",
    "/etc/pki",
)
# Installer settings passed from the daemon's environment into build jails, and nothing else.
PASSTHROUGH = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_INDEX",
    "npm_config_registry",
    "NPM_CONFIG_REGISTRY",
)


class EnvInfo(msgspec.Struct, frozen=True):
    key: str
    ecosystem: str  # pypi | npm
    runtime: str  # python3.11 | node20
    packages: tuple[str, ...]
    built_at: str
    path: str = ""
    size_bytes: int = 0


def _ecosystem(language: Language) -> str:
    return "pypi" if language == "python" else "npm"


class EnvManager:
    def __init__(
        self,
        root: Path,
        *,
        sandbox: Sandbox,
        settings: Settings,
        passthrough: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.sandbox = sandbox
        self.settings = settings
        self.passthrough = (
            passthrough
            if passthrough is not None
            else {k: v for k, v in os.environ.items() if k in PASSTHROUGH}
        )
        self._locks: dict[str, asyncio.Lock] = {}
        # Background builds: the one under way (or done) per key, the failures' times,
        # and one build at a time per node (the builders' uid is host-wide anyway).
        self._builds: dict[str, Future[Path | None]] = {}
        self._failed_at: dict[str, float] = {}
        self._builds_lock = threading.Lock()
        self._one_build = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)

    # --- keys and paths ---------------------------------------------------------------------

    def runtime_tag(self, language: Language) -> str:
        rt = self.sandbox.runtimes
        if language == "python":
            if rt.python is None:
                raise EnvBuildFailed("no Python runtime is configured for tools")
            return rt.python.tag
        if rt.node is None:
            raise EnvBuildFailed("no Node.js runtime is configured for tools")
        return rt.node.tag

    def key(self, language: Language, packages: Iterable[str]) -> str:
        """The env key: ecosystem, runtime and the sorted pins, hashed."""
        eco, tag, pins = _ecosystem(language), self.runtime_tag(language), sorted(packages)
        digest = hashlib.sha256(json.dumps([eco, tag, pins]).encode()).hexdigest()[:20]
        return f"{eco}-{tag}-{digest}"

    def _mount_dir(self, key: str) -> Path:
        sub = "site" if key.startswith("pypi-") else "node_modules"
        return self.root / key / sub

    def ready(self, language: Language, packages: tuple[str, ...]) -> Path | None:
        """The folder a jail mounts for these packages, if built (None without packages)."""
        if not packages:
            return None
        key = self.key(language, packages)
        return self._mount_dir(key) if (self.root / key / _META).is_file() else None

    # --- building ---------------------------------------------------------------------------

    async def ensure(self, language: Language, packages: tuple[str, ...]) -> Path | None:
        """The env for these packages, built first if needed; concurrent calls coalesce."""
        if not packages:
            return None
        found = self.ready(language, packages)
        if found is not None:
            return found
        key = self.key(language, packages)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(self.ensure_sync, language, packages)

    def prepare(self, language: Language, packages: tuple[str, ...]) -> Future[Path | None] | None:
        """Build these packages' env in the background unless it is ready (None) or a
        build is under way; the build's future. A build that failed less than
        ENV_FAILED_RETRY_S ago is not tried again: its (failed) future."""
        if not packages or self.ready(language, packages) is not None:
            return None
        key = self.key(language, packages)
        with self._builds_lock:
            found = self._builds.get(key)
            if found is not None and (
                not found.done()
                or (
                    found.exception() is not None
                    and time.monotonic() - self._failed_at.get(key, 0.0) < ENV_FAILED_RETRY_S
                )
            ):
                return found
            future: Future[Path | None] = Future()
            self._builds[key] = future
        pins = tuple(packages)
        threading.Thread(
            target=self._background, args=(key, language, pins, future),
            name=f"runnerd-env-{key}", daemon=True,
        ).start()  # fmt: skip
        return future

    def _background(
        self, key: str, language: Language, packages: tuple[str, ...], future: Future[Path | None]
    ) -> None:
        started = time.monotonic()
        try:
            with self._one_build:
                path = self.ensure_sync(language, packages)
        except Exception as exc:  # EnvBuildFailed, or the host refused (a full disk)
            self._failed_at[key] = time.monotonic()
            log.warning(
                "building the package env %s failed: %s", key, _no_userinfo(str(exc))[-500:]
            )
            future.set_exception(
                exc if isinstance(exc, EnvBuildFailed) else EnvBuildFailed(str(exc))
            )
            return
        log.info("built the package env %s in the background (%.1f s)", key,
                 time.monotonic() - started)  # fmt: skip
        future.set_result(path)

    async def wait_ready(
        self, language: Language, packages: tuple[str, ...], within_s: float
    ) -> None:
        """Return once these packages' env is ready: at once if it is, else after the
        background build (prepare) ends, within ``within_s``. EnvNotReady (503,
        Retry-After) if it does not end in time or it failed. Called before a run
        starts: nothing waited here is metered."""
        future = self.prepare(language, packages)
        if future is None:
            return
        key = self.key(language, packages)
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), within_s)
        except TimeoutError:
            raise EnvNotReady(
                f"the package environment of this tool ({key}) is still being built on "
                "this node; try again shortly",
                retry_after_s=ENV_BUILDING_RETRY_S,
            ) from None
        except EnvBuildFailed as exc:
            left = ENV_FAILED_RETRY_S - (time.monotonic() - self._failed_at.get(key, 0.0))
            raise EnvNotReady(
                f"the package environment of this tool ({key}) could not be built on this "
                f"node; it is tried again within {ENV_FAILED_RETRY_S:.0f} s: "
                f"{_no_userinfo(str(exc))[-1000:]}",
                retry_after_s=max(1, math.ceil(left)),
            ) from None

    def ensure_sync(self, language: Language, packages: tuple[str, ...]) -> Path | None:
        """Blocking ``ensure``: for uploads and the CLI. Raises EnvBuildFailed."""
        if not packages:
            return None
        key = self.key(language, packages)
        final = self.root / key
        with open(self.root / f".{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (final / _META).is_file():
                self._build(key, language, tuple(sorted(packages)))
        return self._mount_dir(key)

    def _build(self, key: str, language: Language, packages: tuple[str, ...]) -> None:
        # The builders' uid: the range's last, never a run's, held under its host-wide
        # lock for the whole build (one build at a time per host), and given back only
        # once nothing of it runs.
        try:
            uid, uid_lock = self.sandbox.uids.lease_builder(BUILDER_UID_WAIT_S)
        except SandboxUnavailable as exc:
            raise EnvBuildFailed(str(exc)) from None
        try:
            self._build_as(uid, key, language, packages)
        finally:
            uid_lock.clean = not kill_leftovers(uid, LEFTOVER_WAIT_S)
            uid_lock.close()

    def _build_as(self, uid: int, key: str, language: Language, packages: tuple[str, ...]) -> None:
        cache = self.root / ".cache"
        cache.mkdir(exist_ok=True)
        if cache.stat().st_uid != uid:  # built before as another uid: the cache is its
            _chown_tree(cache, uid)
        os.chmod(cache, 0o700)
        staging = Path(tempfile.mkdtemp(dir=self.root, prefix=f".build-{key}-"))
        try:
            os.chown(staging, uid, uid)
            argv = self._command(language, packages, uid, staging, cache)
            proc = subprocess.run(
                # Dies with the thread that waits for it (and so with the daemon).
                [*DIE_WITH_PARENT, *argv],
                capture_output=True,
                text=True,
                env={},
                timeout=BUILD_TIMEOUT_S + BUILD_KILL_SLACK_S,
            )
            if proc.returncode != 0:
                METRICS.env_builds.labels(_ecosystem(language), "failed").inc()
                message = (proc.stderr or proc.stdout).strip()
                raise EnvBuildFailed(message[-4000:] or f"installer exit code {proc.returncode}")
            METRICS.env_builds.labels(_ecosystem(language), "built").inc()
            info = EnvInfo(
                key=key,
                ecosystem=_ecosystem(language),
                runtime=self.runtime_tag(language),
                packages=packages,
                built_at=utc_now(),
            )
            (staging / _META).write_bytes(msgspec.json.encode(info))
            _seal(staging)
            staging.rename(self.root / key)
        except subprocess.TimeoutExpired:
            raise EnvBuildFailed(f"the install took longer than {BUILD_TIMEOUT_S} s") from None
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def _command(
        self, language: Language, packages: tuple[str, ...], uid: int, staging: Path, cache: Path
    ) -> list[str]:
        rt = self.sandbox.runtimes
        mounts: list[str] = []
        # Installers trust the system's CA store (uv and npm both bundle their own roots).
        ca = {"SSL_CERT_FILE": SYSTEM_CA, "NODE_EXTRA_CA_CERTS": SYSTEM_CA}
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            **(ca if os.path.isfile(SYSTEM_CA) else {}),
            **self.passthrough,
        }
        if language == "python":
            assert rt.python is not None
            mounts += rt.python.build_mounts
            uv = self._uv_binary()
            mounts.append(f"{uv}:/opt/runnerd/uv")
            inner = [
                "/opt/runnerd/uv",
                "pip",
                "install",
                "--target",
                "/out/site",
                "--python",
                rt.python.executable,
                "--cache-dir",
                "/cache/uv",
                "--no-config",
                "--quiet",
            ]
            if not self.settings.pypi_source_builds:
                inner += ["--only-binary", ":all:"]
            inner += list(packages)
        else:
            assert rt.node is not None
            mounts += rt.node.build_mounts
            npm_cli = self._npm_cli()
            npm_root = npm_cli.parent.parent
            if not any(str(npm_root).startswith(m.rstrip("/") + "/") for m in mounts):
                mounts.append(str(npm_root))
            inner = [
                rt.node.path,
                str(npm_cli),
                "install",
                "--prefix",
                "/out",
                "--no-audit",
                "--no-fund",
                "--no-package-lock",
                "--cache",
                "/cache/npm",
                "--loglevel=error",
                "--userconfig",
                "/dev/null",
            ]
            if not self.settings.npm_install_scripts:
                inner.append("--ignore-scripts")
            inner += list(packages)
        argv = [
            self.sandbox.nsjail, "--mode", "o", "--quiet",
            "--disable_clone_newnet",  # builds need the registry
            "--user", f"1000:{uid}:1", "--group", f"1000:{uid}:1",
            "--time_limit", str(BUILD_TIMEOUT_S),
            "--rlimit_as", "inf", "--rlimit_core", "0", "--rlimit_fsize", "inf",
            "--rlimit_nofile", str(BUILD_OPEN_FILES), "--rlimit_nproc", "soft",
            "--cwd", "/out",
            # /tmp first: a mount listed before it under /tmp (a Node copied into a cache
            # dir there) would be hidden by it.
            "--mount", f"none:/tmp:tmpfs:size={BUILD_TMP_BYTES},mode=1777",
        ]  # fmt: skip
        if self.sandbox.cgroups.enabled:
            argv += [*self.sandbox.cgroups.nsjail_args,
                     "--cgroup_mem_max", str(BUILD_MEMORY_MB * 1024 * 1024),
                     "--cgroup_pids_max", str(BUILD_PIDS)]  # fmt: skip
        for mount in mounts:
            argv += ["--bindmount_ro", mount]
        for path in _NET_FILES:
            if os.path.exists(path) and not any(path == m for m in mounts):
                argv += ["--bindmount_ro", path]
        argv += ["--bindmount", f"{staging}:/out", "--bindmount", f"{cache}:/cache",
                 "--bindmount", "/dev/null", "--bindmount_ro", "/dev/urandom"]  # fmt: skip
        for name, value in env.items():
            argv += ["--env", f"{name}={value}"]
        return [*argv, "--", *inner]

    def _uv_binary(self) -> Path:
        """uv, where the builders' uid can read it (copied into the env root if need be)."""
        from uv import find_uv_bin

        found = Path(find_uv_bin()).resolve()
        if world_readable(found):
            return found
        copy = self.root / ".bin" / "uv"
        if not copy.is_file() or copy.stat().st_size != found.stat().st_size:
            copy.parent.mkdir(exist_ok=True)
            os.chmod(copy.parent, 0o755)
            shutil.copy2(found, copy)
            os.chmod(copy, 0o755)
        return copy

    def _npm_cli(self) -> Path:
        assert self.sandbox.runtimes.node is not None
        cli = npm_cli(self.sandbox.runtimes.node)
        if cli is None:
            raise EnvBuildFailed(
                "npm was not found beside Node.js; it is needed to install npm packages"
            )
        return cli

    # --- listing and pruning ----------------------------------------------------------------

    def list(self) -> list[EnvInfo]:
        found = []
        for meta in sorted(self.root.glob(f"*/{_META}")):
            info = msgspec.json.decode(meta.read_bytes(), type=EnvInfo)
            size = sum(f.stat().st_size for f in meta.parent.rglob("*") if f.is_file())
            found.append(msgspec.structs.replace(info, path=str(meta.parent), size_bytes=size))
        return found

    def remove(self, key: str) -> None:
        target = self.root / key
        if not (target / _META).is_file():
            raise KeyError(key)
        trash = self.root / f".trash-{key}-{math.floor(time.time())}"
        target.rename(trash)  # atomic: a run never sees a half-removed env
        shutil.rmtree(trash, ignore_errors=True)


# --- every node's envs, built outside any call -------------------------------------------------


def announce(store: Store, version_id: str) -> None:
    """Tell every node (on PostgreSQL) that ``version_id``'s envs are needed, so each
    builds the ones it lacks in the background. SQLite has one node: nothing to do.
    Best effort: what it announces is stored already, so the database away now is
    logged, not raised (a node builds at its next start, announcement or call)."""
    if store.db.dialect == "postgresql":
        try:
            store.db.execute("SELECT pg_notify(?, ?)", [ENV_CHANNEL, version_id])
        except DatabaseUnavailable as exc:
            log.warning("could not announce version %s to the other nodes: %s", version_id, exc)


def _installed_packages(store: Store) -> list[tuple[Language, tuple[str, ...]]]:
    """The (language, packages) of every tool of every installed version that lists any."""
    rows = store.db.query(
        "SELECT DISTINCT t.language, t.packages FROM tools t "
        "JOIN installs i ON i.version_id = t.version_id WHERE t.packages != '[]'"
    )
    return [(r["language"], tuple(json.loads(r["packages"]))) for r in rows]


def _version_packages(store: Store, version_id: str) -> list[tuple[Language, tuple[str, ...]]]:
    return [(t.language, tuple(t.packages)) for t in store.get_tools(version_id) if t.packages]


class EnvWarmer:
    """Builds, in the background, the envs this node lacks: at start those of every
    installed version, and on PostgreSQL those of each version announced on
    ENV_CHANNEL (and, after its listening connection was lost, every installed one
    again: what was announced meanwhile did not reach it). Its own connection LISTENs;
    the lookups go through the store's threads."""

    def __init__(self, envs: EnvManager, store: Store) -> None:
        self.envs = envs
        self.store = store
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        listen = getattr(self.store.db, "listen", None)
        if self.store.db.dialect == "postgresql" and listen is not None:
            self._thread = threading.Thread(
                target=self._listen, args=(listen,), name="runnerd-envs-listen", daemon=True
            )
            self._thread.start()  # its first (re)connection sweeps
        else:
            await self.sweep()

    async def sweep(self) -> None:
        """Build what every installed version needs and this node lacks."""
        self._build(await self.store.io(_installed_packages, self.store))

    async def version(self, version_id: str) -> None:
        self._build(await self.store.io(_version_packages, self.store, version_id))

    def _build(self, wanted: list[tuple[Language, tuple[str, ...]]]) -> None:
        """Build each env this node lacks; once built, keep warm jails of its kind
        waiting, so the first call is as quick as the next."""
        for language, packages in wanted:
            try:
                future = self.envs.prepare(language, packages)
            except EnvBuildFailed as exc:  # no runtime for that language on this node
                log.warning("a package env cannot be built on this node: %s", exc)
                continue
            if future is not None:
                future.add_done_callback(functools.partial(self._built, language))

    def _built(self, language: Language, future: Future[Path | None]) -> None:
        if future.exception() is None and (path := future.result()) is not None:
            assert self._loop is not None
            with contextlib.suppress(RuntimeError):  # the loop is closed: stopping
                self._loop.call_soon_threadsafe(self._warm, language, path)

    def _warm(self, language: Language, env_dir: Path) -> None:
        self.envs.sandbox.warm_pool.refill(JailKind(language, env_dir))

    def _listen(self, listen: Any) -> None:
        for payload in listen(ENV_CHANNEL, self._stop):
            work = self.sweep() if payload is None else self.version(payload)
            assert self._loop is not None
            try:
                done = asyncio.run_coroutine_threadsafe(work, self._loop)
            except RuntimeError:  # the loop is closed: the daemon is stopping
                work.close()
                return
            done.add_done_callback(_log_failure)

    def stop(self) -> None:
        self._stop.set()


def _no_userinfo(text: str) -> str:
    """``text`` without the user and password of any URL in it (a private index's)."""
    return re.sub(r"://[^/@\s]+@", "://***@", text)


def _log_failure(done: Any) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("looking up package envs to build failed: %s", done.exception())


def _chown_tree(folder: Path, uid: int) -> None:
    """``folder`` and everything in it owned by ``uid`` (links themselves, not targets)."""
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, uid)
    os.chown(folder, uid, uid)


def _seal(folder: Path) -> None:
    """Root-owned and read-only for everyone else: jails read envs, never write them."""
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                os.lchown(path, 0, 0)
                continue
            os.chown(path, 0, 0)
            mode = os.stat(path).st_mode
            os.chmod(path, 0o755 if (mode & 0o111 or os.path.isdir(path)) else 0o644)
    os.chown(folder, 0, 0)
    os.chmod(folder, 0o755)
