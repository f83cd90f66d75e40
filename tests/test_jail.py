"""The jail's outside uids (one per live jail, host-wide), and a call's jail end."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import make_tool
from runnerd.config import load_settings
from runnerd.errors import SandboxUnavailable
from runnerd.limits import LEFTOVER_WAIT_S, REPLY_GRACE_S, STOP_GRACE_S
from runnerd.run.jail import JailEnd, Job, Sandbox, UidPool
from runnerd.run.machine import Machine
from runnerd.run.spawn import Jail, kill_leftovers

# Python jails both ways: forked from a template (the default) and a fresh nsjail per call.
PATHS = pytest.mark.parametrize("templates", [True, False], ids=["template", "nsjail"])


@contextlib.contextmanager
def python_jails(machine: Machine, *, templates: bool) -> Iterator[None]:
    """``machine``'s Python jails forked from templates, or fresh nsjails, meanwhile."""
    sandbox = machine.sandbox
    before = sandbox.limits
    sandbox.limits = dataclasses.replace(before, python_templates=templates)
    try:
        yield
    finally:
        sandbox.limits = before


def test_two_pools_over_one_host_folder_never_hand_out_the_same_uid(tmp_path: Path) -> None:
    # Two daemons with their own data dirs and overlapping ranges, as on one host (the
    # last uid of each range is its package builders': 3 uids for runs each).
    first = UidPool(tmp_path / "uids", 700_000, 4)
    second = UidPool(tmp_path / "uids", 700_001, 4)
    held = [first.lease() for _ in range(3)]
    taken = {uid for uid, _ in held}
    assert taken == {700_000, 700_001, 700_002}
    uid, lock = second.lease()
    assert uid == 700_003
    with pytest.raises(SandboxUnavailable):
        second.lease()
    lock.close()
    held[0][1].close()
    assert second.lease()[0] in {held[0][0], 700_003}


def test_the_uid_locks_live_outside_every_data_dir(tmp_path: Path) -> None:
    settings = load_settings(env={}, flags={"data_dir": tmp_path / "data"})
    assert settings.uid_lock_dir == Path("/run/runnerd/uids")
    assert not settings.uid_lock_dir.is_relative_to(settings.data_dir)


LINGER = (
    "import os, threading, time\ndef run(i):\n    os._exit = lambda code: None\n"
    "    threading.Thread(target=time.sleep, args=(60,)).start()\n    return {}\n"
)


@pytest.mark.jail
@PATHS
def test_a_calls_jail_end_comes_once_its_jail_is_reaped_not_at_its_answer(
    machine: Machine, templates: bool
) -> None:
    """What the run slots count: ``on_end`` is called once, after the answer, when the
    jail (here one that would linger 60 s past its reply) has been stopped and reaped."""
    seen: list[tuple[float, bool]] = []

    async def scenario() -> tuple[float, float]:
        serving: list[Any] = []
        end = JailEnd(lambda: seen.append((time.monotonic(), all(not j.alive for j in serving))))
        started = time.monotonic()
        result = await machine.pipeline.run(make_tool(machine, LINGER), {}, logs=False, on_end=end)
        answered = time.monotonic()
        assert result.status == "succeeded", result.error
        serving.extend(machine.sandbox._serving)
        assert end.taken and seen == []  # the jail is in its grace: the slot is still held
        while not seen and time.monotonic() - answered < 5:
            await asyncio.sleep(0.01)
        end()  # a second call does nothing
        return answered - started, answered

    with python_jails(machine, templates=templates):
        waited, answered = asyncio.run(scenario())
    assert waited < 1.0
    assert len(seen) == 1
    ended, all_reaped = seen[0]
    assert all_reaped
    assert REPLY_GRACE_S <= ended - answered + 0.05 < REPLY_GRACE_S + STOP_GRACE_S + 1.0


@pytest.mark.jail
def test_a_jail_whose_nsjail_must_be_killed_ends_with_nothing_of_it_running(
    machine: Machine,
) -> None:
    """nsjail stopped (SIGSTOP: it cannot act on SIGTERM) is killed STOP_GRACE_S later;
    its jail's processes die with it, and the call's end comes once none of them runs."""
    seen: list[list[str]] = []

    async def scenario() -> None:
        uid: list[int] = []
        end = JailEnd(lambda: seen.append(_pids_of(uid[0])))
        result = await machine.pipeline.run(make_tool(machine, LINGER), {}, logs=False, on_end=end)
        assert result.status == "succeeded", result.error
        [jail] = machine.sandbox._serving
        assert isinstance(jail, Jail)  # a fresh nsjail
        uid.append(jail.uid)
        os.kill(jail.proc._popen.pid, signal.SIGSTOP)
        deadline = time.monotonic() + REPLY_GRACE_S + STOP_GRACE_S + LEFTOVER_WAIT_S + 1
        while not seen and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    with python_jails(machine, templates=False):  # nsjail's own stop
        asyncio.run(scenario())
    assert seen == [[]]


