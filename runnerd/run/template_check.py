"""A template's child, verified from outside before it gets a byte of its call.

The template (sandbox/template_py.py) may run a package's import code, so nothing it says
is taken on its word: the daemon (root, the host's /proc) finds the child it forked,
takes the child's ends of the call's pipes itself (pidfd_getfd: they never pass through
the template), and checks, from /proc, that the child holds no channel to its template
or a sibling: ``verify`` lists what is checked. Each file is read once; the whole check
costs about a fifth of a millisecond (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from dataclasses import dataclass

from runnerd.errors import TemplateUnavailable

__all__ = ["TemplateView", "boot_ticks", "find_child", "pidfd_getfd", "verify"]

NAMESPACES = ("pid", "net", "mnt", "ipc", "uts")  # a child's own, unlike any other's
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def pidfd_getfd(pidfd: int, target_fd: int) -> int:
    """A copy, in this process, of descriptor ``target_fd`` of the process of ``pidfd``
    (close-on-exec). Raises OSError."""
    # 438: pidfd_getfd, on x86_64 and in the generic table.
    fd = _libc.syscall(ctypes.c_long(438), ctypes.c_long(pidfd), ctypes.c_long(target_fd), 0)
    if fd < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"pidfd_getfd: {os.strerror(errno)}")
    return int(fd)


def boot_ticks() -> int:
    """Now, in the clock of /proc/PID/stat's start times (ticks since boot): a start
    time read later is at least this."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLOCK_TICKS)


_FIELD = re.compile(r"^(\w+):\t(.*)$", re.M)
_SHARED = re.compile(r"^\S+ \S{3}s .*$", re.M)  # a maps line whose mapping is shared


def _read(path: str) -> str:
    """A /proc file whole, in as few system calls as it takes."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 1 << 16)]
        while chunks[-1]:
            chunks.append(os.read(fd, 1 << 16))
    finally:
        os.close(fd)
    return b"".join(chunks).decode("latin-1")


def _status(pid: int) -> dict[str, str]:
    return dict(_FIELD.findall(_read(f"/proc/{pid}/status")))


def _ns(pid: int) -> dict[str, str]:
    return {name: os.readlink(f"/proc/{pid}/ns/{name}") for name in (*NAMESPACES, "user")}


def _still(pid: int, name: str, ns: dict[str, str]) -> bool:
    """``pid`` is in the namespace ``ns[name]`` now: a process on its way out has left its
    namespaces (freed, their numbers free for new ones) before its pidfd says it exited."""
    try:
        return os.readlink(f"/proc/{pid}/ns/{name}") == ns[name]
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    return [int(p) for p in _read(f"/proc/{pid}/task/{pid}/children").split()]


@dataclass(frozen=True)
class TemplateView:
    """What the host's /proc says of one template process, read once at its start."""

    pid: int  # its host pid (nsjail's child: the init of the template's pid namespace)
    ns: dict[str, str]  # its namespaces, as /proc/PID/ns links
    filters: int  # its seccomp filters (nsjail's)

    @classmethod
    def read(cls, nsjail_pid: int) -> TemplateView:
        """The template nsjail ``nsjail_pid`` runs. Raises TemplateUnavailable."""
        try:
            kids = _children(nsjail_pid)
            if len(kids) != 1:
                raise TemplateUnavailable(f"nsjail {nsjail_pid} has {len(kids)} children, not 1")
            pid = kids[0]
            status = _status(pid)
            if status.get("NSpid", "").split()[-1:] != ["1"]:
                raise TemplateUnavailable("the template is not the init of its pid namespace")
            return cls(pid, _ns(pid), int(status.get("Seccomp_filters", "0")))
        except OSError as exc:
            raise TemplateUnavailable(f"the template is not in /proc: {exc}") from exc

    def threads(self) -> int:
        return int(_read(f"/proc/{self.pid}/stat").rsplit(")", 1)[1].split()[17])


