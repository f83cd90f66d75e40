"""Python templates: a prepared interpreter, in a jail of its own, that forks one fresh
sandbox per call (issue 27).

A template is one nsjail (started through spawn.spawn, so it dies with the daemon)
running sandbox/template_py.py as root of its own user namespace: capabilities there
only, inside uid 0 mapped to an outside uid it leases for its life (``--user 0:T:1``),
inside uids 1.. mapped to the sandbox pool's runs' uids (outside ``u`` is inside
``u - base + 1``; T itself is left out of that map), no network, no /proc, read-only
mounts (the runtime's, the harness, the package env at /env), the seccomp policy
sandbox/template.kafel. It has loaded the harness and the package set's modules, never
a tool's code, and it never holds an input, an output or a secret: no descriptor of a
call ever passes through it.

``Template.fork`` sends it the call's parameters only (the uid the daemon leased for the
call, rlimits, egress yes or no; the host-wide uid lock stays here). The child enters
fresh mount, net, ipc, uts and pid namespaces (pid 1 of its own), builds a fresh tmpfs
root and /tmp, drops to that uid, sets no_new_privs, rlimits and a second seccomp
filter (which takes away what the template policy allowed beyond the tool policy),
makes the call's pipes itself and says ready. The daemon finds it in /proc (never on
the template's word alone), takes its ends of the pipes with pidfd_getfd, verifies it
(run/template_check.py), puts it in the call's own cgroups, and only then writes to it.
A child that fails a check is killed, its template recycled and the call run in a
fresh nsjail. What comes back is a ``TemplateJail``: what Sandbox.run uses of spawn.Jail.

A template that dies fails the forks in flight (TemplateUnavailable: Sandbox falls back
on nsjail per call) and is started again on the next fork; a template is recycled after
TEMPLATE_MAX_FORKS children or TEMPLATE_MAX_AGE_S (a new one serves new calls, the old
one is stopped once its last child is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import select
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from runnerd.errors import SandboxUnavailable, TemplateUnavailable
from runnerd.limits import (
    EGRESS_SOCKET,
    LEFTOVER_WAIT_S,
    MAX_JAIL_LOG_BYTES,
    REPLY_FRAME_BYTES,
    TEMPLATE_CHILD_KILLED,
    TEMPLATE_ENV_MAX_ENTRIES,
    TEMPLATE_FORK_TIMEOUT_S,
    TEMPLATE_MAX_AGE_S,
    TEMPLATE_MAX_FORKS,
    TEMPLATE_MESSAGE_BYTES,
    TEMPLATE_OPEN_FILES,
    TEMPLATE_RETRY_S,
    TEMPLATE_START_TIMEOUT_S,
    TEMPLATE_STOP_WAIT_S,
)
from runnerd.run.spawn import _Capped, _Process, _Reply, _same, kill_leftovers, spawn
from runnerd.run.template_check import TemplateView, boot_ticks, find_child, pidfd_getfd, verify
from runnerd.run.uids import UidLock

if TYPE_CHECKING:
    from runnerd.run.cgroups import Cgroups
    from runnerd.run.proxy import EgressProxy
    from runnerd.run.runtimes import Runtimes
    from runnerd.run.uids import UidPool


# What a template uses of run/jail.py's Sandbox, Limits and JailKind (jail.py imports this
# module, so these are described here rather than imported).
class Limits(Protocol):
    @property
    def memory_mb(self) -> int: ...
    @property
    def pids(self) -> int: ...
    @property
    def tmp_mb(self) -> int: ...
    @property
    def file_mb(self) -> int: ...
    @property
    def open_files(self) -> int: ...
    @property
    def cpu_ms_per_sec(self) -> int: ...
    @property
    def log_bytes(self) -> int: ...
    @property
    def output_bytes(self) -> int: ...


class JailKind(Protocol):
    @property
    def language(self) -> str: ...
    @property
    def env_dir(self) -> Path | None: ...
    @property
    def egress(self) -> bool: ...


class Sandbox(Protocol):
    nsjail: str
    runtimes: Runtimes
    cgroups: Cgroups
    uids: UidPool
    proxy: EgressProxy | None
    _dir: Path
    _jail_config: Path
    python_bytecode: bool

    @property
    def limits(self) -> Limits: ...


__all__ = ["Template", "TemplateJail", "TemplateUnavailable", "inside_uid", "unsafe_entry"]

log = logging.getLogger("runnerd")

# The child's fds (sandbox/template_py.py): its ends of the request, logs and result
# pipes, and the daemon's ends, which the daemon takes and the child then closes.
_CHILD_FDS = {"request": (0,), "logs": (1, 2), "result": (3,)}
_DAEMON_FDS = {"request": 5, "logs": 6, "result": 7}
_GO = b"\0"  # after the checks, before the request: the child closes the daemon's ends


def inside_uid(uid: int, base: int) -> int:
    """The uid a template's child runs as inside, for the outside ``uid`` of its call."""
    return uid - base + 1


