"""Hostile tools: each attack must fail, leave nothing running, and the next ordinary run
must still succeed. docs/SECURITY.md has the table of these cases and what stops each."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import machine_env, make_tool, run_cli, run_tool, tool_doc
from daemon import Daemon, HealthProbe
from egress_lab import HTTP_PORT, EgressLab, run_ok
from runnerd.limits import REPLY_GRACE_S, STOP_GRACE_S
from runnerd.run.machine import Machine
from runnerd.run.verdict import RunResult

ORDINARY = "def run(i):\n    return {'ok': True}\n"

# Calls a syscall through libc and reports errno; the jail has no compiler or shell.
SYSCALL = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    fn = getattr(libc, name)
    rc = fn(*args)
    return rc, ctypes.get_errno()
"""


def _jail_uids(machine: Machine) -> range:
    base = machine.settings.sandbox_uid_base
    return range(base - 1, base + machine.settings.sandbox_uid_count)


def _processes_of(uids: range) -> list[str]:
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) in uids:
                found.append(f"{status.parent.name}: {text.splitlines()[0]}")
    return found


def _templates(machine: Machine) -> set[str]:
    """The pids of the Python templates of ``machine`` (they live across runs, as their
    own uid; their children are runs, and counted)."""
    pids = set()
    for template in machine.sandbox.templates.values():
        for inst in (template._current, *template._old):
            if inst is not None and inst.view is not None and not inst.dead:
                pids.add(str(inst.view.pid))
    return pids


def _left(machine: Machine) -> list[str]:
    templates = _templates(machine)
    return [p for p in _processes_of(_jail_uids(machine)) if p.split(":")[0] not in templates]


