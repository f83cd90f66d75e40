"""The interpreters that run tools: one Python, one Node, found once at startup.

A jail sees only what is bind-mounted into it, and nsjail mounts as the run's
unprivileged uid, so a runtime must live where any user can read it (a Python under
/root, as pyenv installs it, cannot be mounted). Each runtime knows the paths it needs
inside the jail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from runnerd.constants import MIN_NODE_MAJOR

__all__ = ["NodeRuntime", "PythonRuntime", "Runtimes", "clean_env", "find_node", "find_python"]

CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"
# System library folders every dynamically linked interpreter needs (those that exist).
_SYSTEM_LIBS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment for helper processes: nothing of the daemon's leaks through
    (NODE_OPTIONS, NODE_EXTRA_CA_CERTS, PYTHON* would change behaviour and speed)."""
    env = {"PATH": CLEAN_PATH, "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
    env.update(extra or {})
    return env


def world_readable(path: Path) -> bool:
    """True when an unprivileged user can reach ``path`` (o+x on every folder above it)."""
    path = path.resolve()
    for parent in reversed(path.parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    mode = os.stat(path).st_mode
    return bool(mode & (stat.S_IXOTH if path.is_dir() else stat.S_IROTH))


def _system_mounts() -> list[str]:
    return [p for p in _SYSTEM_LIBS if os.path.exists(p)]


def _outermost(paths: set[str]) -> tuple[str, ...]:
    """The paths, less those inside another one (a mount of /usr/lib covers /usr/lib/x)."""
    ordered = sorted(paths)
    return tuple(p for p in ordered if not any(p.startswith(q + "/") for q in ordered))


@dataclass(frozen=True)
class PythonRuntime:
    executable: str  # real path of the interpreter binary
    version: str  # such as "3.11.2"
    mounts: tuple[str, ...] = field(default=())  # read-only inside the jail, same paths

    @property
    def tag(self) -> str:
        """What package environments are keyed on: ``python3.11``."""
        major, minor, *_ = self.version.split(".")
        return f"python{major}.{minor}"


@dataclass(frozen=True)
class NodeRuntime:
    path: str  # real path of the node binary
    version: str  # such as "20.20.2"
    mounts: tuple[str, ...] = field(default=())

    @property
    def major(self) -> int:
        return int(self.version.split(".", 1)[0])

    @property
    def tag(self) -> str:
        return f"node{self.major}"


@dataclass(frozen=True)
class Runtimes:
    python: PythonRuntime | None
    node: NodeRuntime | None
    notes: tuple[str, ...] = ()  # fallbacks taken, for the startup report
    problems: tuple[str, ...] = ()  # runtimes missing: startup warns about these


_PY_PROBE = (
    "import json, sys, sysconfig; print(json.dumps({'version': '%d.%d.%d' % sys.version_info[:3],"
    " 'stdlib': sysconfig.get_paths()['stdlib'], 'platstdlib': sysconfig.get_paths()["
    "'platstdlib'], 'exe': sys.executable}))"
)


def _probe_python(candidate: str) -> PythonRuntime | None:
    found = shutil.which(candidate)
    if found is None:
        return None
    try:
        proc = subprocess.run(
            [found, "-I", "-S", "-c", _PY_PROBE],
            capture_output=True,
            text=True,
            timeout=20,
            env=clean_env(),
        )
        info = json.loads(proc.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    exe = os.path.realpath(found)
    mounts = {exe, info["stdlib"], info["platstdlib"], *_system_mounts()}
    return PythonRuntime(executable=exe, version=info["version"], mounts=_outermost(mounts))


def find_python(configured: str | None = None) -> tuple[PythonRuntime | None, list[str]]:
    """The Python for tools: ``configured``, else the daemon's own, else ``python3`` on PATH.

    A Python that unprivileged users cannot read is skipped, with a note saying so.
    """
    notes: list[str] = []
    own = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    candidates = [configured] if configured else [own, "/usr/bin/python3", "python3"]
    for candidate in candidates:
        runtime = _probe_python(candidate)
        if runtime is None:
            notes.append(f"python: {candidate} is not a working Python")
            continue
        if tuple(int(x) for x in runtime.version.split(".")[:2]) < (3, 9):
            notes.append(f"python: {candidate} is {runtime.version}; tools need 3.9 or newer")
            continue
        hidden = [m for m in runtime.mounts if not world_readable(Path(m))]
        if hidden:
            notes.append(
                f"python: not using {candidate} for tools: sandboxes cannot mount it "
                f"({hidden[0]} is not readable by unprivileged users)"
            )
            continue
        return runtime, notes
    return None, notes


def find_node(configured: str | None = None) -> NodeRuntime | None:
    """The Node for JS/TS tools: ``configured`` (a path or a name on PATH), else ``node``.

    None when there is none, or it is older than Node 20.
    """
    found = shutil.which(configured or "node")
    if found is None:
        return None
    try:
        out = subprocess.run(
            [found, "--version"], capture_output=True, text=True, timeout=10, env=clean_env()
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.fullmatch(r"v(\d+\.\d+\.\d+)", out)
    if match is None:
        return None
    real = os.path.realpath(found)
    mounts = _outermost({real, *_system_mounts()})
    runtime = NodeRuntime(path=real, version=match.group(1), mounts=mounts)
    return runtime if runtime.major >= MIN_NODE_MAJOR else None


def find_runtimes(python: str | None, node: str | None) -> Runtimes:
    py, notes = find_python(python)
    nd = find_node(node)
    problems = []
    if py is None:
        problems.append("python: no usable Python for tools; Python tools cannot run")
    if nd is None:
        problems.append(
            f"node: no Node.js >= {MIN_NODE_MAJOR}; JavaScript/TypeScript tools "
            "cannot be uploaded or run"
        )
    return Runtimes(python=py, node=nd, notes=tuple(notes), problems=tuple(problems))
