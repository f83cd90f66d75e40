"""The process side of a jail: start one nsjail, read its pipes, stop it, reap it.

run/jail.py says what a jail is (its argv); this module runs it. nsjail is started in a
spawner thread (its fork and exec never hold the event loop), awaited through a pidfd in
the loop, its result, log and nsjail-log pipes read into capped buffers. A jail is
stopped with SIGTERM (nsjail kills the jail's whole pid namespace), SIGKILL STOP_GRACE_S
later if it has not exited, and then whatever still runs as the jail's own outside uid is
killed and waited for: a jail's uid comes back only once nothing of it runs.

Jails die with their daemon: nsjail is started through ``setpriv --pdeathsig KILL``, so
the kernel kills it when the thread that started it (a long-lived spawner thread) dies,
the daemon's SIGKILL included; nsjail has set the same on the jail's init, whose death
takes the whole pid namespace along; run/uids.py never hands a uid out while a process
of it runs, and kills at start what a killed runnerd left in its range.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from runnerd.limits import LEFTOVER_WAIT_S, MAX_JAIL_LOG_BYTES, STOP_GRACE_S
from runnerd.run.uids import UidLock, kill_leftovers

__all__ = [
    "DIE_WITH_PARENT",
    "Jail",
    "RunningJail",
    "kill_leftovers",
    "spawn",
    "start_jail",
]


def _die_with_parent() -> tuple[str, ...]:
    """The command prefix that makes a process die with the thread that started it:
    util-linux's setpriv setting the parent-death signal (SIGKILL), which the exec of
    nsjail keeps (not set-uid, no file capabilities). () when setpriv is missing: then
    jails outlive a killed daemon until the next start's sweep (Machine.warnings says so)."""
    for path in (shutil.which("setpriv"), "/usr/bin/setpriv", "/bin/setpriv"):
        if path and os.access(path, os.X_OK):
            return (path, "--pdeathsig", "KILL", "--")
    return ()


DIE_WITH_PARENT = _die_with_parent()

# A jail's argv, given the descriptors of its result pipe and of nsjail's log (the
# numbers the process gets them under).
Command = Callable[[int, int], list[str]]


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
            # From this long-lived spawner thread: the parent-death signal fires when the
            # thread that forked dies, so nsjail dies with the daemon and never before.
            popen = subprocess.Popen(
                [*DIE_WITH_PARENT, *argv], stdin=stdin, stdout=stdout,
                stderr=subprocess.STDOUT, pass_fds=pass_fds, env={}, start_new_session=True,
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


class RunningProcess(Protocol):
    """What Sandbox uses of a jail's process: an nsjail (``_Process``) or a template's
    child (templates._ChildProcess)."""

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


class RunningJail(Protocol):
    """What Sandbox.run and the warm pool use of a started jail: a ``Jail`` (a fresh
    nsjail) or a templates.TemplateJail (a child forked from a Python template)."""

    uid: int
    uid_lock: UidLock
    stdin: asyncio.WriteTransport
    result: _Capped
    jail_log: _Capped
    logs: _Capped
    started: float
    taken: bool

    @property
    def proc(self) -> RunningProcess: ...

    @property
    def alive(self) -> bool: ...

    async def stop(self) -> None: ...

    async def end(self, grace_s: float) -> None: ...


class Jail:
    """A started nsjail process, its pipes read into capped buffers, its uid held (close
    ``uid_lock`` to give the uid back, once the jail is reaped: its lock file is cleared
    when nsjail exited by itself, having reaped the jail, or when the jail's leftovers
    were seen gone; else the uid's next lease looks for its processes)."""

    def __init__(
        self,
        proc: _Process,
        uid: int,
        uid_lock: UidLock,
        stdin: asyncio.WriteTransport,
        result: _Capped,
        jail_log: _Capped,
        logs: _Capped,
    ) -> None:
        self.proc = proc
        self.uid = uid
        self.uid_lock = uid_lock
        uid_lock.watch(proc)
        self.stdin = stdin
        self.result = result
        self.jail_log = jail_log
        self.logs = logs
        self.started = time.monotonic()
        self.taken = False  # a call took it from the warm pool

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def stop(self) -> None:
        """Stop the jail: SIGTERM lets nsjail kill the pid namespace and remove its
        cgroup; SIGKILL if it has not within STOP_GRACE_S (the jail's init then dies
        with it, taking every process of the namespace along, but the kernel may take a
        while: what is left of the jail's own uid is killed and waited for, so the uid
        and the call's slot come back only once nothing of the jail runs)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
            left = await asyncio.to_thread(kill_leftovers, self.uid, LEFTOVER_WAIT_S)
            self.uid_lock.clean = not left

    async def end(self, grace_s: float) -> None:
        """``grace_s`` for the jail to exit by itself, then it is stopped."""
        if grace_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), timeout=grace_s)
        if self.proc.returncode is None:
            await self.stop()


async def start_jail(
    command: Command, uid: int, uid_lock: UidLock, *, result_cap: int, log_cap: int
) -> Jail:
    """Start the jail ``command`` describes, whose outside uid is ``uid`` (held by
    ``uid_lock``), with its pipes: stdin (the request goes there when the call comes),
    stdout and stderr (the logs, ``log_cap`` bytes kept), the result (``result_cap``) and
    nsjail's own log.

    Whatever fails, nothing leaks: the pipes are closed and ``uid_lock`` is closed, at
    once when no process started, or once the started process is killed and reaped."""
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
        argv = command(result_w, log_w)
    except BaseException:
        for fd in theirs:
            os.close(fd)
        release()
        raise
    proc = await spawn(argv, stdin_r, logs_w, (result_w, log_w), release)
    loop = asyncio.get_running_loop()
    result = _Reply(result_cap)
    jail_log = _Capped(MAX_JAIL_LOG_BYTES)
    logs = _Capped(log_cap)
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
    return Jail(proc, uid, uid_lock, stdin, result, jail_log, logs)
