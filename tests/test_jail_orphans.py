"""Jails die with their daemon (issue 25, part 4): a ``kill -9`` of the daemon leaves no
jail running, warm or serving; a start kills what a killed runnerd left in its uid range
before it hands out a uid; a lease never hands out the uid of a live process; package
builds run as the range's builders' uid, under its host-wide lock.

Every process here is real (a real daemon, real nsjail jails, processes started as the
range's uids) and is looked for in the host's /proc, not through runnerd's own code."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import http.server
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import write_app
from daemon import running_daemon, serving_again
from runnerd.errors import SandboxUnavailable
from runnerd.run.machine import Machine
from runnerd.run.package_envs import EnvManager
from runnerd.run.uids import UidPool

pytestmark = pytest.mark.jail

# This module's own uid ranges (no other test uses them): the daemon's, and the pools'.
BASE, COUNT = 671_000, 8  # runs 671000..671006, builders 671007
POOL_BASE = 671_100
GONE_WITHIN_S = 2.0  # the brief's bound: "within a second or two"

SLOW = "import time\ndef run(i):\n    time.sleep(30)\n    return {}\n"


def _running(uids: range) -> dict[int, list[int]]:
    """The live (not zombie) processes of the host whose real uid is in ``uids``."""
    found: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = dict(
                line.split(":", 1) for line in status.read_text().splitlines() if ":" in line
            )
            uid = int(fields["Uid"].split()[0])
            if uid in uids and fields["State"].split()[0] not in ("Z", "X"):
                found.setdefault(uid, []).append(int(status.parent.name))
    return found


def _nsjails(uids: range) -> dict[int, int]:
    """The live nsjail processes that map a uid of ``uids``: pid -> parent pid."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            argv = cmdline.read_bytes().split(b"\0")
            if Path(argv[0].decode()).name != "nsjail" or b"--user" not in argv:
                continue
            uid = int(argv[argv.index(b"--user") + 1].split(b":")[1])
            status = (cmdline.parent / "status").read_text()
            if uid in uids and "\nState:\tZ" not in status:
                found[int(cmdline.parent.name)] = int(status.split("\nPPid:\t")[1].split()[0])
    return found


def _in_sleep(uids: range) -> list[int]:
    """Those processes of ``uids`` that are in a sleep (the slow tool's ``time.sleep``),
    not in a read (a waiting jail's harness, reading its stdin)."""
    return [
        pid
        for pids in _running(uids).values()
        for pid in pids
        if _wchan(pid) in ("hrtimer_nanosleep", "do_nanosleep")
    ]


