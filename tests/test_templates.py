"""Python templates (run/templates.py, sandbox/template_py.py): every call a fresh sandbox
forked from a prepared interpreter, as hostile to the template and its siblings as to
the host. Real nsjail; the calls go through Sandbox.run, its jails forked from a
template (the wiring proposed for Sandbox._start)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from runnerd.run.jail import JailKind, Job, Outcome, Sandbox
from runnerd.run.machine import Machine, build_sandbox
from runnerd.run.templates import Template, TemplateJail, TemplateUnavailable, inside_uid
from runnerd.run.uids import _processes_of

pytestmark = pytest.mark.jail


class Forked:
    """A Sandbox of the test machine whose Python jails come from one Template."""

    def __init__(self, machine: Machine, env_dir: Path | None = None, **template: Any) -> None:
        self.sandbox: Sandbox = build_sandbox(
            machine.settings, runtimes=machine.runtimes, cgroups=machine.cgroups,
            harness_dir=machine.sandbox._dir,
        )  # fmt: skip
        self.template = Template(self.sandbox, JailKind("python", env_dir), **template)
        self.env_dir = env_dir
        self.jails: list[TemplateJail] = []
        self.on_fork: Callable[[TemplateJail], None] | None = None

        async def start(kind: JailKind, wall_s: int, *, waiting: bool = False) -> TemplateJail:
            uid, lock = self.sandbox.uids.lease()
            try:
                jail = await self.template.fork(uid, lock, wall_s)
            except BaseException:
                lock.close()
                raise
            self.jails.append(jail)
            if self.on_fork is not None:
                self.on_fork(jail)
            return jail

        self.sandbox._start = start  # type: ignore[method-assign]

    async def run(self, code: str, value: Any = None, *, timeout_ms: int = 10_000) -> Outcome:
        request = json.dumps({"code": code, "file": "/tool/t.py", "input": value}).encode()
        return await self.sandbox.run(Job("python", timeout_ms, request, env_dir=self.env_dir))

    async def output(self, code: str, value: Any = None) -> Any:
        out = await self.run(code, value)
        reply = json.loads(out.result or b"null")
        assert reply and reply["ok"], (out, reply)
        return reply["output"]


@asynccontextmanager
async def forked(machine: Machine, env_dir: Path | None = None, **kw: Any) -> AsyncIterator[Forked]:
    runner = Forked(machine, env_dir, **kw)
    try:
        yield runner
    finally:
        await runner.template.close()


_ENVS: list[Path] = []


@pytest.fixture(autouse=True, scope="module")
def _remove_envs() -> Iterator[None]:
    yield
    for root in _ENVS:
        shutil.rmtree(root, ignore_errors=True)


def env_with(files: dict[str, str]) -> Path:
    """A package env, as a package set's folder looks (dist-info and modules), where
    jails can mount it (not under pytest's 0700 tmp folder); removed after the module."""
    root = Path(tempfile.mkdtemp(prefix="runnerd-tpl-env-", dir="/tmp"))
    _ENVS.append(root)
    root.chmod(0o755)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder, _, names in os.walk(root):
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o644)
    return root


TRIVIAL = "def run(input):\n    print('hello', input['n'])\n    return {'n': input['n'] + 1}\n"


def test_a_trivial_call_replies_as_a_fresh_jail_does(machine: Machine) -> None:
    async def scenario() -> tuple[Outcome, Outcome]:
        async with forked(machine) as runner:
            forked_out = await runner.run(TRIVIAL, {"n": 41})
        request = json.dumps({"code": TRIVIAL, "file": "/tool/t.py", "input": {"n": 41}})
        fresh = await machine.sandbox.run(Job("python", 10_000, request.encode()))
        return forked_out, fresh

    forked_out, fresh = asyncio.run(scenario())
    assert forked_out.result == fresh.result == b'{"ok":true,"output":{"n":42}}'
    assert forked_out.logs == fresh.logs == b"hello 41\n"
    assert forked_out.exit_code == fresh.exit_code == 0
    assert not forked_out.timed_out and not forked_out.result_too_large
    assert forked_out.jail_log == ""


