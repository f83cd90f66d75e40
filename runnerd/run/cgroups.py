"""Memory, process and CPU limits for jails through cgroups: v1, v2, or (loudly) none.

nsjail makes one cgroup per run (``NSJAIL.<pid>``) under a parent runnerd prepares:

- **v1** (separate hierarchies under /sys/fs/cgroup/{memory,pids,cpu}): the parent is
  ``<controller>/runnerd``.
- **v2** (one unified hierarchy): the parent is ``<own cgroup>/jails``. A v2 cgroup
  with processes in it cannot hand controllers down ("no internal processes"), so the
  daemon first moves itself into ``<own cgroup>/daemon``. Under systemd this needs
  ``Delegate=yes`` (see packaging/runnerd.service).

When neither works, runs still get rlimits, and ``warning`` says what is missing.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Cgroups", "setup_cgroups"]

_V1_CONTROLLERS = ("memory", "pids", "cpu")
_V2_CONTROLLERS = ("memory", "pids", "cpu")
_PARENT = "runnerd"


@dataclass(frozen=True)
class Cgroups:
    mode: str  # "v1", "v2" or "none"
    nsjail_args: tuple[str, ...]  # where nsjail makes each run's cgroup
    has_cpu: bool = False
    warning: str | None = None

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _sweep(parent: Path) -> None:
    """Remove run cgroups a killed nsjail left behind (rmdir refuses non-empty ones)."""
    for child in parent.glob("NSJAIL.*"):
        with contextlib.suppress(OSError):
            child.rmdir()


def _setup_v1(root: Path) -> Cgroups | None:
    present = [c for c in _V1_CONTROLLERS if (root / c / "cgroup.procs").is_file()]
    if "memory" not in present or "pids" not in present:
        return None
    args: list[str] = []
    for controller in present:
        parent = root / controller / _PARENT
        try:
            parent.mkdir(exist_ok=True)
        except OSError:
            return None
        _sweep(parent)
        flag = {"memory": "mem"}.get(controller, controller)
        args += [
            f"--cgroup_{flag}_mount",
            str(root / controller),
            f"--cgroup_{flag}_parent",
            _PARENT,
        ]
    return Cgroups("v1", tuple(args), has_cpu="cpu" in present)


def _own_v2_cgroup() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    return None


def _setup_v2(root: Path) -> Cgroups | None:
    controllers_file = root / "cgroup.controllers"
    if not controllers_file.is_file():
        return None
    available = controllers_file.read_text().split()
    wanted = [c for c in _V2_CONTROLLERS if c in available]
    if "memory" not in wanted or "pids" not in wanted:
        return None
    own = _own_v2_cgroup()
    if own is None:
        return None
    base = root / own.lstrip("/")
    enable = " ".join(f"+{c}" for c in wanted)
    try:
        if own != "/" and base.name != "daemon":
            # Leave the cgroup we were started in, so it may hand controllers down.
            (base / "daemon").mkdir(exist_ok=True)
            _write(base / "daemon" / "cgroup.procs", str(os.getpid()))
        elif base.name == "daemon":
            base = base.parent
        _write(base / "cgroup.subtree_control", enable)
        jails = base / "jails"
        jails.mkdir(exist_ok=True)
        _write(jails / "cgroup.subtree_control", enable)
    except OSError:
        return None
    _sweep(jails)
    return Cgroups(
        "v2", ("--use_cgroupv2", "--cgroupv2_mount", str(jails)), has_cpu="cpu" in wanted
    )


def setup_cgroups(root: Path = Path("/sys/fs/cgroup")) -> Cgroups:
    """Prepare the parent cgroups for jails; never raises. Prefers v2 when both exist."""
    for setup in (_setup_v2, _setup_v1):
        found = setup(root)
        if found is not None:
            return found
    return Cgroups(
        "none",
        (),
        warning=(
            "WARNING: no usable cgroup controllers (memory and pids, v1 or v2) under "
            f"{root}: tool runs are limited by rlimits only. Memory is not capped for "
            "Node.js tools (their heap size is), and processes are capped per uid. Run "
            "runnerd as root with cgroup v1 controllers, or with a delegated cgroup v2 "
            "subtree (systemd Delegate=yes)."
        ),
    )