@pytest.mark.jail
def test_a_calls_jail_end_comes_at_once_when_no_jail_can_start(machine: Machine) -> None:
    no_python = Sandbox(
        nsjail=machine.sandbox.nsjail,
        runtimes=dataclasses.replace(machine.runtimes, python=None),
        cgroups=machine.cgroups,
        uids=machine.sandbox.uids,
        limits=machine.sandbox.limits,
    )
    ended: list[bool] = []
    end = JailEnd(lambda: ended.append(True))
    job = Job(language="python", timeout_ms=1000, request=b"{}")
    with pytest.raises(SandboxUnavailable):
        asyncio.run(no_python.run(job, logs=False, on_end=end))
    assert ended == [True]


def test_what_is_left_of_a_killed_jails_uid_is_killed_and_waited_for() -> None:
    """After nsjail itself had to be killed, every process of the jail's own uid goes,
    one that ignores SIGTERM and one in a session of its own too; no other uid's."""
    uid = 647_001  # nothing else on the host runs as it (the tests' jail ranges are apart)
    script = "trap '' TERM; setsid sleep 60 & sleep 60"
    jailed = subprocess.Popen(["sh", "-c", script], user=uid, group=uid, start_new_session=True)
    bystander = subprocess.Popen(["sleep", "60"])
    threading.Thread(target=jailed.wait, daemon=True).start()  # its parent reaps it, as nsjail's
    try:
        deadline = time.monotonic() + 5
        while len(_pids_of(uid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(_pids_of(uid)) == 3
        started = time.monotonic()
        assert kill_leftovers(uid, 2.0) == []
        assert time.monotonic() - started < 1.0
        assert _pids_of(uid) == [] and bystander.poll() is None
    finally:
        jailed.kill()
        bystander.kill()
        bystander.wait()


def _pids_of(uid: int) -> list[str]:
    """The processes of ``uid`` still running (zombies are dead, reaped by their parent)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue
        dead = any(x.startswith("State:") and x.split()[1] in ("Z", "X") for x in lines)
        if not dead and any(x.startswith("Uid:") and int(x.split()[1]) == uid for x in lines):
            found.append(status.parent.name)
    return found


def _jail_starts() -> float:
    from runnerd.metrics import METRICS

    return sum(
        sample.value
        for metric in METRICS.jail_start_seconds.collect()
        for sample in metric.samples
        if sample.name.endswith("_count")
    )


def _starts_while_idle(machine: Machine, envs: list[Path], *, warm_first: bool) -> float:
    """Jails a warm pool of one jail per kind starts in 2 s with no call, once it has been
    given a python kind per package env of ``envs`` (and, ``warm_first``, has filled)."""
    from runnerd.run.jail import JailKind

    pooled = Sandbox(
        nsjail=machine.sandbox.nsjail,
        runtimes=machine.runtimes,
        cgroups=machine.cgroups,
        uids=machine.sandbox.uids,
        limits=machine.sandbox.limits,
        warm=1,
    )

    async def scenario() -> float:
        try:
            for env in envs:
                pooled.warm_pool.refill(JailKind("python", env))
                await asyncio.sleep(0.05)
            if warm_first:
                await pooled.warm_pool.wait_warm(15)
            await asyncio.sleep(1)
            before = _jail_starts()
            await asyncio.sleep(2)
            return _jail_starts() - before
        finally:
            await pooled.close()

    return asyncio.run(scenario())


@pytest.mark.jail
def test_more_kinds_than_the_pool_keeps_do_not_restart_jails_forever(machine: Machine) -> None:
    """A kind evicted from the warm pool (more than WARM_MAX_KINDS in use) stays out: its
    jails' ends do not bring it back, evicting another, whose ends bring that back…"""
    from runnerd.limits import WARM_MAX_KINDS

    # Package env folders the jails' uids can enter (pytest's tmp folders are 0700).
    base = Path(tempfile.mkdtemp(prefix="kinds-", dir=machine.settings.data_dir))
    base.chmod(0o755)
    envs = [base / f"env{n}" for n in range(WARM_MAX_KINDS + 2)]
    for env in envs:
        env.mkdir(mode=0o755)
    assert _starts_while_idle(machine, envs, warm_first=True) == 0


@pytest.mark.jail
def test_a_kind_whose_jails_die_at_start_is_not_restarted_in_a_loop(machine: Machine) -> None:
    """A package env inside a folder the jails' uids cannot enter (0700): each waiting jail
    dies at once, and the pool leaves the kind be until it is called again."""
    broken = Path(tempfile.mkdtemp(prefix="closed-", dir=machine.settings.data_dir)) / "env"
    broken.mkdir(mode=0o755)
    assert _starts_while_idle(machine, [broken], warm_first=False) == 0
