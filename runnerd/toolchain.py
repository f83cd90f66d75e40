"""The JavaScript toolchain used at upload: Node, plus esbuild and two module lexers.

esbuild compiles TypeScript and reports syntax errors with file, line and column;
es-module-lexer and cjs-module-lexer (the lexer Node itself uses) read a module's
exports and imports without running it. They are installed once, with exact pins,
into a folder of their own (by default ``<data dir>/toolchain``).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runnerd.constants import MIN_NODE_MAJOR, TOOLCHAIN_PACKAGES
from runnerd.errors import RunnerdError

__all__ = ["NodeRuntime", "Toolchain", "ToolchainError", "find_node"]

_CHECK_SCRIPT = Path(__file__).resolve().parent / "js" / "check.mjs"
_STAMP = "runnerd-toolchain.json"
# Nothing of the daemon's environment reaches Node: NODE_OPTIONS or NODE_EXTRA_CA_CERTS
# there would change behaviour and cost ~30 ms a start.
_CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"


class ToolchainError(RunnerdError):
    """Node or the toolchain is missing or broken; the message says how to fix it."""


@dataclass(frozen=True)
class NodeRuntime:
    path: str
    version: str  # such as "20.20.2"

    @property
    def major(self) -> int:
        return int(self.version.split(".", 1)[0])


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {"PATH": _CLEAN_PATH, "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
    env.update(extra or {})
    return env


def find_node(configured: str | None = None) -> NodeRuntime | None:
    """The Node runtime to use: ``configured`` (a path or a name on PATH), else ``node``.

    Returns None when there is none, or it is older than Node 20.
    """
    found = shutil.which(configured or "node")
    if found is None:
        return None
    try:
        out = subprocess.run(
            [found, "--version"], capture_output=True, text=True, timeout=10, env=_clean_env()
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.fullmatch(r"v(\d+\.\d+\.\d+)", out)
    if match is None:
        return None
    runtime = NodeRuntime(path=found, version=match.group(1))
    return runtime if runtime.major >= MIN_NODE_MAJOR else None


class Toolchain:
    """esbuild and the lexers in ``directory``, run by ``node``."""

    def __init__(self, directory: Path, node: NodeRuntime | None) -> None:
        self.directory = directory
        self.node = node

    def is_installed(self) -> bool:
        stamp = self.directory / _STAMP
        try:
            return bool(json.loads(stamp.read_text()) == TOOLCHAIN_PACKAGES)
        except (OSError, ValueError):
            return False

    def install(self, *, npm: str | None = None) -> None:
        """Install the pinned packages with npm (no install scripts), once.

        Concurrent installs of the same folder wait for each other; the folder is built
        aside and renamed into place, so a half-installed toolchain is never used.
        """
        if self.node is None:
            raise ToolchainError(
                f"JavaScript and TypeScript tools need Node.js >= {MIN_NODE_MAJOR}; none was "
                "found (install it, or set `node` in the config / RUNNERD_NODE)"
            )
        npm_path = shutil.which(npm or "npm") or str(Path(self.node.path).with_name("npm"))
        if not Path(npm_path).exists():
            raise ToolchainError("npm was not found; it is needed once to install the toolchain")
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.directory.with_name(self.directory.name + ".lock")
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.is_installed():
                return
            staging = Path(tempfile.mkdtemp(prefix=".toolchain-", dir=self.directory.parent))
            try:
                (staging / "package.json").write_text(
                    json.dumps(
                        {
                            "name": "runnerd-toolchain",
                            "private": True,
                            "dependencies": TOOLCHAIN_PACKAGES,
                        },
                        indent=2,
                    )
                )
                proc = subprocess.run(
                    [
                        npm_path,
                        "install",
                        "--ignore-scripts",
                        "--no-audit",
                        "--no-fund",
                        "--no-package-lock",
                        "--loglevel=error",
                    ],
                    cwd=staging,
                    capture_output=True,
                    text=True,
                    timeout=600,
                    env=_clean_env({"PATH": f"{Path(self.node.path).parent}:{_CLEAN_PATH}"}),
                )
                if proc.returncode != 0:
                    raise ToolchainError(f"npm could not install the toolchain:\n{proc.stderr}")
                (staging / _STAMP).write_text(json.dumps(TOOLCHAIN_PACKAGES))
                if self.directory.exists():
                    shutil.rmtree(self.directory)
                staging.rename(self.directory)
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def check_sources(self, files: list[dict[str, str]]) -> list[dict[str, Any]]:
        """Compile/parse each ``{path, language, source}``; see js/check.mjs for the answer."""
        if self.node is None:
            raise ToolchainError(
                f"JavaScript and TypeScript tools need Node.js >= {MIN_NODE_MAJOR}; none was found"
            )
        if not self.is_installed():
            self.install()
        proc = subprocess.run(
            [self.node.path, str(_CHECK_SCRIPT), str(self.directory)],
            input=json.dumps(files),
            capture_output=True,
            text=True,
            timeout=120,
            env=_clean_env(),
        )
        if proc.returncode != 0:
            raise ToolchainError(f"the JavaScript checker failed:\n{proc.stderr[-2000:]}")
        results: list[dict[str, Any]] = json.loads(proc.stdout)
        return results