def find_child(template: TemplateView, inner_pid: int) -> tuple[int, dict[str, str]]:
    """The host pid of the template's child whose pid in the template's namespace is
    ``inner_pid`` (what the template reported): looked up among the template's children
    in /proc, by their NSpid; and its /proc status (read once, for ``verify``: the child
    is set up and waiting by then). Raises TemplateUnavailable."""
    try:
        for pid in _children(template.pid):
            try:
                status = _status(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue  # another child, reaped meanwhile
            nspid = status.get("NSpid", "").split()
            if len(nspid) == 3 and nspid[1] == str(inner_pid) and nspid[2] == "1":
                return pid, status
        # The children file can miss a child while others fork and exit around it (its
        # documented caveat): then every process of /proc is looked at (a few ms, rare).
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = _read(f"/proc/{entry.name}/stat").rsplit(")", 1)[1].split()
                if int(stat[1]) != template.pid:
                    continue
                status = _status(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                continue
            nspid = status.get("NSpid", "").split()
            if len(nspid) == 3 and nspid[1] == str(inner_pid) and nspid[2] == "1":
                return int(entry.name), status
    except (OSError, ValueError) as exc:
        raise TemplateUnavailable(f"the child is not in /proc: {exc}") from exc
    raise TemplateUnavailable(f"no child {inner_pid} of the template in a pid namespace of its own")


def verify(
    pid: int,
    status: dict[str, str],
    *,
    template: TemplateView,
    asked_ticks: int,
    uid: int,
    fds: dict[int, int],
    siblings: dict[int, dict[str, str]],
    known: set[int],
    pending: set[int],
    unreported: int,
) -> dict[str, str]:
    """Check the template's child ``pid`` (host pid, with its ``status``, both from
    ``find_child``) before its call: its parent is ``template``; the template has one
    thread and no child but this one, ``known`` (host pids), ``pending`` (pids in its
    namespace, forks not yet found) and at most ``unreported`` more children in pid
    namespaces of their own (forks asked for whose report has not come yet); it started
    at ``asked_ticks`` or later; it has one thread and no child; its descriptors are
    exactly ``fds`` (number -> the inode of the call's pipe it must be); it maps nothing
    shared (a MAP_SHARED or memfd mapping from the template would be a channel); its
    pid, net, mount, ipc and uts namespaces are its own (not the template's, nor any of
    ``siblings``', host pid -> namespaces), its user namespace the template's;
    NoNewPrivs, seccomp with one filter more than the template, no capability, and
    ``uid`` (outside) as every uid. Returns its namespaces; raises TemplateUnavailable."""
    try:
        return _verify(
            pid, status, template, asked_ticks, uid, fds, siblings, known, pending, unreported
        )
    except (OSError, ValueError, IndexError, KeyError) as exc:
        where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
        raise TemplateUnavailable(f"the child could not be checked: {exc!r}{where}") from exc


def _verify(
    pid: int,
    status: dict[str, str],
    template: TemplateView,
    asked_ticks: int,
    uid: int,
    fds: dict[int, int],
    siblings: dict[int, dict[str, str]],
    known: set[int],
    pending: set[int],
    unreported: int,
) -> dict[str, str]:
    def no(why: str) -> TemplateUnavailable:
        return TemplateUnavailable(f"the template's child failed verification: {why}")

    stat = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
    # Fields after the name: state ppid ... (stat(5) numbers them from 1 with pid, comm).
    ppid, threads, started = int(stat[1]), int(stat[17]), int(stat[19])
    if ppid != template.pid:
        raise no(f"its parent is {ppid}, not the template")
    if started < asked_ticks:
        raise no("it started before its fork was asked")
    if threads != 1 or status.get("Threads") != "1":
        raise no(f"{threads} threads")
    if _children(pid):
        raise no("it has children")
    if template.threads() != 1:
        raise no("its template is no longer single-threaded")
    strangers = []
    for other in set(_children(template.pid)) - known - {pid}:
        try:
            nspid = _status(other).get("NSpid", "").split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # reaped meanwhile
        if len(nspid) == 3 and nspid[1] in {str(p) for p in pending}:
            continue  # forked and reported, not yet found
        if len(nspid) == 3 and nspid[2] == "1" and unreported > 0:
            unreported -= 1  # a fork asked for and not yet reported: as many as those
            continue
        strangers.append(other)
    if strangers:
        raise no(f"its template has other children: {sorted(strangers)}")
    for field, want in (("NoNewPrivs", "1"), ("Seccomp", "2"),
                        ("Seccomp_filters", str(template.filters + 1)),
                        ("CapEff", "0" * 16), ("CapPrm", "0" * 16), ("CapInh", "0" * 16),
                        ("CapAmb", "0" * 16)):  # fmt: skip
        if status.get(field, "").strip() != want:
            raise no(f"{field} is {status.get(field, '?').strip()}, not {want}")
    for field in ("Uid", "Gid"):
        if status[field].split() != [str(uid)] * 4:
            raise no(f"{field} is {status[field]}, not {uid}")
    if status.get("Groups", "").strip():
        raise no("it has supplementary groups")
    names = os.listdir(f"/proc/{pid}/fd")
    if sorted(int(n) for n in names) != sorted(fds):
        raise no(f"its descriptors are {sorted(int(n) for n in names)}, not {sorted(fds)}")
    for fd, inode in fds.items():
        if os.readlink(f"/proc/{pid}/fd/{fd}") != f"pipe:[{inode}]":
            raise no(f"its descriptor {fd} is not its call's pipe")
    shared = _SHARED.search(_read(f"/proc/{pid}/maps"))
    if shared is not None:
        raise no(f"it maps something shared: {shared.group(0)}")
    ns = _ns(pid)
    if ns["user"] != template.ns["user"]:
        raise no("it is in a user namespace of its own")
    others: list[tuple[int, dict[str, str]]] = [(template.pid, template.ns), *siblings.items()]
    for other_pid, seen in others:
        same = [
            name for name in NAMESPACES if ns[name] == seen[name] and _still(other_pid, name, ns)
        ]
        if same:
            raise no(f"it shares its {', '.join(same)} namespace with another process")
    return ns
