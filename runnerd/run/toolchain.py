"""The JavaScript toolchain used at upload: Node, plus esbuild and two module lexers.

esbuild compiles TypeScript and reports syntax errors with file, line and column;
es-module-lexer and cjs-module-lexer (the lexer Node itself uses) read a module's
exports and imports without running it. They are installed once, with exact pins,
into a folder of their own (by default ``<data dir>/toolchain``).
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runnerd.errors import ToolchainError
from runnerd.limits import (
    JS_CHECK_TIMEOUT_S,
    MIN_NODE_MAJOR,
    TOOLCHAIN_INSTALL_TIMEOUT_S,
    TOOLCHAIN_PACKAGES,
)
from runnerd.run.runtimes import CLEAN_PATH, SYSTEM_CA, NodeRuntime, clean_env, npm_cli

__all__ = ["Toolchain"]

_CHECK_SCRIPT = Path(__file__).resolve().parent / "js" / "check.mjs"
_STAMP = "runnerd-toolchain.json"


class Toolchain:
    """esbuild and the lexers in ``directory``, run by ``node``."""

    def __init__(
        self,
        directory: Path,
        node: NodeRuntime | None,
        on_install: Callable[[Path], None] | None = None,
    ) -> None:
        self.directory = directory
        self.node = node
        # Told before an install that a check starts on its own (it fetches from npm).
        self.on_install = on_install

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
        cli = Path(npm) if npm else npm_cli(self.node)
        if cli is None or not cli.exists():
            raise ToolchainError("npm was not found; it is needed once to install the toolchain")
        # npm's script, run by the Node runnerd uses (a Node of its own may not be on PATH).
        npm_argv = [str(cli)] if npm else [self.node.path, str(cli)]
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
                        *npm_argv,
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
                    timeout=TOOLCHAIN_INSTALL_TIMEOUT_S,
                    env=clean_env(
                        {
                            "PATH": f"{Path(self.node.path).parent}:{CLEAN_PATH}",
                            # The system's CA store, as package builds use: a Node of
                            # runnerd's own carries no npm config pointing at it.
                            **(
                                {"NODE_EXTRA_CA_CERTS": SYSTEM_CA}
                                if Path(SYSTEM_CA).is_file()
                                else {}
                            ),
                        }
                    ),
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
            if self.on_install is not None:
                self.on_install(self.directory)
            self.install()
        proc = subprocess.run(
            [self.node.path, str(_CHECK_SCRIPT), str(self.directory)],
            input=json.dumps(files),
            capture_output=True,
            text=True,
            timeout=JS_CHECK_TIMEOUT_S,
            env=clean_env(),
        )
        if proc.returncode != 0:
            raise ToolchainError(f"the JavaScript checker failed:\n{proc.stderr[-2000:]}")
        results: list[dict[str, Any]] = json.loads(proc.stdout)
        return results
