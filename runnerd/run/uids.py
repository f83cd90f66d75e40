"""The outside uids of jails: one per live jail, host-wide, never handed out while a
process of it runs.

A lock file per uid, in a host-wide folder (``uid_lock_dir``): a uid is out while its
file is locked (flock), so runnerds with overlapping ranges never share one, and marked
(the holder's pid in it) until its jail is seen gone. A holder killed with its lock, or a
jail whose processes were not seen gone, leaves the mark: the uid's next lease looks in
/proc first, kills what still runs as it and takes another uid. At start a runnerd sweeps
its range (``UidPool.sweep``): whatever runs as a uid no live runnerd holds is killed and
waited for. The range's last uid is the package builders'.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from runnerd.errors import SandboxUnavailable
from runnerd.limits import LEFTOVER_WAIT_S

__all__ = ["UidLock", "UidPool", "kill_leftovers"]


class _Exits(Protocol):
    @property
    def returncode(self) -> int | None: ...


def _processes_of(uid: int, pids: list[str] | None = None) -> list[str]:
    """Those of ``pids`` (all, from the host's /proc, by default) whose real uid is ``uid``
    and that still run: a zombie is dead, its parent (the host's init, once nsjail is gone)
    reaps it, and it holds no memory, no CPU and no file."""
    return _processes_by_uid(range(uid, uid + 1), pids).get(uid, [])


def _processes_by_uid(uids: range, pids: Iterable[str] | None = None) -> dict[int, list[str]]:
    """The running (not zombie) processes among ``pids`` (all, by default) whose real
    uid is one of ``uids``, by uid: one walk of /proc."""
    found: dict[int, list[str]] = {}
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
                    uid = int(line.split()[1])
                    if uid in uids:
                        found.setdefault(uid, []).append(pid)
                    break
    return found


def _kill(uid: int, pids: list[str]) -> None:
    """SIGKILL those of ``pids`` that still run as ``uid``, each through a pidfd opened
    before its uid is checked, so a pid reused meanwhile is never hit."""
    for pid in pids:
        with contextlib.suppress(OSError):
            pidfd = os.pidfd_open(int(pid))
            try:
                if _processes_of(uid, [pid]):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            finally:
                os.close(pidfd)


def kill_leftovers(uid: int, within_s: float) -> list[str]:
    """SIGKILL every process of ``uid`` (a jail's own outside uid, leased to it alone: no
    other process runs as it) until none is left running, for at most ``within_s``; the
    pids still there then."""
    deadline = time.monotonic() + within_s
    while True:
        left = _processes_of(uid)
        if not left or time.monotonic() >= deadline:
            return left
        _kill(uid, left)
        time.sleep(0.01)


class UidLock:
    """A leased uid: its lock file, open and locked (flock) until ``close``.

    While the uid is out its lock file holds the holder's pid (a mark). ``close`` clears
    the mark only when nothing of the uid can still run: nsjail exited by itself
    (``watch``: it has reaped the jail's init, whose exit waited for every process of
    the namespace) or the jail's leftovers were seen gone (``clean``). A holder killed
    with its lock, or a jail not seen gone, leaves the mark: the uid's next lease looks
    for its processes before anything runs as it."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self.clean = False  # nothing of the uid runs: close clears the mark
        self._fd = fd
        self._proc: _Exits | None = None
        self._lock = threading.Lock()

    def watch(self, proc: _Exits) -> None:
        """The jail's nsjail: when it exited by itself, nothing of the uid runs."""
        self._proc = proc

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd < 0:
            return
        code = self._proc.returncode if self._proc is not None else None
        try:
            if self.clean or (code is not None and code >= 0):
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # the flock goes with the last descriptor of the file


class UidPool:
    """Outside uids for jails, one per live jail, across processes: a lock file per uid,
    in a host-wide folder, so daemons with overlapping ranges never share a uid, and a
    uid is never handed out while a process of it runs (see ``UidLock``).

    Of ``[base, base + count)``, the last uid is the package builders' (``lease_builder``,
    one build at a time per host), the others are runs' (``lease``)."""

    def __init__(self, lock_dir: Path, base: int, count: int) -> None:
        if base < 1000:
            raise ValueError("sandbox uids must be unprivileged (>= 1000)")
        if count < 2:
            raise ValueError("sandbox_uid_count must be at least 2 (one uid is the builders')")
        self.lock_dir = lock_dir
        self.base = base
        self.count = count
        self.builder_uid = base + count - 1
        lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    @property
    def uids(self) -> range:
        """Every uid of the range: the runs' and the builders'."""
        return range(self.base, self.base + self.count)

    def _try(self, uid: int) -> int | None:
        """The lock file of ``uid``, open and locked; None when another holds it."""
        fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def _claim(self, uid: int, fd: int) -> bool:
        """With ``uid``'s lock held: mark it ours, unless a process of it still runs (its
        lock file marked: a holder went without seeing its jail gone): those are sent
        SIGKILL and False says to take another uid."""
        if os.pread(fd, 1, 0):
            left = _processes_of(uid)
            if left:
                _kill(uid, left)
                return False
        mark = f"{os.getpid()}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, mark, 0)
        return True

    def lease(self) -> tuple[int, UidLock]:
        """A free uid and the lock that holds it (close the lock to give it back)."""
        runs = self.count - 1
        start = random.randrange(runs)
        for i in range(runs):
            uid = self.base + (start + i) % runs
            fd = self._try(uid)
            if fd is None:
                continue
            if self._claim(uid, fd):
                return uid, UidLock(uid, fd)
            os.close(fd)  # still marked: the next lease looks again
        raise SandboxUnavailable(f"all {runs} sandbox uids are in use")

    def lease_builder(self, wait_s: float) -> tuple[int, UidLock]:
        """The builders' uid, once no other build (of any runnerd on the host) holds it,
        for at most ``wait_s``; what a killed build left of it is killed first. Blocks:
        called from a build's own thread."""
        uid = self.builder_uid
        deadline = time.monotonic() + wait_s
        while (fd := self._try(uid)) is None:
            if time.monotonic() >= deadline:
                raise SandboxUnavailable(
                    f"the package builders' uid {uid} stayed held by another build for {wait_s:g} s"
                )
            time.sleep(0.02)
        if os.pread(fd, 1, 0) and kill_leftovers(uid, LEFTOVER_WAIT_S):
            os.close(fd)
            raise SandboxUnavailable(f"processes of the builders' uid {uid} do not die")
        self._claim(uid, fd)
        return uid, UidLock(uid, fd)

    def sweep(self, within_s: float = LEFTOVER_WAIT_S) -> tuple[int, list[int]]:
        """At start, before any uid is handed out: whatever runs as a uid of this range
        whose lock no live runnerd holds (a killed runnerd's orphans) is killed and
        waited for (``within_s`` at most), and those uids' marks are cleared. The number
        of processes killed, and the uids whose processes outlived the wait (still
        marked: their next lease looks again)."""
        found = _processes_by_uid(self.uids)
        marked = set()
        with contextlib.suppress(OSError), os.scandir(self.lock_dir) as entries:
            for entry in entries:
                if entry.name.isdigit() and int(entry.name) in self.uids:
                    with contextlib.suppress(OSError):
                        if entry.stat().st_size > 0:
                            marked.add(int(entry.name))
        held: dict[int, int] = {}
        try:
            for uid in sorted(set(found) | marked):
                fd = self._try(uid)
                if fd is not None:  # else a live runnerd's jail: not ours to touch
                    held[uid] = fd
            killed = sum(len(found.get(uid, [])) for uid in held)
            deadline = time.monotonic() + within_s
            left = {uid: found[uid] for uid in held if uid in found}
            while left and time.monotonic() < deadline:
                for uid, pids in left.items():
                    _kill(uid, pids)
                time.sleep(0.01)
                now = _processes_by_uid(self.uids)
                left = {uid: now[uid] for uid in held if uid in now}
            for uid, fd in held.items():
                if uid not in left:
                    os.ftruncate(fd, 0)
        finally:
            for fd in held.values():
                os.close(fd)
        return killed, sorted(left)