def test_an_error_and_its_stack_come_back_as_from_a_fresh_jail(machine: Machine) -> None:
    code = "def run(input):\n    raise ValueError('nope')\n"

    async def scenario() -> Any:
        async with forked(machine) as runner:
            return json.loads((await runner.run(code, {})).result or b"null")

    reply = asyncio.run(scenario())
    assert reply["ok"] is False and reply["type"] == "ValueError" and reply["message"] == "nope"
    assert "/tool/t.py:2" in reply["stack"]


WHO = """
import os, socket
def run(input):
    return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
            "groups": os.getgroups(), "pid": os.getpid(), "ppid": os.getppid(),
            "host": socket.gethostname(), "root": sorted(os.listdir("/")),
            "cwd": os.getcwd(), "env": dict(os.environ)}
"""


def test_a_child_runs_as_its_calls_leased_uid_in_its_own_cgroups(machine: Machine) -> None:
    seen: dict[str, Any] = {}

    def look(jail: TemplateJail) -> None:
        # Before the request: the host sees the child as the call's outside uid, in the
        # call's own cgroups.
        status = Path(f"/proc/{jail.host_pid}/status").read_text()
        seen["uids"] = re.search(r"^Uid:\s+(.*)$", status, re.M).group(1).split()  # type: ignore[union-attr]
        seen["cgroup"] = Path(f"/proc/{jail.host_pid}/cgroup").read_text()

    async def scenario() -> tuple[Any, TemplateJail, int]:
        async with forked(machine) as runner:
            runner.on_fork = look
            out = await runner.output(WHO)
            return out, runner.jails[0], runner.sandbox.uids.base

    out, jail, base = asyncio.run(scenario())
    assert seen["uids"] == [str(jail.uid)] * 4
    if machine.cgroups.enabled:
        assert f"NSJAIL.T{jail.host_pid}" in seen["cgroup"]
    # Inside: u - base + 1 (one user namespace for the template and all its children).
    assert out["uid"] == out["euid"] == out["gid"] == inside_uid(jail.uid, base)
    assert out["groups"] == []
    assert out["pid"] == 1 and out["ppid"] == 0
    assert out["host"] == "runnerd"
    assert out["cwd"] == "/tmp"
    assert out["env"] == {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    assert set(out["root"]) <= {"usr", "lib", "lib64", "dev", "sandbox", "tmp", "env"}
    assert not jail.alive and jail.proc.returncode == 0


SIGNALS = """
import os, signal
def run(input):
    found = []
    for pid in range(0, 400):
        try:
            os.kill(pid, 0)
            found.append(pid)
        except ProcessLookupError:
            pass
        except PermissionError:
            found.append(-pid)
    killed = []
    for pid in (2, 3, 4, input["sibling"], input["template"]):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError as exc:
            pass
    return {"found": found, "killed": killed}
"""
SLEEPER = "import time\ndef run(input):\n    time.sleep(input)\n    return 'slept'\n"


def test_a_child_cannot_see_or_signal_the_template_or_a_sibling(machine: Machine) -> None:
    async def scenario() -> tuple[Any, Outcome, Any]:
        async with forked(machine) as runner:
            sibling = asyncio.ensure_future(runner.run(SLEEPER, 1.5))
            while not runner.jails:
                await asyncio.sleep(0.01)
            inst = runner.template._current
            assert inst is not None
            attack = await runner.output(SIGNALS, {"sibling": runner.jails[0].host_pid,
                                                   "template": inst.proc._popen.pid})  # fmt: skip
            return attack, await sibling, await runner.output(TRIVIAL, {"n": 1})

    attack, sibling, after = asyncio.run(scenario())
    assert attack["found"] == [0, 1]  # 0: its own process group; 1: itself
    assert attack["killed"] == []
    assert sibling.result == b'{"ok":true,"output":"slept"}'
    assert after == {"n": 2}


SYSCALLS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    return 0 if r == 0 else ctypes.get_errno()
def run(input):
    return {
        "ptrace_traceme": call(101, 0, 0, 0, 0),
        "unshare_user": call(272, 0x10000000),
        "unshare_ns": call(272, 0x20000),
        "setns": call(308, 0, 0),
        "mount": call(165, 0, 0, 0, 0, 0),
        "umount2": call(166, 0, 0),
        "pivot_root": call(155, 0, 0),
        "chroot": call(161, 0),
        "open_tree": call(428, -100, 0, 1),
        "fsopen": call(430, 0, 0),
        "clone_newuser": call(56, 0x10000000 | 17, 0, 0, 0, 0),
        "clone_high_bits": call(56, (1 << 40) | 17, 0, 0, 0, 0),
        "clone3": call(435, 0, 0),
        "bpf": call(321, 0, 0, 0),
        "setuid0": call(105, 0),
        "no_new_privs": libc.prctl(39, 0, 0, 0, 0),
    }
"""


def test_a_child_cannot_ptrace_unshare_mount_or_setns(machine: Machine) -> None:
    async def scenario() -> Any:
        async with forked(machine) as runner:
            return await runner.output(SYSCALLS)

    out = asyncio.run(scenario())
    eperm, enosys = 1, 38
    for name in ("ptrace_traceme", "unshare_user", "unshare_ns", "setns", "mount", "umount2",
                 "pivot_root", "chroot", "open_tree", "fsopen", "clone_newuser",
                 "clone_high_bits", "bpf", "setuid0"):  # fmt: skip
        assert out[name] == eperm, (name, out[name])
    assert out["clone3"] == enosys
    assert out["no_new_privs"] == 1


MARK = """
import ctypes, os, sys, builtins
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT, KEY = 0o1000, 0x2727
def run(input):
    seen = {
        "global": getattr(builtins, "runnerd_marker", None),
        "module": getattr(sys, "runnerd_marker", None),
        "tmp": os.path.exists("/tmp/marker"),
        "shm": libc.shmget(KEY, 4096, 0o600),
    }
    if input == "write":
        builtins.runnerd_marker = sys.runnerd_marker = "seen"
        with open("/tmp/marker", "w") as f:
            f.write("seen")
        shm = libc.shmget(KEY, 4096, IPC_CREAT | 0o666)
        seen["made_shm"] = shm
        try:
            os.makedirs("/dev/shm", exist_ok=True)
            seen["dev_shm"] = "writable"
        except OSError as exc:
            seen["dev_shm"] = exc.errno
    return seen
"""


def test_nothing_a_child_writes_is_seen_by_the_next(machine: Machine) -> None:
    async def scenario() -> tuple[Any, Any]:
        async with forked(machine) as runner:
            return await runner.output(MARK, "write"), await runner.output(MARK, "look")

    first, second = asyncio.run(scenario())
    assert first["made_shm"] >= 0  # it had a SysV segment of its own ipc namespace
    assert first["dev_shm"] != "writable"
    assert second == {"global": None, "module": None, "tmp": False, "shm": -1}


FORK_BOMB = """
import os, time
def run(input):
    made = 0
    while made < 10000:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        made += 1
    return made
"""


def test_a_fork_bomb_in_a_child_leaves_the_template_forking(machine: Machine) -> None:
    async def scenario() -> tuple[Any, Any, int]:
        async with forked(machine) as runner:
            made = await runner.output(FORK_BOMB)
            jail = runner.jails[0]
            after = await runner.output(TRIVIAL, {"n": 1})
            return made, after, jail.uid

    made, after, uid = asyncio.run(scenario())
    assert made < machine.settings.pids
    assert after == {"n": 2}
    assert _processes_of(uid) == []


DAEMON = """
import os, time
def run(input):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
    return "forked"
"""


def test_a_double_forked_daemon_dies_with_its_call(machine: Machine) -> None:
    async def scenario() -> tuple[Any, TemplateJail]:
        async with forked(machine) as runner:
            out = await runner.output(DAEMON)
            jail = runner.jails[0]
            assert not jail.alive  # Sandbox.run waited for the child's end (logs)
            return out, jail

    out, jail = asyncio.run(scenario())
    assert out == "forked"
    assert _processes_of(jail.uid) == []


def test_a_tool_sees_the_package_set_imported_and_its_env_read_only(machine: Machine) -> None:
    env = env_with({
        "tplpkg/__init__.py": "LOADED = True\n",
        "tplpkg-1.0.dist-info/top_level.txt": "tplpkg\n",
        "tplpkg-1.0.dist-info/METADATA": "Name: tplpkg\nVersion: 1.0\n",
    })  # fmt: skip
    code = (
        "import os, sys\ndef run(input):\n    pre = 'tplpkg' in sys.modules\n"
        "    import tplpkg\n    try:\n        open('/env/x', 'w')\n        wrote = True\n"
        "    except OSError as exc:\n        wrote = exc.errno\n"
        "    return {'pre': pre, 'loaded': tplpkg.LOADED, 'wrote': wrote,\n"
        "            'w_ok': os.access('/env', os.W_OK), 'path0': sys.path[0]}\n"
    )

    async def scenario() -> tuple[Any, list[str]]:
        async with forked(machine, env) as runner:
            return await runner.output(code), runner.template.imported

    out, imported = asyncio.run(scenario())
    assert imported == ["tplpkg"]
    assert out["pre"] is True and out["loaded"] is True
    assert out["wrote"] == 30  # EROFS
    assert out["w_ok"] is False
    assert out["path0"] == "/env"


FDS = """
import os, stat
def run(input):
    open_fds = {}
    for fd in range(0, 1024):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        kind = "socket" if stat.S_ISSOCK(mode) else oct(mode)
        open_fds[fd] = "pipe" if stat.S_ISFIFO(mode) else kind
    return open_fds
"""


def test_only_its_own_pipes_are_open_in_a_child(machine: Machine) -> None:
    async def scenario() -> Any:
        async with forked(machine) as runner:
            return await runner.output(FDS)

    # 0: the request, 1 and 2: the logs, 3: the result; no control socket, no pidfd,
    # no hello socket, nothing of the template's.
    assert asyncio.run(scenario()) == {"0": "pipe", "1": "pipe", "2": "pipe", "3": "pipe"}


RANDOM = (
    "import os, random\ndef run(input):\n"
    "    return [random.random(), os.urandom(8).hex(), random.getrandbits(64)]\n"
)


def test_two_children_get_different_random_state(machine: Machine) -> None:
    async def scenario() -> list[Any]:
        async with forked(machine) as runner:
            return [await runner.output(RANDOM) for _ in range(3)]

    seen = asyncio.run(scenario())
    for i in range(3):
        assert len({tuple(x)[i] for x in map(tuple, seen)}) == 3


def test_a_killed_template_is_replaced_and_the_next_call_works(machine: Machine) -> None:
    async def scenario() -> tuple[Any, Any, int]:
        async with forked(machine) as runner:
            first = await runner.output(TRIVIAL, {"n": 1})
            inst = runner.template._current
            assert inst is not None
            os.kill(inst.proc._popen.pid, signal.SIGKILL)  # its nsjail: the template goes too
            await inst.proc.wait()
            await asyncio.sleep(0.05)
            second = await runner.output(TRIVIAL, {"n": 2})
            return first, second, runner.template.starts

    first, second, starts = asyncio.run(scenario())
    assert (first, second) == ({"n": 2}, {"n": 3})
    assert starts == 2


def test_a_call_being_served_when_its_template_dies_ends_killed(machine: Machine) -> None:
    async def scenario() -> Outcome:
        async with forked(machine) as runner:
            call = asyncio.ensure_future(runner.run(SLEEPER, 5))
            while not runner.jails:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            inst = runner.template._current
            assert inst is not None
            os.kill(inst.proc._popen.pid, signal.SIGKILL)
            return await call

    began = time.monotonic()
    out = asyncio.run(scenario())
    assert time.monotonic() - began < 3
    assert out.result is None and out.exit_code == 137 and not out.timed_out


def test_a_template_is_recycled_after_its_forks(machine: Machine) -> None:
    async def scenario() -> tuple[list[Any], int]:
        async with forked(machine, max_forks=2) as runner:
            outs = [await runner.output(TRIVIAL, {"n": n}) for n in range(5)]
            return outs, runner.template.starts

    outs, starts = asyncio.run(scenario())
    assert outs == [{"n": n + 1} for n in range(5)]
    assert starts == 3


def test_a_timeout_kills_the_child_and_gives_its_uid_back(machine: Machine) -> None:
    async def scenario() -> tuple[Outcome, TemplateJail, Any]:
        async with forked(machine) as runner:
            out = await runner.run(SLEEPER, 30, timeout_ms=300)
            return out, runner.jails[0], await runner.output(TRIVIAL, {"n": 1})

    out, jail, after = asyncio.run(scenario())
    assert out.timed_out and out.exit_code == 137
    assert jail.uid_lock.closed
    assert _processes_of(jail.uid) == []
    assert after == {"n": 2}


THREADED = {
    "threaded/__init__.py": "import threading, time\n"
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
    "threaded-1.0.dist-info/top_level.txt": "threaded\n",
}


def test_a_template_whose_imports_leave_a_thread_refuses_to_fork(machine: Machine) -> None:
    env = env_with(THREADED)

    async def scenario() -> str:
        async with forked(machine, env) as runner:
            uid, lock = runner.sandbox.uids.lease()
            with pytest.raises(TemplateUnavailable) as refused:
                await runner.template.fork(uid, lock, 10)
            lock.close()
            return str(refused.value)

    assert "single-threaded" in asyncio.run(scenario())


def test_the_template_policy_is_the_tool_policy_less_what_forking_needs() -> None:
    here = Path(__file__).resolve().parent.parent / "sandbox"

    def denied(path: Path) -> set[str]:
        text = re.sub(r"//[^\n]*", "", path.read_text())
        body = text.split("ERRNO(1) {", 1)[1].split("personality", 1)[0]
        return {name.strip() for name in body.split(",") if name.strip()}

    tool, template = denied(here / "seccomp.kafel"), denied(here / "template.kafel")
    forking = {"clone { (clone_flags & CLONE_NAMESPACES) != 0 }", "unshare", "setns", "mount",
               "umount", "pivot_root"}  # fmt: skip
    assert template == tool - forking


def test_a_template_that_will_not_start_fails_the_next_forks_fast(machine: Machine) -> None:
    env = env_with(THREADED)

    async def scenario() -> tuple[float, int]:
        async with forked(machine, env) as runner:
            uid, lock = runner.sandbox.uids.lease()
            with pytest.raises(TemplateUnavailable):
                await runner.template.fork(uid, lock, 10)
            began = time.monotonic()
            with pytest.raises(TemplateUnavailable, match="single-threaded"):
                await runner.template.fork(uid, lock, 10)
            lock.close()
            return time.monotonic() - began, runner.template.starts

    waited, starts = asyncio.run(scenario())
    assert waited < 0.05 and starts == 0


# What a package's import code can do in the template it is imported in: keep a copy of
# each call's request pipe as the template passes it on, and copy the request out of it
# (tee: the child still gets it) while the child is slowed by a patched stdin. A later
# call of the same template then finds the earlier call's code, input and secrets in the
# memory it inherits.
EVIL = r"""
import ctypes, os, select, selectors, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)
STOLEN = []
_kept = []
_recvmsg = socket.socket.recvmsg
def recvmsg(self, *args):
    data, anc, flags, addr = _recvmsg(self, *args)
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            _kept.append(os.dup(memoryview(payload).cast("i")[0]))
    return data, anc, flags, addr
