"""Package environments: one per (ecosystem, runtime, sorted exact pins), built once.

PyPI packages are installed with uv (``uv pip install --target``), npm packages with npm
(``--ignore-scripts`` unless ``npm_install_scripts``). Builds run in a jail of their
own that has the network but sees nothing of the data dir except its output folder and
the download cache. An env is built in a temporary folder and renamed into place, so a
half-built env is never used; builds of one key coalesce under a lock (in-process and
across processes). Tools that list the same packages share one env; tools with none
use no env at all.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from runnerd.errors import EnvBuildFailed
from runnerd.ids import utc_now
from runnerd.limits import (
    BUILD_KILL_SLACK_S,
    BUILD_MEMORY_MB,
    BUILD_OPEN_FILES,
    BUILD_PIDS,
    BUILD_TIMEOUT_S,
    BUILD_TMP_BYTES,
)
from runnerd.metrics import METRICS
from runnerd.model import Language
from runnerd.run.runtimes import SYSTEM_CA, npm_cli, world_readable

if TYPE_CHECKING:
    from runnerd.config import Settings
    from runnerd.run.jail import Sandbox

__all__ = ["EnvInfo", "EnvManager"]

_META = "env.json"

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
        uid = self.settings.sandbox_uid_base - 1  # the builders' uid, never a run's
        cache = self.root / ".cache"
        cache.mkdir(exist_ok=True)
        os.chown(cache, uid, uid)
        os.chmod(cache, 0o700)
        staging = Path(tempfile.mkdtemp(dir=self.root, prefix=f".build-{key}-"))
        try:
            os.chown(staging, uid, uid)
            argv = self._command(language, packages, uid, staging, cache)
            proc = subprocess.run(
                argv,
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
