"""Assembles the run machinery from Settings: runtimes, cgroups, jail, caches, runner.

Built once by the CLI (``tool test``) or the daemon's lifespan, then passed down.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runnerd.cgroups import Cgroups, setup_cgroups
from runnerd.config import Settings
from runnerd.envs import EnvManager
from runnerd.runs import CodeCache, Runner
from runnerd.runtimes import Runtimes, find_runtimes, world_readable
from runnerd.sandbox import Limits, Sandbox, SandboxUnavailable, UidPool, find_nsjail
from runnerd.toolchain import Toolchain

__all__ = ["Engine", "build_engine"]


@dataclass
class Engine:
    settings: Settings
    runtimes: Runtimes
    cgroups: Cgroups
    sandbox: Sandbox
    envs: EnvManager
    runner: Runner
    toolchain: Toolchain
    notes: list[str] = field(default_factory=list)

    def report(self) -> list[str]:
        """What startup should print: runtimes found, cgroup mode, every fallback."""
        rt = self.runtimes
        lines = [
            f"python: {rt.python.executable} {rt.python.version}" if rt.python else "python: none",
            f"node: {rt.node.path} {rt.node.version}" if rt.node else "node: none",
            f"cgroups: {self.cgroups.mode}",
        ]
        lines += list(rt.notes)
        if self.cgroups.warning:
            lines.append(self.cgroups.warning)
        return lines


def build_engine(settings: Settings) -> Engine:
    data = settings.data_dir
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o711)  # jails' uids traverse it to their own mounts; nothing is listable
    if not world_readable(data):
        raise SandboxUnavailable(
            f"the data dir {data} sits in a folder other users cannot enter (o+x): nsjail "
            "mounts each tool's code from it as the run's unprivileged uid; choose a data "
            "dir whose parent folders are o+x, such as /var/lib/runnerd"
        )
    runtimes = find_runtimes(settings.python, settings.node)
    cgroups = setup_cgroups()
    limits = Limits(
        memory_mb=settings.memory_mb,
        pids=settings.pids,
        tmp_mb=settings.tmp_mb,
        file_mb=settings.file_mb,
        open_files=settings.open_files,
        cpu_ms_per_sec=settings.cpu_ms_per_sec,
    )
    sandbox = Sandbox(
        nsjail=find_nsjail(settings.nsjail),
        runtimes=runtimes,
        cgroups=cgroups,
        uids=UidPool(data / "run" / "uids", settings.sandbox_uid_base, settings.sandbox_uid_count),
        limits=limits,
    )
    envs = EnvManager(data / "envs", sandbox=sandbox, settings=settings)
    runner = Runner(sandbox=sandbox, code=CodeCache(data / "code"), envs=envs)
    toolchain = Toolchain(settings.toolchain_path, runtimes.node)
    return Engine(settings, runtimes, cgroups, sandbox, envs, runner, toolchain)