@pytest.fixture
def contained(machine: Machine) -> Iterator[None]:
    """After the test: no process of a jail uid is left (a Python template aside), and
    an ordinary run succeeds."""
    yield
    deadline = time.monotonic() + 2
    while (left := _left(machine)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == [], f"processes outlived their run: {left}"
    result = run_tool(machine, make_tool(machine, ORDINARY, name="ordinary"))
    assert (result.status, result.output) == ("succeeded", {"ok": True}), result.error


def attack(
    machine: Machine,
    source: str,
    value: Any = None,
    *,
    ext: str = ".py",
    timeout_ms: int = 10_000,
    **kw: Any,
) -> RunResult:
    return run_tool(
        machine, make_tool(machine, source, ext=ext, timeout_ms=timeout_ms), value, **kw
    )


def report(machine: Machine, source: str, value: Any = None, **kw: Any) -> dict[str, Any]:
    """Run a hostile tool that reports what it managed; it must itself succeed."""
    result = attack(machine, source, value, **kw)
    assert result.status == "succeeded", result.error
    assert isinstance(result.output, dict)
    return result.output


READ = """
def run(i):
    try:
        with open(i['path'], 'rb') as f:
            return {'read': len(f.read())}
    except OSError as e:
        return {'error': type(e).__name__}
"""

pytestmark = [pytest.mark.jail, pytest.mark.usefixtures("contained")]


# --- reading what is not the tool's ---------------------------------------------------------


def test_read_etc_shadow(machine: Machine) -> None:
    assert report(machine, READ, {"path": "/etc/shadow"}) == {"error": "FileNotFoundError"}


def test_read_the_data_dir_and_its_database(machine: Machine) -> None:
    data = machine.settings.data_dir
    (data / "runnerd.db").touch()
    for path in (data / "runnerd.db", data / "runnerd.db-wal", data):
        assert report(machine, READ, {"path": str(path)}) == {"error": "FileNotFoundError"}


def test_no_other_tools_code_is_anywhere_in_the_jail(machine: Machine) -> None:
    # Another tool ran before; its code reached its own jail over stdin, never a file.
    run_tool(
        machine, make_tool(machine, "SECRET_LOGIC = 42\ndef run(i):\n    return {}\n", name="other")
    )
    source = """
import os
def run(i):
    hits, seen = [], 0
    for top in ('/', '/tmp', '/sandbox', '/etc', '/dev'):
        for root, dirs, files in os.walk(top):
            if root == '/':
                dirs[:] = [d for d in dirs if d not in ('usr', 'lib', 'lib64')]
            for name in files:
                path = os.path.join(root, name)
                if not os.path.isfile(path):  # devices: /dev/urandom never ends
                    continue
                seen += 1
                try:
                    if b'SECRET_LOGIC' in open(path, 'rb').read():
                        hits.append(path)
                except OSError:
                    pass
    return {'hits': hits, 'tool_dir': os.path.exists('/tool'), 'seen': seen > 0}
"""
    assert report(machine, source) == {"hits": [], "tool_dir": False, "seen": True}


def test_proc_1_environ_and_proc_are_absent(machine: Machine) -> None:
    for path in ("/proc/1/environ", "/proc/self/environ", "/sys/kernel/notes"):
        assert report(machine, READ, {"path": path}) == {"error": "FileNotFoundError"}


def test_root_holds_only_what_the_interpreter_needs(machine: Machine) -> None:
    source = (
        "import os\ndef run(i):\n    return {'root': sorted(os.listdir('/')), "
        "'dev': sorted(os.listdir('/dev'))}\n"
    )
    out = report(machine, source)
    assert set(out["root"]) <= {"dev", "etc", "lib", "lib64", "sandbox", "tmp", "tool", "usr"}
    assert out["dev"] == ["null", "urandom"]


# --- writing and persisting -----------------------------------------------------------------

WRITE = """
import os
def run(i):
    results = {}
    for path in i['paths']:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, 'w') as f:
                f.write('x')
            results[path] = 'written'
        except OSError as e:
            results[path] = type(e).__name__
    return results
"""


def test_write_outside_tmp(machine: Machine) -> None:
    paths = ["/tool/t.py", "/usr/evil", "/etc/evil", "/evil", machine.sandbox.python_harness]
    out = report(machine, WRITE, {"paths": paths})
    assert all(v != "written" for v in out.values()), out


def test_files_do_not_persist_between_runs(machine: Machine) -> None:
    paths = ["/tmp/persist", "/dev/shm/persist", "/var/tmp/persist"]
    first = report(machine, WRITE, {"paths": paths})
    assert first["/tmp/persist"] == "written"
    check = "import os\ndef run(i):\n    return {p: os.path.exists(p) for p in i['paths']}\n"
    assert report(machine, check, {"paths": paths}) == dict.fromkeys(paths, False)


def test_disk_fill_of_tmp_stops_at_the_tmpfs_size(machine: Machine) -> None:
    source = """
def run(i):
    written = 0
    try:
        with open('/tmp/fill', 'wb') as f:
            while written < 512 * 1024 * 1024:
                f.write(b'x' * (1024 * 1024))
                written += 1024 * 1024
    except OSError as e:
        return {'stopped_at_mb': written // (1024 * 1024), 'error': type(e).__name__}
    return {'stopped_at_mb': written // (1024 * 1024)}
"""
    out = report(machine, source)
    assert out["stopped_at_mb"] <= machine.settings.tmp_mb
    assert out["error"] == "OSError"


# --- network ----------------------------------------------------------------------------------


@pytest.mark.smoke
def test_connect_to_the_daemon_port_on_localhost(machine: Machine) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    source = """
import socket
def run(i):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(('127.0.0.1', i['port']))
        return {'connected': True}
    except OSError as e:
        return {'connected': False, 'error': type(e).__name__}
"""
    try:
        out = report(machine, source, {"port": port})
    finally:
        server.close()
    assert out == {"connected": False, "error": "ConnectionRefusedError"}


def test_no_route_to_any_outside_address(machine: Machine) -> None:
    # A UDP connect() only looks the route up; it sends nothing, jailed or not.
    # Interfaces by index (SIOCGIFNAME): if_nameindex() needs netlink, which is denied.
    source = """
import fcntl, socket, struct
def run(i):
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    names = []
    for index in range(1, 256):
        try:
            reply = fcntl.ioctl(probe, 0x8910, struct.pack('16si20x', b'', index))
        except OSError:
            continue
        names.append(reply[:16].rstrip(b'\\0').decode())
    out = {'interfaces': names}
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(('192.0.2.1', 53))
        out['route'] = True
    except OSError as e:
        out['route'] = False
    return out
"""
    assert report(machine, source) == {"interfaces": ["lo"], "route": False}


def test_raw_and_packet_sockets(machine: Machine) -> None:
    source = """
import socket
def run(i):
    out = {}
    for name, args in [('raw', (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
                       ('packet', (socket.AF_PACKET, socket.SOCK_RAW, 0))]:
        try:
            socket.socket(*args)
            out[name] = 'opened'
        except OSError as e:
            out[name] = type(e).__name__
    return out
"""
    # AF_PACKET is denied by seccomp before capabilities are checked: EAFNOSUPPORT.
    assert report(machine, source) == {"raw": "PermissionError", "packet": "OSError"}


# --- processes --------------------------------------------------------------------------------


def test_fork_bomb(machine: Machine) -> None:
    source = """
import os, time
def run(i):
    made = 0
    try:
        while True:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
            made += 1
    except OSError as e:
        return {'made': made, 'error': type(e).__name__}
"""
    out = report(machine, source)
    assert out["made"] < machine.settings.pids
    assert out["error"] == "BlockingIOError"


def test_memory_bomb_python(machine: Machine) -> None:
    source = "def run(i):\n    hog = []\n    while True:\n        hog.append(bytearray(64 << 20))\n"
    result = attack(machine, source)
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith(("MemoryError", "the tool was"))


def test_memory_bomb_node(machine: Machine) -> None:
    source = (
        "export function run() {\n  const hog = []\n"
        "  for (;;) hog.push(new Array(1 << 20).fill(7))\n}\n"
    )
    result = attack(machine, source, ext=".mjs")
    assert result.status == "failed"


def test_stdout_flood(machine: Machine) -> None:
    source = (
        "import sys\ndef run(i):\n    for _ in range(200_000):\n"
        "        sys.stdout.write('y' * 1000 + '\\n')\n    return {'done': True}\n"
    )
    result = attack(machine, source, timeout_ms=20_000)
    assert (result.status, result.output) == ("succeeded", {"done": True})
    assert result.logs_truncated and len(result.logs) == 64 * 1024


def test_cpu_spin_past_the_timeout(machine: Machine) -> None:
    result = attack(machine, "def run(i):\n    while True:\n        pass\n", timeout_ms=1000)
    assert result.status == "timed_out"
    assert result.duration_ms < 2000


def test_child_that_ignores_sigterm_and_outlives_its_parent(machine: Machine) -> None:
    source = """
import os, signal, time
def run(i):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            time.sleep(600)
        os._exit(0)
    time.sleep(0.2)
    return {'spawned': True}
"""
    # Returns while the daemonized grandchild still sleeps: the jail's end must reap it.
    assert report(machine, source) == {"spawned": True}


def test_hung_tool_with_daemon_children_dies_at_the_deadline(machine: Machine) -> None:
    source = """
import os, signal, time
def run(i):
    for _ in range(3):
        if os.fork() == 0:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                pass
    while True:
        time.sleep(1)
"""
    result = attack(machine, source, timeout_ms=1000)
    assert result.status == "timed_out"


# --- outliving the reply: a jail is stopped right after it, and live jails are what is counted --

# The harness exits right after writing its reply; these tools make that exit a no-op (and
# every other way out) and leave busy threads behind, then reply at once.
LINGERING = {
    ".py": """
import os, signal, sys, threading
def spin():
    while True:
        pass
def run(i):
    os._exit = sys.exit = os.abort = lambda *a: None
    os.kill = lambda *a: None
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=spin).start()
    threading.Thread(target=spin, daemon=True).start()
    return {'replied': True}
""",
    ".mjs": """
import { Worker } from 'node:worker_threads'
export function run() {
  process.exit = () => {}
  process.reallyExit = () => {}
  process.abort = () => {}
  process.kill = () => true
  process.on('SIGTERM', () => {})
  setInterval(() => { const end = Date.now() + 20; while (Date.now() < end) {} }, 1)
  new Worker('for (;;) {}', { eval: true })
  return { replied: true }
}
""",
}
# From the answer until nothing of the jail is left: its grace, SIGTERM's, and slack for
# a loaded host (before, such a jail lived until its deadline, here 30 s).
JAIL_GONE_WITHIN_S = REPLY_GRACE_S + STOP_GRACE_S + 1.0


def _cgroups_of(uids: range) -> set[Path]:
    """The cgroup folders (v1 or v2) that hold processes of these uids, from the host."""
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError, ValueError):
            uid = next(int(x.split()[1]) for x in status.read_text().splitlines()
                       if x.startswith("Uid:"))  # fmt: skip
            if uid not in uids:
                continue
            for line in (status.parent / "cgroup").read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                where = Path("/sys/fs/cgroup", controllers.split(",")[0].removeprefix("name="))
                if "NSJAIL." in path:
                    found.add(where / path.lstrip("/") if controllers else
                              Path("/sys/fs/cgroup/unified", path.lstrip("/")))  # fmt: skip
    return found


