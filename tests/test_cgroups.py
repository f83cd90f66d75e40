"""cgroup detection: v1 on this machine for real; v2 and "none" on a cgroup tree laid out
in a temporary folder (the cgroup filesystem is the edge of the machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runnerd.run import cgroups
from runnerd.run.cgroups import setup_cgroups


def test_this_machine_has_a_usable_hierarchy() -> None:
    found = setup_cgroups()
    assert found.mode in ("v1", "v2")
    assert found.warning is None
    if found.mode == "v1":
        assert "--cgroup_mem_parent" in found.nsjail_args
        assert Path("/sys/fs/cgroup/memory/runnerd").is_dir()


def test_v2_moves_the_daemon_aside_and_delegates_controllers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = tmp_path / "system.slice" / "runnerd.service"
    service.mkdir(parents=True)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    monkeypatch.setattr(cgroups, "_own_v2_cgroup", lambda: "/system.slice/runnerd.service")
    found = setup_cgroups(tmp_path)
    assert found.mode == "v2" and found.has_cpu
    assert found.nsjail_args == ("--use_cgroupv2", "--cgroupv2_mount", str(service / "jails"))
    assert (service / "daemon" / "cgroup.procs").read_text().isdigit()
    assert (service / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (service / "jails" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_neither_hierarchy_degrades_with_a_loud_warning(tmp_path: Path) -> None:
    found = setup_cgroups(tmp_path)
    assert (found.mode, found.nsjail_args, found.enabled) == ("none", (), False)
    assert found.warning is not None and found.warning.startswith("WARNING: no usable cgroup")