def _uid_map(template_uid: int, base: int, runs: int) -> list[str]:
    """nsjail's ``--user`` (and ``--group``) maps: 0 is the template's uid, each runs' uid
    ``u`` of ``[base, base + runs)`` is ``u - base + 1``, the template's own uid excepted."""
    maps = [f"0:{template_uid}:1"]
    below = template_uid - base if base <= template_uid < base + runs else runs
    if below > 0:
        maps.append(f"1:{base}:{below}")
    above = runs - below - 1
    if above > 0:
        maps.append(f"{below + 2}:{template_uid + 1}:{above}")
    return maps


class _ChildProcess:
    """A template's child as spawn._Process looks: its exit from the template's report
    (or, if the template died first, from its pidfd: killed), signals through a pidfd."""

    def __init__(self, pidfd: int, host_pid: int, loop: asyncio.AbstractEventLoop) -> None:
        self._pidfd = pidfd
        self.host_pid = host_pid
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self.gone: asyncio.Future[None] = loop.create_future()  # pidfd readable
        loop.add_reader(pidfd, self._on_pidfd)

    def _on_pidfd(self) -> None:
        self._loop.remove_reader(self._pidfd)
        if not self.gone.done():
            self.gone.set_result(None)

    def reported(self, status: int) -> None:
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
        elif os.WIFSIGNALED(status):
            code = 128 + os.WTERMSIG(status)
        else:
            code = 255
        self._set(code)

    def _set(self, code: int) -> None:
        if not self._exited.done():
            self._exited.set_result(code)
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1

    def template_died(self) -> None:
        """The template is gone, and with it its pid namespace: the child too (its
        own namespace nests in the template's), so none of its processes run."""
        if self.gone.done():
            self._set(TEMPLATE_CHILD_KILLED)
        else:
            self.gone.add_done_callback(lambda _: self._set(TEMPLATE_CHILD_KILLED))

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self._pidfd >= 0 and not self._exited.done():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class TemplateJail:
    """One call's child: what Sandbox.run uses of spawn.Jail. The child is the init of
    its own pid namespace, so SIGKILL to it takes every process of the call along (a
    double-forked daemon included); it ignores SIGTERM (no handler), so stop kills."""

    def __init__(
        self,
        proc: _ChildProcess,
        uid: int,
        uid_lock: UidLock,
        stdin: asyncio.WriteTransport,
        result: _Capped,
        jail_log: _Capped,
        logs: _Capped,
        host_pid: int,
    ) -> None:
        self.proc = proc
        self.uid = uid
        self.uid_lock = uid_lock
        uid_lock.watch(proc)
        self.stdin = stdin
        self.result = result
        self.jail_log = jail_log
        self.logs = logs
        self.host_pid = host_pid
        self.started = time.monotonic()
        self.taken = False

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def stop(self) -> None:
        """SIGKILL the child (its whole pid namespace goes); if its template does not
        report it reaped within TEMPLATE_STOP_WAIT_S, what runs as the call's uid is
        killed and waited for before the uid comes back."""
        self.proc.kill()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=TEMPLATE_STOP_WAIT_S)
        except TimeoutError:
            left = await asyncio.to_thread(kill_leftovers, self.uid, LEFTOVER_WAIT_S)
            self.uid_lock.clean = not left
            self.proc._set(TEMPLATE_CHILD_KILLED)

    async def end(self, grace_s: float) -> None:
        if grace_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), timeout=grace_s)
        if self.proc.returncode is None:
            await self.stop()