socket.socket.recvmsg = recvmsg
_select = selectors.EpollSelector.select
def watching(self, timeout=None):
    while _kept:
        fd = _kept.pop()
        if select.select([fd], [], [], 1.0)[0]:
            r, w = os.pipe()
            n = libc.tee(fd, w, 1 << 16, 0)
            os.close(w)
            STOLEN.append(os.read(r, max(n, 0)).decode("utf-8", "replace"))
            os.close(r)
        os.close(fd)
    return _select(self, timeout)
selectors.EpollSelector.select = watching
class _Slow:
    def read(self):
        time.sleep(0.1)
        chunks = []
        while True:
            b = os.read(0, 65536)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
class _Stdin:
    buffer = _Slow()
sys.stdin = _Stdin()
"""


def test_a_package_imported_by_the_template_cannot_read_another_calls_request(
    machine: Machine,
) -> None:
    env = env_with(
        {"evilpkg/__init__.py": EVIL, "evilpkg-1.0.dist-info/top_level.txt": "evilpkg\n"}
    )
    victim = "def run(input):\n    return 'ok'\n"
    thief = "import sys\ndef run(input):\n    return sys.modules['evilpkg'].STOLEN\n"

    async def scenario() -> tuple[Any, Any]:
        async with forked(machine, env) as runner:
            first = await runner.output(victim, {"secret": "s3cr3t-of-the-first-call"})
            return first, await runner.output(thief)

    first, stolen = asyncio.run(scenario())
    assert first == "ok"
    assert not any("s3cr3t-of-the-first-call" in text for text in stolen), stolen


EGRESS_VIEW = (
    "import os, stat\ndef run(input):\n"
    "    try:\n        return stat.S_ISSOCK(os.stat('/run/egress.sock').st_mode)\n"
    "    except OSError as exc:\n        return exc.errno\n"
)


def test_only_a_call_with_a_grant_sees_the_egress_socket(machine: Machine) -> None:
    """The template of an egress kind has the proxy's socket; a child binds it into its
    own root only when its call has a grant."""

    async def scenario() -> tuple[Any, Any]:
        runner = Forked(machine)
        assert runner.sandbox.proxy is not None
        await runner.sandbox.proxy.ensure_started()
        runner.template = Template(runner.sandbox, JailKind("python", None, egress=True))
        seen = []
        try:
            for grant in (True, False):
                uid, lock = runner.sandbox.uids.lease()
                jail = await runner.template.fork(uid, lock, 10, egress=grant)
                request = {"code": EGRESS_VIEW, "file": "/tool/t.py", "input": None}
                jail.stdin.write(json.dumps(request).encode())
                jail.stdin.close()
                await jail.proc.wait()
                await jail.result.done
                seen.append(json.loads(jail.result.value)["output"])
                lock.close()
        finally:
            await runner.template.close()
            await runner.sandbox.proxy.close()
        return seen[0], seen[1]

    with_grant, without = asyncio.run(scenario())
    assert with_grant is True
    assert without == 2  # ENOENT: no /run at all


# --- templates that a package's import code turned against their children ------------------
# Each package below sets up, at import in the template, a channel a child could inherit;
# the daemon's checks from /proc (run/template_check.py) must reject every child of it,
# and the call must still succeed, on a fresh nsjail.


@asynccontextmanager
async def package_sandbox(machine: Machine) -> AsyncIterator[Sandbox]:
    """A Sandbox of the test machine with package templates on (as Sandbox.run uses them)."""
    sandbox = build_sandbox(
        machine.settings, runtimes=machine.runtimes, cgroups=machine.cgroups,
        harness_dir=machine.sandbox._dir,
    )  # fmt: skip
    sandbox.limits = dataclasses.replace(sandbox.limits, python_templates=True,
                                         package_templates=True)  # fmt: skip
    try:
        yield sandbox
    finally:
        await sandbox.close()


# Keep the template's descriptors ``KEEP`` open in its children: a child's closerange
# spares them (the child runs the template's code, which the package can patch).
SPARE = r"""
import os
KEEP = set()
_closerange = os.closerange
def closerange(low, high):
    for fd in range(low, min(high, 1024)):
        if fd not in KEEP:
            try:
                os.close(fd)
            except OSError:
                pass
