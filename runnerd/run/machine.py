"""Assembles the run machinery from Settings: runtimes, cgroups, jail, caches, pipeline.

Built once by the CLI (``tool test``) or the daemon's lifespan, then passed down.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from runnerd.checks.pool import Checker
from runnerd.config import Settings
from runnerd.egress import parse_networks
from runnerd.errors import SandboxUnavailable
from runnerd.run.cgroups import Cgroups, setup_cgroups
from runnerd.run.jail import Limits, Sandbox, UidPool, find_nsjail, reachable_harnesses
from runnerd.run.package_envs import EnvManager
from runnerd.run.pipeline import Pipeline
from runnerd.run.proxy import EgressProxy, socket_path
from runnerd.run.runtimes import Runtimes, find_runtimes, world_readable
from runnerd.run.spawn import DIE_WITH_PARENT
from runnerd.run.toolchain import Toolchain

__all__ = ["Machine", "build_machine", "build_sandbox"]

log = logging.getLogger("runnerd")


@dataclass
class Machine:
    settings: Settings
    runtimes: Runtimes
    cgroups: Cgroups
    sandbox: Sandbox
    envs: EnvManager
    pipeline: Pipeline
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
        return lines + list(rt.notes) + self.notes

    def warnings(self) -> list[str]:
        """What startup must say loudly: missing runtimes, fallbacks, no cgroups."""
        found = list(self.runtimes.problems)
        if self.cgroups.warning:
            found.append(self.cgroups.warning)
        if not DIE_WITH_PARENT:
            found.append(
                "WARNING: setpriv (util-linux) was not found: jails do not die with a "
                "killed daemon (the next start kills what is left)"
            )
        return found


def build_machine(
    settings: Settings, *, warm: int = 0, runtimes: Runtimes | None = None
) -> Machine:
    """The run machinery. ``warm``: jails kept started ahead of calls per kind (the daemon
    uses settings.warm_jails; one-shot commands start each jail on demand). ``runtimes``:
    found already (finding them runs each one), else found here."""
    data = settings.data_dir
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Before any uid is handed out (and before the cgroups' sweep removes the run
    # cgroups they leave empty): what a killed runnerd left running in this range.
    uids = UidPool(settings.uid_lock_dir, settings.sandbox_uid_base, settings.sandbox_uid_count)
    killed, stuck = uids.sweep()
    mounts, note = _mount_root(settings)
    if runtimes is None:
        runtimes = find_runtimes(settings.python, settings.node, stage=mounts / "runtimes")
    cgroups = setup_cgroups()
    sandbox = build_sandbox(
        settings,
        runtimes=runtimes,
        cgroups=cgroups,
        harness_dir=reachable_harnesses(
            mounts / "harness", runtimes.python.executable if runtimes.python else None
        ),
        warm=warm,
    )
    envs = EnvManager(mounts / "envs", sandbox=sandbox, settings=settings)
    pipeline = Pipeline(
        sandbox=sandbox, envs=envs, checker=Checker(budget_s=settings.check_budget_ms / 1000)
    )
    toolchain = Toolchain(
        settings.toolchain_path,
        runtimes.node,
        on_install=lambda where: log.info("installing the JS/TS toolchain into %s (once)", where),
    )
    machine = Machine(settings, runtimes, cgroups, sandbox, envs, pipeline, toolchain)
    if note:
        machine.notes.append(note)
    if killed:
        left = f"; uids {stuck} still run some (not handed out until they are gone)"
        machine.notes.append(
            f"killed {killed} process(es) a killed runnerd left running as sandbox uids"
            + (left if stuck else "")
        )
    return machine


def build_sandbox(
    settings: Settings, *, runtimes: Runtimes, cgroups: Cgroups, harness_dir: Path, warm: int = 0
) -> Sandbox:
    """The Sandbox of ``settings`` for these runtimes, cgroups and harness folder (what
    build_machine found on this host), with its uid pool and its egress proxy (not started).
    Starts nothing: tests/test_jail_policy.py builds jails' argv with it."""
    proxy = EgressProxy(
        socket_path(settings.uid_lock_dir),
        allow_networks=parse_networks(settings.egress_allow_networks),
        max_connections=settings.egress_max_connections,
        max_bytes=settings.egress_max_mb * 1024 * 1024,
        connect_timeout_s=settings.egress_connect_timeout_ms / 1000,
    )
    return Sandbox(
        nsjail=find_nsjail(settings.nsjail),
        runtimes=runtimes,
        cgroups=cgroups,
        uids=UidPool(settings.uid_lock_dir, settings.sandbox_uid_base, settings.sandbox_uid_count),
        limits=Limits.from_settings(settings),
        warm=warm,
        proxy=proxy,
        harness_dir=harness_dir,
    )


DEFAULT_CACHE_DIR = Path("/var/cache/runnerd")


def _mount_root(settings: Settings) -> tuple[Path, str | None]:
    """Where the files jails mount (tool code, package envs) live.

    nsjail mounts them as the run's unprivileged uid, so every folder above them must be
    enterable by other users (o+x). That is ``cache_dir`` if set; else the data dir if it
    qualifies; else /var/cache/runnerd (a root-owned 0711 folder), with a note saying so.
    """
    note = None
    if settings.cache_dir is not None:
        root = settings.cache_dir
    elif world_readable(settings.data_dir.parent):
        root = settings.data_dir
    else:
        root = DEFAULT_CACHE_DIR
        note = (
            f"the data dir {settings.data_dir} is in a folder other users cannot enter, "
            f"so the files sandboxes mount (tool code, package envs) live in {root}"
        )
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)  # enterable by jails' uids, listable by nobody
    if not world_readable(root):
        raise SandboxUnavailable(
            f"{root} sits in a folder other users cannot enter (o+x): nsjail mounts each "
            "tool's code from it as the run's unprivileged uid; set cache_dir "
            "(RUNNERD_CACHE_DIR) to a folder whose parents are o+x, such as /var/cache/runnerd"
        )
    return root, note