@dataclass
class _Call:
    # The child's pid in the template's namespace, and the read end of its ready pipe.
    forked: asyncio.Future[tuple[int, int]]
    inner_pid: int | None = None
    host_pid: int | None = None  # found in /proc
    child: _ChildProcess | None = None
    status: int | None = None  # reported before the daemon had its _ChildProcess
    ready_taken: bool = False  # the ready pipe's end is the fork's to close


class _Cgroup:
    """One call's cgroups (v1: memory, pids, cpu; v2: one), made by the daemon, with the
    limits nsjail gives its jails; removed once the call's child is reaped."""

    def __init__(self, sandbox: Sandbox, name: str) -> None:
        self.dirs: list[Path] = []
        cg, lim = sandbox.cgroups, sandbox.limits
        if not cg.enabled:
            return
        args = dict(zip(cg.nsjail_args[::2], cg.nsjail_args[1::2], strict=False))
        files: list[tuple[Path, dict[str, str]]] = []
        memory = str(lim.memory_mb * 1024 * 1024)
        if cg.mode == "v1":
            for flag, values in (
                ("mem", {"memory.limit_in_bytes": memory}),
                ("pids", {"pids.max": str(lim.pids)}),
                ("cpu", {"cpu.cfs_period_us": "1000000",
                         "cpu.cfs_quota_us": str(lim.cpu_ms_per_sec * 1000)}),
            ):  # fmt: skip
                mount = args.get(f"--cgroup_{flag}_mount")
                if mount is not None:
                    files.append((Path(mount) / args[f"--cgroup_{flag}_parent"] / name, values))
        else:
            values = {"memory.max": memory, "pids.max": str(lim.pids)}
            if cg.has_cpu:
                values["cpu.max"] = f"{lim.cpu_ms_per_sec * 1000} 1000000"
            files.append((Path(args["--cgroupv2_mount"]) / name, values))
        try:
            for folder, values in files:
                folder.mkdir()
                self.dirs.append(folder)
                for key, value in values.items():
                    (folder / key).write_text(value)
        except OSError:
            self.remove()
            raise

    def enter(self, host_pid: int) -> None:
        for folder in self.dirs:
            (folder / "cgroup.procs").write_text(str(host_pid))

    def remove(self) -> None:
        for folder in self.dirs:
            with contextlib.suppress(OSError):
                folder.rmdir()


class _Instance:
    """One running template process and its control socket."""

    def __init__(
        self, proc: _Process, control: socket.socket, log: _Capped, uid_lock: UidLock
    ) -> None:
        self.proc = proc
        self.control = control
        self.log = log
        self.uid_lock = uid_lock
        self.started = time.monotonic()
        self.forks = 0
        self.calls: dict[int, _Call] = {}
        self.ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.view: TemplateView | None = None  # what /proc says of it, once it is ready
        # Verified children not reaped yet: host pid -> their namespaces, and the child.
        self.live: dict[int, tuple[dict[str, str], _ChildProcess]] = {}
        self.dead = False
        self.retired = False

    def known(self) -> tuple[set[int], set[int], int]:
        """Its children not reaped yet: the host pids found, the inner pids not yet, and
        how many forks were asked for and not reported yet."""
        found = {c.host_pid for c in self.calls.values() if c.host_pid is not None}
        pending = {
            c.inner_pid
            for c in self.calls.values()
            if c.host_pid is None and c.inner_pid is not None
        }
        unreported = sum(1 for c in self.calls.values() if c.inner_pid is None)
        return found, pending, unreported