@pytest.mark.parametrize("ext", [".py", ".mjs"])
def test_a_tool_that_disables_exit_and_leaves_busy_threads_is_stopped_right_after_its_reply(
    machine: Machine, ext: str
) -> None:
    tool = make_tool(machine, LINGERING[ext], ext=ext, timeout_ms=30_000)

    async def scenario() -> tuple[RunResult, float, float, set[Path]]:
        started = time.monotonic()
        result = await machine.pipeline.run(tool, {}, logs=False)
        answered = time.monotonic()
        # It replied: its end goes on in the background (the jail is still serving).
        uids = range(0)
        for jail in list(machine.sandbox._serving):
            uids = range(jail.uid, jail.uid + 1)
        cgroups = _cgroups_of(uids)  # read while it lingers (its grace, REPLY_GRACE_S)
        assert uids, "the jail ended before its answer came back"
        while _processes_of(uids) and time.monotonic() - answered < 5:
            await asyncio.sleep(0.01)
        gone = time.monotonic() - answered
        await asyncio.sleep(0.3)  # nothing comes back (no process left to restart it)
        assert _processes_of(uids) == []
        return result, answered - started, gone, cgroups

    result, waited, gone, cgroups = asyncio.run(scenario())
    assert (result.status, result.output) == ("succeeded", {"replied": True}), result.error
    assert waited < 1.0  # the caller has its answer at the reply, not at the jail's end
    assert gone < JAIL_GONE_WITHIN_S, f"the jail's processes lived {gone:.2f} s past its answer"
    # Its cgroup is gone too: nothing of it is left to burn CPU.
    assert cgroups or not machine.cgroups.enabled
    assert [path for path in cgroups if path.exists()] == []