os.closerange = closerange
"""
HOSTILE = {
    "socketpair": SPARE + "import socket\na, b = socket.socketpair()\n"
    "KEEP.update((a.fileno(), b.fileno()))\n",
    "every_fd": "import os\nos.closerange = lambda low, high: None\n",
    "map_shared": "import mmap\nSHARED = mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED)\n",
    "memfd": SPARE + "import mmap, os\nFD = os.memfd_create('x')\nos.ftruncate(FD, 4096)\n"
    "KEEP.add(FD)\nMAP = mmap.mmap(FD, 4096)\n",
    "helper": "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)\n",
    "thread": "import threading, time\n"
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
}  # fmt: skip


@pytest.mark.parametrize("channel", list(HOSTILE))
def test_a_child_of_a_template_holding_a_channel_fails_verification_and_the_call_succeeds(
    machine: Machine, channel: str
) -> None:
    env = env_with({
        f"hostile_{channel}/__init__.py": HOSTILE[channel],
        f"hostile_{channel}-1.0.dist-info/top_level.txt": f"hostile_{channel}\n",
    })  # fmt: skip
    code = "import os\ndef run(input):\n    return {'uid': os.getuid(), 'pid': os.getpid()}\n"
    request = json.dumps({"code": code, "file": "/tool/t.py", "input": None}).encode()

    async def scenario() -> tuple[list[Outcome], Template]:
        async with package_sandbox(machine) as sandbox:
            outs = [await sandbox.run(Job("python", 10_000, request, env_dir=env))
                    for _ in range(2)]  # fmt: skip
            return outs, sandbox.templates[JailKind("python", env)]

    outs, template = asyncio.run(scenario())
    for out in outs:
        reply = json.loads(out.result or b"null")
        assert reply == {"ok": True, "output": {"uid": 1000, "pid": 1}}, out  # a fresh nsjail
    assert template._failed is not None
    why = template._failed[1]
    expected = {
        "socketpair": "descriptors", "every_fd": "descriptors", "map_shared": "shared",
        "memfd": "shared", "helper": "other children", "thread": "single-threaded",
    }[channel]  # fmt: skip
    assert expected in why, why


def test_a_package_env_holding_a_fifo_gets_no_template(machine: Machine) -> None:
    env = env_with({"fifopkg/__init__.py": "", "fifopkg-1.0.dist-info/top_level.txt": "fifopkg\n"})
    os.mkfifo(env / "fifopkg" / "pipe")
    code = "import os\ndef run(input):\n    return os.getuid()\n"
    request = json.dumps({"code": code, "file": "/tool/t.py", "input": None}).encode()

    async def scenario() -> tuple[Outcome, Template]:
        async with package_sandbox(machine) as sandbox:
            out = await sandbox.run(Job("python", 10_000, request, env_dir=env))
            return out, sandbox.templates[JailKind("python", env)]

    out, template = asyncio.run(scenario())
    assert json.loads(out.result or b"null") == {"ok": True, "output": 1000}
    assert template.starts == 0
    assert template._failed is not None and "fifopkg/pipe" in template._failed[1]


PROC = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("/tmp/p", exist_ok=True)
rc = libc.mount(b"proc", b"/tmp/p", b"proc", 0, None)
MOUNT_PROC = 0 if rc == 0 else ctypes.get_errno()
rc = libc.syscall(101, 16, 1, 0, 0)  # ptrace(PTRACE_ATTACH, 1)
PTRACE = 0 if rc == 0 else ctypes.get_errno()
"""