def _wchan(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/wchan").read_text()
    return ""


def _until(check: object, within_s: float) -> float:
    """Seconds until ``check()`` is true; raises after ``within_s``."""
    started = time.monotonic()
    while not check():  # type: ignore[operator]
        if time.monotonic() - started > within_s:
            raise AssertionError(f"not within {within_s} s")
        time.sleep(0.02)
    return time.monotonic() - started


def _lock_dir() -> Path:
    return Path(os.environ.get("RUNNERD_UID_LOCK_DIR", "/run/runnerd/uids"))


# A runnerd of an older release (or one killed between its fork and setpriv's prctl): it
# leases uids from the host-wide folder, starts jails that do not die with it, and is
# killed. Prints the nsjail pids, then waits to be killed.
_OLD_RUNNERD = r"""
import json, subprocess, sys, time
from pathlib import Path
from runnerd.run.uids import UidPool
nsjail, lock_dir, base, count = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pool = UidPool(lock_dir, base, count)
held = [pool.lease() for _ in range(count - 1)] + [pool.lease_builder(5)]
pids = []
for uid, _ in held:
    pids.append(subprocess.Popen(
        [nsjail, "--mode", "o", "--really_quiet", "--chroot", "/", "--disable_proc",
         "--user", f"1000:{uid}:1", "--group", f"1000:{uid}:1", "--", "/bin/sleep", "120"],
        start_new_session=True, stdin=subprocess.DEVNULL).pid)
print(json.dumps(pids), flush=True)
time.sleep(120)
"""


@contextlib.contextmanager
def _old_runnerd_orphans(nsjail: str, uids: range) -> Iterator[list[int]]:
    """Real jails on every uid of ``uids``, orphaned: the runnerd that started them was
    killed (SIGKILL) and its locks went with it. Yields the orphaned nsjails' pids; on the
    way out, whatever of them is left is killed (only what this test started)."""
    old = subprocess.Popen(
        [sys.executable, "-c", _OLD_RUNNERD, nsjail, str(_lock_dir()), str(uids.start),
         str(len(uids))],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert old.stdout is not None
    pids: list[int] = json.loads(old.stdout.readline())
    try:
        _until(lambda: len(_running(uids)) == len(uids), 10)  # every jail's sleep is up
        old.kill()
        old.wait()
        yield pids
    finally:
        with contextlib.suppress(ProcessLookupError):
            old.kill()
        old.wait()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _slow_call(daemon: object, install_id: str) -> threading.Thread:
    """A call of the slow tool in a thread of its own (its answer is never awaited: the
    daemon is killed under it)."""

    def call() -> None:
        with contextlib.suppress(httpx.HTTPError):
            daemon.run(install_id, "slow", {})  # type: ignore[attr-defined]

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("templates", [True, False], ids=["template", "nsjail"])
def test_kill_9_leaves_no_jail_and_a_restart_kills_orphans_before_it_hands_out_uids(
    toolchain_dir: Path, tmp_path: Path, templates: bool
) -> None:
    """Both ways of running Python: a template (an nsjail of its own uid, whose children
    run as the calls' uids: more uids live than nsjails) or an nsjail per call."""
    uids = range(BASE, BASE + COUNT)
    settings = {"sandbox_uid_base": str(BASE), "sandbox_uid_count": str(COUNT), "warm_jails": "1",
                "python_templates": str(templates).lower()}  # fmt: skip

    def one_uid_per_jail(running: dict[int, list[int]], jails: dict[int, int]) -> bool:
        return len(running) >= len(jails) if templates else len(running) == len(jails)

    with running_daemon(toolchain_dir, **settings) as d:
        app = write_app(tmp_path / "slow", "slow", {"slow": SLOW},
                        docs={"slow": {"timeoutMs": 60_000}})  # fmt: skip
        install_id = d.ship(app)["installId"]
        # The warm jails (one per kind: Python, JavaScript, TypeScript) are up.
        _until(lambda: len(_nsjails(uids)) >= 3, 10)
        warm = len(_nsjails(uids))
        _slow_call(d, install_id)
        _until(lambda: _in_sleep(uids), 10)  # the call's tool is in its sleep
        # The call took a waiting jail; the pool starts another once it has answered.
        jails = _nsjails(uids)
        assert len(jails) >= warm
        assert set(jails.values()) == {d.proc.pid}, jails
        assert one_uid_per_jail(_running(uids), jails)  # one uid per live jail

        d.proc.kill()  # kill -9: no shutdown runs
        d.proc.wait()
        took = _until(lambda: not _running(uids) and not _nsjails(uids), GONE_WITHIN_S)
        print(f"{len(jails)} jails (1 serving) gone {took * 1000:.0f} ms after kill -9")

        # Orphans that did not die with their runnerd (an older release, or a kill
        # between fork and prctl), on every uid of the range, the builders' too.
        with _old_runnerd_orphans(d.env.get("RUNNERD_NSJAIL") or _nsjail(), uids) as orphans:
            planted = _running(uids)
            assert sorted(planted) == list(uids)  # precondition: every uid has a live orphan
            planted_pids = {pid for pids in planted.values() for pid in pids}
            with serving_again(d) as again:
                assert d.http.get("/readyz").status_code == 200
                # Killed (and gone) before the daemon served, or warmed a single jail.
                still = {pid for pids in _running(uids).values() for pid in pids}
                assert not still & planted_pids, "an orphan outlived the restart"
                assert not set(_nsjails(uids)) & set(orphans)
                _slow_call(d, install_id)
                _until(lambda: _in_sleep(uids), 10)
                jails = _nsjails(uids)
                # Every live process of the range belongs to one of the new daemon's
                # jails, and each uid to one jail: the new jails share no uid with any
                # process still alive.
                assert set(jails.values()) == {again.pid}, jails
                running = _running(uids)
                assert one_uid_per_jail(running, jails)
                assert not {pid for pids in running.values() for pid in pids} & planted_pids
                again.kill()  # and kill -9 again, a call in flight: nothing stays
                again.wait()
                _until(lambda: not _running(uids) and not _nsjails(uids), GONE_WITHIN_S)


def _nsjail() -> str:
    from runnerd.run.jail import find_nsjail

    return find_nsjail()


@contextlib.contextmanager
def _as_uid(uid: int) -> Iterator[subprocess.Popen[bytes]]:
    """A process running as ``uid`` (as a jail's would), killed on the way out."""
    proc = subprocess.Popen(["/bin/sleep", "60"], user=uid, group=uid, extra_groups=[])
    try:
        _until(lambda: uid in _running(range(uid, uid + 1)), 5)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


def _mark(lock_dir: Path, uid: int) -> None:
    """The lock file of ``uid`` as a killed holder leaves it: marked, unlocked."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    (lock_dir / str(uid)).write_text("4242\n")


def test_a_lease_never_hands_out_the_uid_of_a_live_process(tmp_path: Path) -> None:
    """A holder killed with its lock leaves the uid marked: the next lease of it kills
    what still runs as it and takes another uid; the uid comes back once that is gone."""
    lock_dir = tmp_path / "uids"
    pool = UidPool(lock_dir, POOL_BASE, 3)  # runs POOL_BASE and +1; +2 is the builders'
    orphaned = POOL_BASE
    _mark(lock_dir, orphaned)
    with _as_uid(orphaned) as orphan:
        uid, lock = pool.lease()
        assert uid == POOL_BASE + 1  # whichever uid it tried first
        # The one uid left has a process: it is killed, and nothing is handed out until
        # it is gone.
        deadline = time.monotonic() + GONE_WITHIN_S
        while True:
            try:
                again, again_lock = pool.lease()
                break
            except SandboxUnavailable:
                assert time.monotonic() < deadline, "the orphan's uid never came back"
                time.sleep(0.01)
        assert again == orphaned
        assert orphan.poll() == -signal.SIGKILL  # handed out only once it was killed
        # A clean give-back clears the mark; a holder that did not see its jail gone
        # leaves it.
        lock.clean = True
        lock.close()
        assert (lock_dir / str(POOL_BASE + 1)).read_text() == ""
        assert (lock_dir / str(orphaned)).read_text() == f"{os.getpid()}\n"
        again_lock.close()
        assert (lock_dir / str(orphaned)).read_text() == f"{os.getpid()}\n"


def test_a_start_sweeps_only_what_no_live_runnerd_holds(tmp_path: Path) -> None:
    """The sweep at start kills the processes of the range's unheld uids (marked or not)
    and waits for them; a uid another live runnerd holds is not touched."""
    lock_dir = tmp_path / "uids"
    pool = UidPool(lock_dir, POOL_BASE + 10, 4)
    other = UidPool(lock_dir, POOL_BASE + 13, 2)  # another runnerd, overlapping range
    held_uid, held = other.lease()
    assert held_uid == POOL_BASE + 13  # the last of pool's range: its builders' uid
    _mark(lock_dir, POOL_BASE + 10)
    with (
        _as_uid(POOL_BASE + 10) as marked,
        _as_uid(POOL_BASE + 11) as unmarked,
        _as_uid(POOL_BASE + 13) as others_jail,
    ):
        killed, stuck = pool.sweep()
        assert (killed, stuck) == (2, [])
        # Gone when sweep returned (zombies of this test, their parent).
        assert _running(range(POOL_BASE + 10, POOL_BASE + 13)) == {}
        assert marked.wait(timeout=1) == unmarked.wait(timeout=1) == -signal.SIGKILL
        assert others_jail.poll() is None
        assert (lock_dir / str(POOL_BASE + 10)).read_text() == ""
    held.close()


# --- package builds ---------------------------------------------------------------------------


def _wheel(name: str, version: str) -> bytes:
    """A pure-Python wheel of one module (``VALUE = 42``)."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as whl:
        for path, data in files.items():
            whl.writestr(path, data)
    return out.getvalue()


class _SlowIndex(http.server.ThreadingHTTPServer):
    """A package index on loopback (PEP 503) serving one wheel, ``delay_s`` late: the
    build is in flight meanwhile."""

    def __init__(self, name: str, version: str, delay_s: float) -> None:
        self.wheel = _wheel(name, version)
        self.filename = f"{name}-{version}-py3-none-any.whl"
        self.name, self.delay_s = name, delay_s
        self.asked = threading.Event()
        super().__init__(("127.0.0.1", 0), _IndexHandler)


class _IndexHandler(http.server.BaseHTTPRequestHandler):
    server: _SlowIndex

    def do_HEAD(self) -> None:
        self.answer(body=False)

    def do_GET(self) -> None:
        self.answer(body=True)

    def answer(self, body: bool) -> None:
        index = self.server
        if self.path.rstrip("/") == f"/simple/{index.name}":
            digest = hashlib.sha256(index.wheel).hexdigest()
            data = (f'<html><body><a href="/files/{index.filename}#sha256={digest}">'
                    f"{index.filename}</a></body></html>").encode()  # fmt: skip
            kind = "text/html"
        elif self.path == f"/files/{index.filename}":
            if body:
                index.asked.set()
                time.sleep(index.delay_s)
            data, kind = index.wheel, "application/octet-stream"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_package_build_runs_as_the_builders_uid_of_the_range_under_its_lock(
    machine: Machine,
) -> None:
    uids = machine.sandbox.uids
    builder = uids.builder_uid
    assert builder == machine.settings.sandbox_uid_base + machine.settings.sandbox_uid_count - 1
    index = _SlowIndex("orphanprobe", "1.0", delay_s=1.5)
    server = threading.Thread(target=index.serve_forever, daemon=True)
    server.start()
    root = machine.envs.root.parent / "envs-orphans"
    envs = EnvManager(
        root,
        sandbox=machine.sandbox,
        settings=machine.settings,
        passthrough={"UV_DEFAULT_INDEX": f"http://127.0.0.1:{index.server_port}/simple"},
    )
    seen: dict[str, object] = {}
    try:

        def build() -> None:
            try:
                seen["env"] = envs.ensure_sync("python", ("orphanprobe==1.0",))
            except Exception as exc:
                seen["error"] = exc
                index.asked.set()

        building = threading.Thread(target=build)
        building.start()
        assert index.asked.wait(30), "the build never asked for the wheel"
        assert "error" not in seen, seen
        # The installer is waiting for the wheel: what runs of the build, and as whom.
        in_range = _running(range(builder, builder + 1))
        outside = _running(range(machine.settings.sandbox_uid_base - 1,
                                 machine.settings.sandbox_uid_base))  # fmt: skip
        lock = os.open(uids.lock_dir / str(builder), os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(lock)
        building.join(60)
        assert in_range.get(builder), "no process of the build ran as the builders' uid"
        assert outside == {}, "a build process ran as the old builder uid (base - 1)"
        assert "error" not in seen, seen
        env = seen.get("env")
        assert isinstance(env, Path) and (env / "orphanprobe" / "__init__.py").is_file()
        # Given back: unlocked, unmarked, nothing of the uid left.
        lock = os.open(uids.lock_dir / str(builder), os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert os.pread(lock, 16, 0) == b""
        finally:
            os.close(lock)
        assert _running(range(builder, builder + 1)) == {}
    finally:
        index.shutdown()
        index.server_close()


def test_one_build_at_a_time_holds_the_builders_uid(tmp_path: Path) -> None:
    """Two runnerds of one range: the second build waits for the builders' uid, and gets
    it once the first gives it back; a run never gets it."""
    lock_dir = tmp_path / "uids"
    first, second = UidPool(lock_dir, POOL_BASE + 20, 3), UidPool(lock_dir, POOL_BASE + 20, 3)
    uid, lock = first.lease_builder(1)
    assert uid == POOL_BASE + 22 == first.builder_uid
    with pytest.raises(SandboxUnavailable, match="held by another build"):
        second.lease_builder(0.2)
    runs = [second.lease() for _ in range(2)]
    assert {uid for uid, _ in runs} == {POOL_BASE + 20, POOL_BASE + 21}
    for _, held in runs:
        held.close()
    threading.Timer(0.2, lock.close).start()
    again, held = second.lease_builder(5)
    assert again == uid
    held.close()


def test_a_range_needs_a_uid_for_runs_beside_the_builders() -> None:
    from runnerd.config import load_settings
    from runnerd.errors import ConfigError

    with pytest.raises(ConfigError, match="sandbox_uid_count"):
        load_settings(env={}, flags={"sandbox_uid_count": 1})


# A runnerd building a package env, in a process of its own (killed under the build).
_BUILDER = r"""
import sys
from pathlib import Path
from runnerd.config import load_settings
from runnerd.run.machine import build_machine
from runnerd.run.package_envs import EnvManager
data, toolchain, base, count, root, index = sys.argv[1:]
settings = load_settings(env={}, flags={"data_dir": Path(data), "toolchain_dir": Path(toolchain),
                                        "sandbox_uid_base": int(base),
                                        "sandbox_uid_count": int(count)})
machine = build_machine(settings)
envs = EnvManager(Path(root), sandbox=machine.sandbox, settings=settings,
                  passthrough={"UV_DEFAULT_INDEX": index})
envs.ensure_sync("python", ("orphanprobe==2.0",))
"""


def test_a_build_dies_with_its_runnerd_and_the_next_build_gets_the_uid(machine: Machine) -> None:
    s = machine.settings
    builder = machine.sandbox.uids.builder_uid
    slow = _SlowIndex("orphanprobe", "2.0", delay_s=60)
    threading.Thread(target=slow.serve_forever, daemon=True).start()
    root = machine.envs.root.parent / "envs-killed-build"
    url = f"http://127.0.0.1:{slow.server_port}/simple"
    proc = subprocess.Popen(
        [sys.executable, "-c", _BUILDER, str(s.data_dir), str(s.toolchain_path),
         str(s.sandbox_uid_base), str(s.sandbox_uid_count), str(root), url],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert slow.asked.wait(60), proc.stderr.read() if proc.poll() is not None else "no ask"
        assert _running(range(builder, builder + 1)), "the build runs as the builders' uid"
        proc.kill()  # kill -9 of the runnerd, its build waiting for the wheel
        proc.wait()
        took = _until(lambda: not _running(range(builder, builder + 1)), GONE_WITHIN_S)
        print(f"the build's processes gone {took * 1000:.0f} ms after kill -9")
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        slow.shutdown()
        slow.server_close()
    # Its lock went with it, its mark stays: the next build takes the uid, checks it
    # first, and builds.
    assert (machine.sandbox.uids.lock_dir / str(builder)).read_text() == f"{proc.pid}\n"
    index = _SlowIndex("orphanprobe", "2.0", delay_s=0)
    threading.Thread(target=index.serve_forever, daemon=True).start()
    try:
        again = f"http://127.0.0.1:{index.server_port}/simple"
        envs = EnvManager(root, sandbox=machine.sandbox, settings=s,
                          passthrough={"UV_DEFAULT_INDEX": again})  # fmt: skip
        env = envs.ensure_sync("python", ("orphanprobe==2.0",))
        assert env is not None and (env / "orphanprobe" / "__init__.py").is_file()
    finally:
        index.shutdown()
        index.server_close()