LINGER = "import os, threading, time\ndef run(i):\n    os._exit = lambda code: None\n" \
    "    threading.Thread(target=time.sleep, args=(60,)).start()\n    return {}\n"  # fmt: skip


def _children(pid: int | str) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return []


def _live_jails(daemon_pid: int) -> dict[str, int]:
    """The daemon's live jails by the language they run: its nsjail processes (its
    children), a Python template's children counted instead of the template."""
    found = {"python": 0, "node": 0}
    for children in Path(f"/proc/{daemon_pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for pid in children.read_text().split():
                with contextlib.suppress(OSError):
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if Path(argv[0].decode()).name != "nsjail":
                        continue
                    line = b" ".join(argv)
                    if b"/sandbox/template_py.py" in line:
                        found["python"] += sum(len(_children(t)) for t in _children(pid))
                    else:
                        found["python" if b"/sandbox/harness_py" in line else "node"] += 1
    return found


@pytest.mark.parametrize("warm", [0, 2])
def test_quick_calls_never_leave_more_live_jails_than_max_concurrent_runs(
    toolchain_dir: Path, tmp_path: Path, warm: int
) -> None:
    """12 calls at once of a tool that replies at once and would linger 60 s: never more
    than max_concurrent_runs (2) jails serving calls, plus the waiting warm jails, at most
    ``warm_jails`` per kind (sampled from the host during the whole burst)."""
    from conftest import write_app
    from daemon import concurrently, running_daemon

    settings = {"max_concurrent_runs": "2", "warm_jails": str(warm),
                "sandbox_uid_base": "646000", "sandbox_uid_count": "64"}  # fmt: skip
    with running_daemon(toolchain_dir, **settings) as d:
        app = write_app(tmp_path / "linger", "linger", {"linger": LINGER},
                        docs={"linger": {"timeoutMs": 20_000}})  # fmt: skip
        install_id = d.ship(app)["installId"]
        samples: list[dict[str, int]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                samples.append(_live_jails(d.proc.pid))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            responses = concurrently(12, lambda: d.run(install_id, "linger", {}))
            time.sleep(JAIL_GONE_WITHIN_S)  # the last calls' jails end after their answers
        finally:
            done.set()
            sampler.join()
        assert [r.json()["status"] for r in responses] == ["succeeded"] * 12
        most = max(s["python"] for s in samples)
        assert most <= 2 + warm, f"{most} Python jails alive at once"
        assert most >= 2  # the burst did fill both slots: the samples saw it
        # Node's waiting jails (javascript, typescript kinds) are only ever waiting ones.
        assert max(s["node"] for s in samples) <= 2 * warm
        assert samples[-1]["python"] == warm  # after the burst, only the waiting ones


def test_kill_minus_one_and_other_pids(machine: Machine) -> None:
    source = (
        SYSCALL
        + """
import signal
def run(i):
    out = {}
    try:
        os.kill(i['host_pid'], signal.SIGKILL)
        out['host'] = 'killed'
    except OSError as e:
        out['host'] = type(e).__name__
    for _ in range(3):
        if os.fork() == 0:
            import time; time.sleep(5); os._exit(0)
    os.kill(-1, signal.SIGKILL)   # every process of the jail but this one
    out['pid'] = os.getpid()
    return out
"""
    )
    out = report(machine, source, {"host_pid": os.getpid()})
    assert out == {"host": "ProcessLookupError", "pid": 1}


def test_ptrace(machine: Machine) -> None:
    source = (
        SYSCALL
        + """
def run(i):
    pid = os.fork()
    if pid == 0:
        import time; time.sleep(5); os._exit(0)
    rc, err = call('ptrace', 16, pid, 0, 0)   # PTRACE_ATTACH
    os.kill(pid, 9)
    return {'rc': rc, 'errno': err}
"""
    )
    assert report(machine, source) == {"rc": -1, "errno": 1}


@pytest.mark.parametrize(
    ("name", "args", "errno"),
    [
        ("unshare", "0x10000000", 1),  # CLONE_NEWUSER
        ("unshare", "0x00020000", 1),  # CLONE_NEWNS
        ("unshare", "0x40000000", 1),  # CLONE_NEWNET
        ("setns", "0, 0", 1),
        ("mount", "b'none', b'/tmp', b'tmpfs', 0, None", 1),
        ("umount2", "b'/tmp', 2", 1),
        ("chroot", "b'/tmp'", 1),
        ("syscall", "250, 0, 0, 0, 0, 0", 1),  # keyctl
        ("syscall", "248, b'user', b'k', b'v', 1, 0xfffffffd", 1),  # add_key
        ("syscall", "321, 0, 0, 0", 1),  # bpf
        ("syscall", "298, 0, 0, 0, 0, 0", 1),  # perf_event_open
        ("syscall", "246, 0, 0, 0, 0", 1),  # kexec_load
        ("syscall", "313, 0, 0, 0", 1),  # finit_module
        ("syscall", "425, 8, 0", 1),  # io_uring_setup
        ("syscall", "56, 0x10000011, 0, 0, 0, 0", 1),  # clone(CLONE_NEWUSER|SIGCHLD)
        ("syscall", "435, 0, 0", 38),  # clone3: ENOSYS, so libc falls back to clone
        ("syscall", "164, 0, 0", 1),  # settimeofday
    ],
)
def test_denied_syscalls(machine: Machine, name: str, args: str, errno: int) -> None:
    source = (
        SYSCALL + f"\ndef run(i):\n    rc, err = call({name!r}, {args})\n"
        "    return {'rc': rc, 'errno': err}\n"
    )
    assert report(machine, source) == {"rc": -1, "errno": errno}


def test_setuid_binaries_and_privileges(machine: Machine) -> None:
    source = (
        SYSCALL
        + """
def run(i):
    found = [p for p in ('/usr/bin/su', '/usr/bin/sudo', '/bin/mount', '/usr/bin/passwd')
             if os.path.exists(p)]
    no_new_privs, _ = call('prctl', 39, 0, 0, 0, 0)   # PR_GET_NO_NEW_PRIVS
    return {'setuid_binaries': found, 'no_new_privs': no_new_privs,
            'uid': os.getuid(), 'euid': os.geteuid()}
"""
    )
    out = report(machine, source)
    # The run's own nonzero uid: 1000 in a fresh nsjail, u - base + 1 in a template's child.
    uid = out.pop("uid")
    assert uid != 0 and out.pop("euid") == uid
    assert out == {"setuid_binaries": [], "no_new_privs": 1}


def _descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (children, theirs, and so on)."""
    parents: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            line = next(x for x in status.read_text().splitlines() if x.startswith("PPid:"))
        except (OSError, StopIteration):
            continue
        parents[int(status.parent.name)] = int(line.split()[1])
    found: set[int] = set()
    for child in parents:
        chain, node = [], child
        while node in parents and node not in found and node != pid:
            chain.append(node)
            node = parents[node]
        if node == pid or node in found:
            found.update(chain)
    return found


def _parent(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return int(next(x for x in status.splitlines() if x.startswith("PPid:")).split()[1])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_jail_runs_as_an_unprivileged_outside_uid(machine: Machine) -> None:
    source = "import time\ndef run(i):\n    time.sleep(0.4)\n    return {}\n"
    tool = make_tool(machine, source)

    async def observe() -> list[int]:
        task = asyncio.ensure_future(machine.pipeline.run(tool, {}))
        await asyncio.sleep(0.25)
        # This test's own jails only: other runnerds on the host (and the daemons this
        # session started) run jails too. The machine's nsjails are this process's children.
        ours = {
            p
            for child in _descendants(os.getpid())
            if _parent(child) == os.getpid() and b"nsjail" in _cmdline(child)
            for p in _descendants(child)
        }
        uids = []
        for status in Path("/proc").glob("[0-9]*/status"):
            if int(status.parent.name) not in ours:
                continue
            try:
                text = status.read_text()
            except OSError:
                continue
            if "python3" in text.splitlines()[0] and "harness" in (
                status.parent / "cmdline"
            ).read_bytes().decode("utf-8", "replace"):
                uid_line = next(x for x in text.splitlines() if x.startswith("Uid:"))
                uids.append(int(uid_line.split()[1]))
        await task
        return uids

    uids = asyncio.run(observe())
    assert uids and all(u in _jail_uids(machine) and u != 0 for u in uids)


def test_concurrent_runs_get_distinct_uids_and_cannot_see_each_others_secrets(
    machine: Machine,
) -> None:
    holder = make_tool(
        machine,
        "import os, time\ndef run(i):\n    time.sleep(0.6)\n"
        "    return {'uid_ok': os.getuid() != 0}\n",  # the run's own nonzero uid
        name="holder",
    )
    spy = make_tool(
        machine,
        """
import os
def run(i):
    env = dict(os.environ)
    seen = [p for p in ('/proc',) if os.path.exists(p)]
    return {'keys': sorted(env), 'proc': seen, 'pid': os.getpid()}
""",
        name="spy",
    )

    async def both() -> tuple[Any, Any]:
        first = asyncio.ensure_future(
            machine.pipeline.run(holder, {}, secrets={"HOLDER_SECRET": "hs-7f9d2c1b"})
        )
        await asyncio.sleep(0.2)
        second = await machine.pipeline.run(spy, {}, secrets={"SPY_KEY": "spy-0000"})
        return await first, second

    first, second = asyncio.run(both())
    assert first.output == {"uid_ok": True}
    assert second.output == {"keys": ["HOME", "LANG", "PATH", "SPY_KEY"], "proc": [], "pid": 1}


def test_node_cannot_spawn_a_shell_or_read_host_files(machine: Machine) -> None:
    source = """
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
export function run() {
  const out = {}
  try { execFileSync('/bin/sh', ['-c', 'id']); out.sh = 'ran' } catch (e) { out.sh = e.code }
  try { readFileSync('/etc/passwd'); out.passwd = 'read' } catch (e) { out.passwd = e.code }
  return out
}
"""
    out = report(machine, source, ext=".mjs")
    assert out == {"sh": "ENOENT", "passwd": "ENOENT"}


def test_raising_rlimits_is_refused(machine: Machine) -> None:
    source = """
import resource
def run(i):
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (hard + 100, hard + 100))
        return {'raised': True}
    except (ValueError, OSError) as e:
        return {'raised': False, 'hard': hard}
"""
    out = report(machine, source)
    assert out == {"raised": False, "hard": machine.settings.pids}


def test_forged_result_cannot_bypass_output_checks(machine: Machine) -> None:
    source = """
import os, sys
def run(i):
    os.write(int(sys.argv[1]), b'{"ok":true,"output":{"n":"not a number"}}')
    os._exit(0)
"""
    out_schema = {"type": "object", "properties": {"n": {"type": "number"}}}
    result = run_tool(machine, make_tool(machine, source, output_schema=out_schema))
    assert result.status == "failed"
    assert result.error is not None and "output schema" in result.error


def test_huge_result_channel_write_is_capped(machine: Machine) -> None:
    source = (
        "import os, sys\ndef run(i):\n    os.write(int(sys.argv[1]), b'[' * (4 << 20))\n"
        "    os._exit(0)\n"
    )
    result = attack(machine, source)
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith("output is larger than 1 MB")


def test_node_worker_thread_bomb(machine: Machine) -> None:
    source = """
import { Worker } from 'node:worker_threads'
export async function run() {
  const workers = []
  let error = null
  try {
    for (let i = 0; i < 500; i++) {
      workers.push(new Worker('setInterval(() => {}, 1000)', { eval: true }))
    }
  } catch (e) { error = e.code || e.name }
  return { started: workers.length, error }
}
"""
    result = attack(machine, source, ext=".mjs", timeout_ms=5000)
    # Either the process cap stops it (an error, or the tool dies) or the deadline does.
    assert result.status in ("succeeded", "failed", "timed_out")
    if result.status == "succeeded":
        assert result.output is not None and result.output["started"] < 500


def test_node_wasm_memory_bomb(machine: Machine) -> None:
    source = """
export function run() {
  const pages = []
  for (;;) {
    const memory = new WebAssembly.Memory({ initial: 4096 })  // 256 MiB
    new Uint8Array(memory.buffer).fill(7)  // touched, so it is really used
    pages.push(memory)
  }
}
"""
    result = attack(machine, source, ext=".mjs")
    assert result.status == "failed"


def test_node_fetch_to_the_daemon_port(machine: Machine) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    source = """
export async function run(i) {
  try {
    await fetch(`http://127.0.0.1:${i.port}/`)
    return { reached: true }
  } catch (e) {
    return { reached: false, cause: e.cause && e.cause.code }
  }
}
"""
    try:
        out = report(machine, source, {"port": port}, ext=".mjs")
    finally:
        server.close()
    assert out == {"reached": False, "cause": "ECONNREFUSED"}


# --- through `runnerd tool test`: socket families, syscalls, what the jail sees --------------


def tool_test(machine: Machine, tmp_path: Path, source: str, ext: str = ".py") -> dict[str, Any]:
    """Run ``source`` as a tool with `runnerd tool test --json` (the real CLI and jail);
    its output, which the tool returns on success."""
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))
    (tmp_path / "probe.tool.yaml").write_text(tool_doc("probe"))
    (tmp_path / f"probe{ext}").write_text(source)
    proc = run_cli(
        "tool", "test", str(tmp_path / "probe.tool.yaml"), "--input", "{}", "--json",
        env=machine_env(machine),
    )  # fmt: skip
    result = json.loads(proc.stdout)
    assert result["status"] == "succeeded", result["error"]
    output: dict[str, Any] = result["output"]
    return output


SOCKETS = (
    SYSCALL
    + """
libc.syscall.restype = ctypes.c_long
def run(i):
    out = {}
    for name, family, kind in [('unix', 1, 1), ('inet', 2, 1), ('inet6', 10, 1), ('key', 15, 3),
                               ('netlink', 16, 3), ('packet', 17, 3), ('rds', 21, 5),
                               ('can', 29, 3), ('tipc', 30, 5), ('bluetooth', 31, 1),
                               ('alg', 38, 5), ('vsock', 40, 1), ('qipcrtr', 42, 2),
                               ('xdp', 44, 3), ('unix_high_bits', 1 + (1 << 32), 1)]:
        fd = libc.syscall(41, ctypes.c_long(family), kind, 0)   # socket()
        out[name] = 'opened' if fd >= 0 else ctypes.get_errno()
    pair = (ctypes.c_int * 2)()
    for name, family in [('pair_unix', 1), ('pair_inet', 2), ('pair_netlink', 16)]:
        rc = libc.syscall(53, family, 1, 0, pair)   # socketpair()
        out[name] = 'opened' if rc == 0 else ctypes.get_errno()
    return out
"""
)


def test_only_unix_and_inet_sockets_can_be_created(machine: Machine, tmp_path: Path) -> None:
    out = tool_test(machine, tmp_path, SOCKETS)
    eafnosupport = 97
    assert out == {
        "unix": "opened",
        "inet": "opened",
        "inet6": "opened",
        **{
            name: eafnosupport
            for name in (
                "key",
                "netlink",
                "packet",
                "rds",
                "can",
                "tipc",
                "bluetooth",
                "alg",
                "vsock",
                "qipcrtr",
                "xdp",
                "unix_high_bits",
            )
        },
        "pair_unix": "opened",
        "pair_inet": eafnosupport,
        "pair_netlink": eafnosupport,
    }


EXOTIC = (
    SYSCALL
    + """
libc.syscall.restype = ctypes.c_long
def run(i):
    out = {}
    memfd = libc.syscall(319, b'x', 0)   # memfd_create
    exe = open('/proc/self/exe', 'rb').read() if os.path.exists('/proc') else b'\\x7fELF'
    os.write(memfd, exe)
    calls = {
        'pidfd_getfd': (438, 0, 0, 0),
        'modify_ldt': (154, 1, 0, 0),
        'execveat_memfd': (322, memfd, b'', None, None, 0x1000),   # AT_EMPTY_PATH
        'personality_read_implies_exec': (135, 0x0400000),
        'personality_no_randomize': (135, 0x0040000),
    }
    for name, args in calls.items():
        rc = libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
        out[name] = rc if rc >= 0 else -ctypes.get_errno()
    out['personality_query'] = libc.syscall(135, ctypes.c_long(0xffffffff))
    return out
"""
)


def test_pidfd_getfd_modify_ldt_execveat_and_personas_are_refused(
    machine: Machine, tmp_path: Path
) -> None:
    eperm = -1
    assert tool_test(machine, tmp_path, EXOTIC) == {
        "pidfd_getfd": eperm,
        "modify_ldt": eperm,
        "execveat_memfd": eperm,
        "personality_read_implies_exec": eperm,
        "personality_no_randomize": eperm,
        "personality_query": 0,  # the default persona, unchanged
    }


WALK_PY = """
import os, stat
def run(i):
    seen, special = [], []
    for root, dirs, files in os.walk('/'):
        for name in dirs + files:
            path = os.path.join(root, name)
            seen.append(path)
            mode = os.lstat(path).st_mode
            if mode & (stat.S_ISUID | stat.S_ISGID):
                special.append(path)
    return {'paths': sorted(seen), 'setid': special}
"""

WALK_JS = """
import { readdirSync, lstatSync } from 'node:fs'
export function run() {
  const paths = [], setid = []
  const walk = (dir) => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = (dir === '/' ? '' : dir) + '/' + entry.name
      paths.push(path)
      if (lstatSync(path).mode & 0o6000) setid.push(path)
      if (entry.isDirectory()) walk(path)
    }
  }
  walk('/')
  return { paths: paths.sort(), setid }
}
"""


def _expected_view(mounts: tuple[str, ...], extra: list[str]) -> set[str]:
    """Every path a jail with these bind mounts shows: each mount's own tree at its
    place, the ``extra`` paths (devices, the harness, files the jail made), and the
    folders that lead to each."""
    found: set[str] = set()
    for spec in [*mounts, *extra]:
        source, _, target = spec.partition(":")
        target = target or source
        found.add(target)
        parent = os.path.dirname(target)
        while parent != "/":
            found.add(parent)
            parent = os.path.dirname(parent)
        if spec in mounts and os.path.isdir(source) and not os.path.islink(source):
            for root, dirs, files in os.walk(source):
                for name in dirs + files:
                    found.add(
                        os.path.join(target, os.path.relpath(os.path.join(root, name), source))
                    )
    return found


JAIL_DEVICES = ["/dev/null", "/dev/urandom", "/tmp"]


def test_the_python_jail_shows_exactly_its_runtime(machine: Machine, tmp_path: Path) -> None:
    runtime = machine.runtimes.python
    assert runtime is not None
    out = tool_test(machine, tmp_path, WALK_PY)
    # The harness as bytecode, compiled once for the jails' interpreter.
    assert machine.sandbox.python_harness == "/sandbox/harness_py.pyc"
    expected = _expected_view(runtime.mounts, [*JAIL_DEVICES, machine.sandbox.python_harness])
    assert set(out["paths"]) == expected
    assert not any(p.startswith("/usr/lib/x86_64-linux-gnu/perl") for p in out["paths"])
    assert out["setid"] == []


def test_the_node_jail_shows_exactly_its_runtime(machine: Machine, tmp_path: Path) -> None:
    runtime = machine.runtimes.node
    assert runtime is not None
    out = tool_test(machine, tmp_path, WALK_JS, ext=".mjs")
    expected = _expected_view(
        runtime.mounts,
        # the probe imports only builtins: it was compiled to CommonJS at upload
        [*JAIL_DEVICES, "/sandbox/harness_js.cjs", "/tmp/.tool/probe.cjs"],
    )
    assert set(out["paths"]) == expected
    assert out["setid"] == []


NOEXEC_PY = """
import ctypes, os, shutil, sys
def run(i):
    out = {}
    shutil.copy(sys.executable, '/tmp/py')
    os.chmod('/tmp/py', 0o755)
    try:
        os.execv('/tmp/py', ['/tmp/py', '-c', 'pass'])
    except OSError as e:
        out['exec'] = e.errno
    shutil.copy('/lib/x86_64-linux-gnu/libz.so.1', '/tmp/z.so')
    try:
        ctypes.CDLL('/tmp/z.so')
        out['dlopen'] = 'loaded'
    except OSError as e:
        out['dlopen'] = 'failed to map segment' in str(e)
    return out