def test_a_package_in_a_template_can_neither_mount_proc_nor_ptrace(machine: Machine) -> None:
    """What keeps a template out of its children's memory: no /proc can be mounted (the
    kernel's rule for a user namespace without a visible one: nsjail mounts none), and
    its seccomp policy denies ptrace and process_vm_readv."""
    env = env_with(
        {"procpkg/__init__.py": PROC, "procpkg-1.0.dist-info/top_level.txt": "procpkg\n"}
    )
    code = "import procpkg\ndef run(input):\n    return [procpkg.MOUNT_PROC, procpkg.PTRACE]\n"

    async def scenario() -> Any:
        async with forked(machine, env) as runner:
            return await runner.output(code)

    mount_proc, ptrace = asyncio.run(scenario())
    assert mount_proc == 1 and ptrace == 1  # EPERM, EPERM


def test_concurrent_calls_all_pass_verification_on_one_template(machine: Machine) -> None:
    """Children forked while others fork, run and exit (the template's descriptor numbers
    climbing past the child's own, namespace numbers freed and reused, reports in
    flight): every child passes the checks, no call falls back, one template serves all."""
    request = json.dumps({"code": TRIVIAL, "file": "/tool/t.py", "input": {"n": 1}}).encode()

    async def scenario() -> tuple[list[Outcome], Template]:
        async with package_sandbox(machine) as sandbox:
            outs: list[Outcome] = []
            for _ in range(4):
                outs += await asyncio.gather(
                    *[sandbox.run(Job("python", 10_000, request), logs=False) for _ in range(10)]
                )
            return outs, sandbox.templates[JailKind("python", None)]

    outs, template = asyncio.run(scenario())
    assert [o.result for o in outs] == [b'{"ok":true,"output":{"n":2}}'] * 40
    assert template._failed is None and template.starts == 1
    assert template.checks == 40