def unsafe_entry(env_dir: Path) -> str | None:
    """The first FIFO, socket or device in ``env_dir`` (without following links), or None.
    A read-only mount does not stop two processes opening one FIFO or socket: a package
    env holding one would be a channel between a template and its children."""
    seen = 0
    for folder, dirs, files in os.walk(env_dir):
        for name in (*dirs, *files):
            seen += 1
            if seen > TEMPLATE_ENV_MAX_ENTRIES:
                return f"more than {TEMPLATE_ENV_MAX_ENTRIES} entries"
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if (
                stat.S_ISFIFO(mode)
                or stat.S_ISSOCK(mode)
                or stat.S_ISCHR(mode)
                or stat.S_ISBLK(mode)
            ):
                return os.path.relpath(os.path.join(folder, name), env_dir)
    return None


class Template:
    """The template of one kind of Python jail (runtime, package env; ``egress``: the
    proxy's socket is mounted, and a child binds it only when its call has a grant).
    Started on the first fork; ``close`` stops it."""

    def __init__(
        self,
        sandbox: Sandbox,
        kind: JailKind,
        *,
        max_forks: int = TEMPLATE_MAX_FORKS,
        max_age_s: float = TEMPLATE_MAX_AGE_S,
    ) -> None:
        if kind.language != "python":
            raise ValueError("templates are for Python jails only (Node cannot fork safely)")
        self.sandbox = sandbox
        self.kind = kind
        self.max_forks = max_forks
        self.max_age_s = max_age_s
        self._ids = itertools.count(1)
        self._current: _Instance | None = None
        self._starting: asyncio.Future[_Instance] | None = None
        self._old: set[_Instance] = set()
        self._tasks: set[asyncio.Future[None]] = set()
        self.starts = 0  # templates started (a restart or a recycle counts)
        self._failed: tuple[float, str] | None = None  # the last start's failure: when, why
        self._rejected = False  # a child failed verification (logged once)
        self.checks = 0  # children verified, and the time it took (finding, taking, checking)
        self.check_s = 0.0
        self.imported: list[str] = []  # the package set's modules the template loaded

    # --- the template process --------------------------------------------------------------
    def command(self, template_uid: int, control_fd: int, log_fd: int) -> list[str]:
        """The template's nsjail argv: Sandbox.command's jail, as root of its own user
        namespace over the runs' uids, with the template policy."""
        sb, lim = self.sandbox, self.sandbox.limits
        runtime = sb.runtimes.python
        if runtime is None:
            raise SandboxUnavailable("no Python runtime is configured for tools")
        runs = sb.uids.count - 1  # the builders' uid is no call's
        maps = _uid_map(template_uid, sb.uids.base, runs)
        argv = [
            sb.nsjail, "--config", str(sb._jail_config),
            "--mode", "o", "--quiet", "--log_fd", str(log_fd),
            "--hostname", "runnerd", "--cwd", "/",
            *(a for m in maps for a in ("--user", m)),
            *(a for m in maps for a in ("--group", m)),
            "--keep_caps",
            "--time_limit", "0",
            "--rlimit_as", "max", "--rlimit_core", "0", "--rlimit_cpu", "max",
            "--rlimit_fsize", str(lim.file_mb), "--rlimit_nofile", str(TEMPLATE_OPEN_FILES),
            "--rlimit_nproc", "max",
            "--disable_proc",
            "--seccomp_policy", str(sb._dir / "template.kafel"),
        ]  # fmt: skip
        env = ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"]
        if self.kind.egress:
            if sb.proxy is None:
                raise SandboxUnavailable("this runnerd has no egress proxy")
            argv += ["--bindmount_ro", f"{sb.proxy.path}:{EGRESS_SOCKET}"]
            env.append(f"RUNNERD_EGRESS_SOCKET={EGRESS_SOCKET}")
        for mount in runtime.mounts:
            argv += ["--bindmount_ro", mount]
        argv += ["--bindmount", "/dev/null", "--bindmount_ro", "/dev/urandom",
                 "--pass_fd", str(control_fd)]  # fmt: skip
        for name in ("harness_py.py", "template_py.py", "harness_py.pyc"):
            if (sb._dir / name).is_file():
                argv += ["--bindmount_ro", f"{sb._dir / name}:/sandbox/{name}"]
        for item in env:
            argv += ["--env", item]
        mode = "bytecode" if sb.python_bytecode else "source"
        tail = [str(control_fd), "/sandbox/harness_py.py", mode]
        if self.kind.env_dir is not None:
            argv += ["--bindmount_ro", f"{self.kind.env_dir}:/env"]
            tail.append("/env")
        argv += ["--", runtime.executable, "-I", "-S", "-B", "-u",
                 "/sandbox/template_py.py", *tail]  # fmt: skip
        return argv

    async def _start(self) -> _Instance:
        loop = asyncio.get_running_loop()
        if self.kind.env_dir is not None:
            found = await asyncio.to_thread(unsafe_entry, self.kind.env_dir)
            if found is not None:
                raise TemplateUnavailable(
                    f"the package env holds a FIFO, socket or device ({found}): no template"
                )
        uid, uid_lock = self.sandbox.uids.lease()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log_r, log_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        control_fd = theirs.detach()

        def release() -> None:
            ours.close()
            os.close(log_r)
            uid_lock.close()

        try:
            argv = self.command(uid, control_fd, log_w)
        except BaseException:
            for fd in (control_fd, log_w, devnull):
                os.close(fd)
            release()
            raise
        proc = await spawn(argv, devnull, log_w, (control_fd, log_w), release)
        log = _Capped(MAX_JAIL_LOG_BYTES)
        await loop.connect_read_pipe(functools.partial(_same, log), os.fdopen(log_r, "rb", 0))
        ours.setblocking(False)
        inst = _Instance(proc, ours, log, uid_lock)
        uid_lock.watch(proc)
        loop.add_reader(ours.fileno(), self._on_control, inst)
        self._watch(inst)
        try:
            self.imported = (await asyncio.wait_for(
                asyncio.shield(inst.ready), TEMPLATE_START_TIMEOUT_S
            )).split(",")  # fmt: skip
            inst.view = TemplateView.read(proc._popen.pid)
        except BaseException:
            await self._stop(inst)
            raise
        self.starts += 1
        return inst

    def _watch(self, inst: _Instance) -> None:
        async def watch() -> None:
            await inst.proc.wait()
            self._died(inst)

        task = asyncio.ensure_future(watch())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _died(self, inst: _Instance) -> None:
        if inst.dead:
            return
        inst.dead = True
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(inst.control.fileno())
        inst.control.close()
        why = inst.log.value.decode("utf-8", "replace").strip().splitlines()
        reason = f"the Python template exited ({why[-1] if why else 'no message'})"
        if not inst.ready.done():
            inst.ready.set_exception(TemplateUnavailable(reason))
        for call in inst.calls.values():
            if not call.forked.done():
                call.forked.set_exception(TemplateUnavailable(reason))
            if call.child is not None:
                call.child.template_died()
        inst.calls.clear()
        inst.uid_lock.close()
        if self._current is inst:
            self._current = None
        self._old.discard(inst)

    def _on_control(self, inst: _Instance) -> None:
        while True:
            fds: list[int] = []
            try:
                data, anc, _, _ = inst.control.recvmsg(
                    TEMPLATE_MESSAGE_BYTES, socket.CMSG_SPACE(4 * 4)
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, anc = b"", []
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    whole = len(payload) - len(payload) % 4
                    fds += memoryview(payload[:whole]).cast("i").tolist()
            try:
                self._message(inst, data, fds)
            finally:
                for fd in fds:  # what no call took
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if not data:
                return

    def _message(self, inst: _Instance, data: bytes, fds: list[int]) -> None:
        if not data:
            asyncio.get_running_loop().remove_reader(inst.control.fileno())
            return  # its exit is seen through its process
        text = data.decode("utf-8", "replace")
        kind, _, rest = text.partition(" ")
        if kind == "R":
            if not inst.ready.done():
                inst.ready.set_result(rest)
            return
        if kind == "!":
            if not inst.ready.done():
                refused = TemplateUnavailable(f"the Python template refused: {rest}")
                inst.ready.set_exception(refused)
            return
        ident, _, value = rest.partition(" ")
        call = inst.calls.get(int(ident)) if ident.isdigit() else None
        if call is None:
            return
        if kind == "F" and not call.forked.done() and value.isdigit() and len(fds) == 1:
            call.inner_pid = int(value)
            call.forked.set_result((int(value), fds.pop()))
        elif kind == "E" and not call.forked.done():
            call.forked.set_exception(TemplateUnavailable(f"the template could not fork: {value}"))
            inst.calls.pop(int(ident), None)
        elif kind == "X" and value.lstrip("-").isdigit():
            inst.calls.pop(int(ident), None)
            if call.host_pid is not None:
                inst.live.pop(call.host_pid, None)
            if call.child is not None:
                call.child.reported(int(value))
            else:
                call.status = int(value)
            if inst.retired and not inst.calls:
                self._background(self._stop(inst))

    async def _instance(self) -> _Instance:
        """The template to fork from: started when there is none (or it died), replaced
        when it is due for recycling."""
        inst = self._current
        if inst is not None and not inst.dead:
            due = inst.forks >= self.max_forks or time.monotonic() - inst.started >= self.max_age_s
            if not due:
                return inst
            self._retire(inst)
        if self._failed is not None and time.monotonic() - self._failed[0] < TEMPLATE_RETRY_S:
            # A template that would not start (a refusal, a broken package set) is not
            # started again for every call: the calls go to fresh jails meanwhile.
            raise TemplateUnavailable(self._failed[1])
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        starting = self._starting
        try:
            inst = await asyncio.shield(starting)
        except TemplateUnavailable as exc:
            self._failed = (time.monotonic(), str(exc))
            raise
        finally:
            if self._starting is starting and starting.done():
                self._starting = None
        self._failed = None
        self._current = inst
        return inst

    def _retire(self, inst: _Instance) -> None:
        if self._current is inst:
            self._current = None
        inst.retired = True
        self._old.add(inst)
        if not inst.calls:
            self._background(self._stop(inst))

    async def _stop(self, inst: _Instance) -> None:
        """Stop a template (and so its children): the end of its control socket tells it
        to exit (nsjail then reaps it, so its CPU shows in the daemon's rusage), SIGKILL
        to its nsjail if it has not within TEMPLATE_STOP_WAIT_S."""
        proc = inst.proc
        if not inst.dead:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(inst.control.fileno())
            with contextlib.suppress(OSError):
                inst.control.shutdown(socket.SHUT_RDWR)
        try:
            await asyncio.wait_for(proc.wait(), TEMPLATE_STOP_WAIT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        self._died(inst)

    def _background(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def abandon(self) -> None:
        """Kill every template of this kind now, outside any event loop (the loop that
        started them is gone): their children die with them; each is reaped here."""
        for inst in [self._current, *self._old]:
            if inst is None or inst.dead:
                continue
            inst.dead = True
            inst.proc._popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                inst.proc._popen.wait(TEMPLATE_STOP_WAIT_S)
            inst.control.close()
            inst.uid_lock.close()
        self._current = None
        self._old.clear()

    async def close(self) -> None:
        """Stop every template of this kind (their children die with them)."""
        for inst in [self._current, *self._old]:
            if inst is not None and not inst.dead:
                await self._stop(inst)
        self._current = None
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=TEMPLATE_STOP_WAIT_S)

    # --- one call --------------------------------------------------------------------------
    async def fork(
        self, uid: int, uid_lock: UidLock, wall_s: int, *, egress: bool = False
    ) -> TemplateJail:
        """A child for one call, as outside ``uid`` (held by ``uid_lock``, which the caller
        closes once the child is reaped: ``TemplateJail.alive`` is False), with the
        sandbox's limits and a backstop of ``wall_s`` CPU seconds; verified, in its own
        cgroups, waiting for its request. Raises TemplateUnavailable when the template
        cannot fork it or the child fails verification (the caller falls back on a fresh
        nsjail); nothing of the call has reached any process then."""
        sb, lim = self.sandbox, self.sandbox.limits
        inst = await self._instance()
        loop = asyncio.get_running_loop()
        call_id = next(self._ids)
        call = _Call(loop.create_future())
        address_space = lim.memory_mb * 2 if sb.cgroups.enabled else lim.memory_mb
        message = (
            f"C {call_id} {inside_uid(uid, sb.uids.base)} {address_space} {wall_s + 1} "
            f"{lim.file_mb} {lim.open_files} {lim.pids} {lim.tmp_mb} {int(egress)}"
        )
        ours: list[int] = []
        cgroup: _Cgroup | None = None
        try:
            inst.calls[call_id] = call
            inst.forks += 1
            asked = boot_ticks()
            try:
                inst.control.send(message.encode())
            except OSError as exc:
                raise TemplateUnavailable(f"the Python template is not listening: {exc}") from exc
            inner_pid, ready_fd = await asyncio.wait_for(
                asyncio.shield(call.forked), TEMPLATE_FORK_TIMEOUT_S
            )
            call.ready_taken = True
            ready = await asyncio.wait_for(_read_to_end(ready_fd), TEMPLATE_FORK_TIMEOUT_S)
            if ready != b"R":
                text = ready[1:].decode("utf-8", "replace") if ready else "no word"
                raise TemplateUnavailable(f"the template's child could not set up: {text}")
            child, ns = self._verified(inst, call, inner_pid, asked, uid, ours)
            cgroup = _Cgroup(sb, f"NSJAIL.T{call.host_pid}")
            cgroup.enter(child.host_pid)
            stdin_w, logs_r, result_r = ours
            os.write(stdin_w, _GO)
            inst.live[child.host_pid] = (ns, child)
            result = _Reply(lim.output_bytes + REPLY_FRAME_BYTES)
            logs = _Capped(lim.log_bytes)
            for fd, sink in ((result_r, result), (logs_r, logs)):
                await loop.connect_read_pipe(functools.partial(_same, sink), os.fdopen(fd, "rb", 0))
                ours.remove(fd)
            stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(stdin_w, "wb", 0))
            ours.clear()
        except BaseException:
            for fd in ours:
                with contextlib.suppress(OSError):
                    os.close(fd)
            await self._abandon(inst, call_id, call, cgroup)
            raise
        jail_log = _Capped(0)
        jail_log.connection_lost(None)
        jail = TemplateJail(child, uid, uid_lock, stdin, result, jail_log, logs, child.host_pid)
        if cgroup is not None:
            done = cgroup
            child._exited.add_done_callback(lambda _: done.remove())
        return jail

    def _verified(
        self, inst: _Instance, call: _Call, inner_pid: int, asked: int, uid: int, ours: list[int]
    ) -> tuple[_ChildProcess, dict[str, str]]:
        """Find the child in /proc, take its ends of the pipes (into ``ours``: request,
        logs, result) and verify it. A child that fails is killed (by the caller's
        ``_abandon``), its template recycled and the template's kind kept on fresh
        nsjails for TEMPLATE_RETRY_S; the first such failure of a kind is logged."""
        view = inst.view
        assert view is not None
        began = time.perf_counter()
        try:
            host_pid, status = find_child(view, inner_pid)
            call.host_pid = host_pid
            pidfd = os.pidfd_open(host_pid)
            child = _ChildProcess(pidfd, host_pid, asyncio.get_running_loop())
            call.child = child
            if call.status is not None:
                child.reported(call.status)
            elif inst.dead:
                child.template_died()
            if child.returncode is not None:
                raise TemplateUnavailable("the template's child died before its call")
            for name in ("request", "logs", "result"):
                ours.append(pidfd_getfd(pidfd, _DAEMON_FDS[name]))
            inodes = dict(zip(("request", "logs", "result"), (os.fstat(fd).st_ino for fd in ours),
                              strict=True))  # fmt: skip
            fds = {fd: inodes[name] for name, numbers in _CHILD_FDS.items() for fd in numbers}
            fds.update({fd: inodes[name] for name, fd in _DAEMON_FDS.items()})
            found, pending, unreported = inst.known()
            ns = verify(
                host_pid, status, template=view, asked_ticks=asked, uid=uid, fds=fds,
                siblings=_alive(inst.live), known=found, pending=pending,
                unreported=unreported,
            )  # fmt: skip
            if select.select([pidfd], [], [], 0)[0]:  # checked a recycled pid, not the child
                raise TemplateUnavailable("the template's child exited while it was checked")
            self.check_s += time.perf_counter() - began
            self.checks += 1
        except (TemplateUnavailable, OSError) as exc:
            reason = str(exc)
            if not self._rejected:
                log.warning(
                    "Python template of %s: %s; its calls run in fresh nsjails for %.0f s",
                    self.kind.env_dir or "the standard library",
                    reason,
                    TEMPLATE_RETRY_S,
                )
            self._rejected = True
            self._failed = (time.monotonic(), reason)
            self._retire(inst)
            raise TemplateUnavailable(reason) from exc
        return child, ns

    async def _abandon(
        self, inst: _Instance, call_id: int, call: _Call, cgroup: _Cgroup | None
    ) -> None:
        """A fork that failed half-way: its child (if any) is killed and reaped before
        this returns, so the call's uid can go back."""
        child = call.child
        if child is not None:
            child.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(child.wait(), TEMPLATE_STOP_WAIT_S)
        elif call.forked.done() and not call.forked.cancelled() and call.forked.exception() is None:
            # Forked, but not found or not ready: a template that cannot set up a child is
            # not trusted with the next one either. It is retired, not killed: the calls
            # its other children serve end as they would (it stops once they have, and
            # this child, if it lives, with it; its uid is looked for before its next lease).
            inst.calls.pop(call_id, None)
            self._retire(inst)
        if cgroup is not None:
            cgroup.remove()
        if not call.forked.done():
            call.forked.cancel()
        elif not call.ready_taken and not call.forked.cancelled() and not call.forked.exception():
            with contextlib.suppress(OSError):
                os.close(call.forked.result()[1])
        if inst.dead or child is None:
            inst.calls.pop(call_id, None)


def _alive(children: dict[int, tuple[dict[str, str], _ChildProcess]]) -> dict[int, dict[str, str]]:
    """The namespaces of those ``children`` that have not been reaped, by host pid."""
    return {pid: ns for pid, (ns, kid) in children.items() if kid._pidfd >= 0}


async def _read_to_end(fd: int) -> bytes:
    """Read ``fd`` (a pipe's read end, ours: closed here) to its end, in the event loop."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    ended: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            while True:
                data = os.read(fd, TEMPLATE_MESSAGE_BYTES)
                if not data:
                    break
                chunks.append(data)
                if sum(map(len, chunks)) > TEMPLATE_MESSAGE_BYTES:
                    break
        except BlockingIOError:
            return
        except OSError as exc:
            if not ended.done():
                ended.set_exception(exc)
            return
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return b"".join(chunks)