"""

NOEXEC_JS = """
import { writeFileSync } from 'node:fs'
import { execFileSync } from 'node:child_process'
export function run() {
  writeFileSync('/tmp/run.mjs', `#!${process.execPath}\n`, { mode: 0o755 })
  try { execFileSync('/tmp/run.mjs'); return { exec: 'ran' } }
  catch (e) { return { exec: e.code } }
}
"""


def test_nothing_written_to_tmp_can_be_executed_or_loaded(machine: Machine, tmp_path: Path) -> None:
    assert tool_test(machine, tmp_path, NOEXEC_PY) == {"exec": 13, "dlopen": True}  # EACCES
    assert tool_test(machine, tmp_path, NOEXEC_JS, ext=".mjs") == {"exec": "EACCES"}


# --- egress: tools that attack the proxy (a live daemon, the tests' own network) ---------


def test_a_forged_or_finished_credential_is_refused(egress_daemon: Daemon, caller: str) -> None:
    forged = run_ok(egress_daemon, caller, "probe", {"mode": "forged"})
    assert forged["output"]["answer"].startswith("HTTP/1.1 407"), forged["output"]

    earlier = run_ok(egress_daemon, caller, "probe", {"mode": "proxy_env"})
    token = httpx.URL(earlier["output"]["proxy"]).password
    assert token
    reused = run_ok(egress_daemon, caller, "probe", {"mode": "forged", "token": token})
    assert reused["output"]["answer"].startswith("HTTP/1.1 407"), reused["output"]


def test_a_flood_of_connections_to_the_proxy_is_cut_and_the_daemon_stays_up(
    egress_daemon: Daemon, caller: str
) -> None:
    value = {"mode": "flood", "count": 200, "url": f"http://api.test:{HTTP_PORT}/after-flood"}
    with HealthProbe(egress_daemon) as probe:
        result = run_ok(egress_daemon, caller, "probe", value)
    assert result["status"] == "succeeded", result["error"]
    found = result["output"]
    assert found.get("opened", 0) + found.get("failed", 0) == 200, found
    # Past the run's cap (16 in this daemon), the proxy closes connections unread; the
    # run's own request still goes through once the flood is gone.
    assert found["closed"] >= found["opened"] - 16, found
    assert found["then"] == 200, found
    assert probe.worst_ms < 50, probe.worst_ms


def test_tunnels_close_when_a_run_times_out(
    egress_daemon: Daemon, caller: str, lab: EgressLab
) -> None:
    before = lab.established(HTTP_PORT)
    result = run_ok(egress_daemon, caller, "hold", {"mode": "hold"})
    assert result["status"] == "timed_out"
    deadline = time.monotonic() + 3
    while lab.established(HTTP_PORT) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lab.established(HTTP_PORT) <= before
