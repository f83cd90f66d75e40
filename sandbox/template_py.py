"""runnerd's Python template: a prepared interpreter that forks one fresh sandbox per call.

Runs inside its own nsjail (runnerd/run/templates.py builds it): root of its own user
namespace (capabilities there only; inside uid 0 is the template's leased outside uid,
inside uids 1.. are the sandbox pool's), no network, read-only mounts, no /proc, the
seccomp policy sandbox/template.kafel. Standard library and ctypes only.

argv: CONTROL_FD HARNESS_SOURCE MODE [ENV_DIR]
At start it loads the harness (its functions, not its main: those run in each child),
imports the package set's modules when there is an ENV_DIR (never any tool's code),
checks that it is single-threaded, and says ``R`` on CONTROL_FD (a SOCK_SEQPACKET
socket), or ``!`` and a reason, and exits.

Then one message per call, with no descriptor: ``C ID UID AS_MB CPU_S FSIZE_MB NOFILE
NPROC TMP_MB EGRESS``. Answers: ``F ID PID`` (the child's pid in the template's
namespace) once forked, with the read end of the child's ready pipe (SCM_RIGHTS: no
call data ever flows there); ``X ID STATUS`` (its wait status) once reaped; ``E ID
REASON`` if it could not fork. The template never holds a call's pipes: the child sets
up its sandbox (see ``_child``), makes its own pipes, says ``R`` on the ready pipe and
closes it, and waits; the daemon takes its ends of the pipes (pidfd_getfd), verifies the
child from /proc, and writes one byte, then the request; the child then runs the
harness's main exactly as a fresh jail does.
"""

import array
import ast
import ctypes
import fcntl
import os
import random
import resource
import selectors
import socket
import struct
import sys
import threading

# Namespaces and mounts (linux/sched.h, linux/mount.h).
CLONE_THREAD, CLONE_SIGHAND, CLONE_VM = 0x10000, 0x800, 0x100
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
CAPABILITY_V3 = 0x20080522
SIOCSIFFLAGS, IFF_UP_LOOPBACK_RUNNING = 0x8914, 0x1 | 0x8 | 0x40
SYS_PIVOT_ROOT = 155
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2

# The child's fds: as the harness expects them (argv RESULT_FD = 3); the daemon's ends of
# the request, logs and result pipes (it takes them, then the child closes them); the
# ready pipe while the child sets up; where pipes are made before they are moved.
RESULT_FD = 3
DAEMON_FDS = (5, 6, 7)
READY_FD, SCRATCH_FD = 9, 10
NEW_ROOT = "/tmp"  # exists in the template's root; a child mounts its own root over it
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
READY, GO = b"R", b"\0"

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source, target, fstype, flags, data=None):
    _check(
        _libc.mount(
            source.encode() if source else None, target.encode(),
            fstype.encode() if fstype else None, ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )  # fmt: skip


def _unshare(flags):
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


# --- the second seccomp filter: what the template may do beyond a tool -------------------
AUDIT_ARCH_X86_64 = 0xC000003E
X32_BIT = 0x40000000
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38
CLONE_NAMESPACES = 0x7E020000
SYS_CLONE, SYS_CLONE3 = 56, 435
# unshare, setns, mount, umount2, pivot_root, chroot, open_tree, move_mount, fsopen,
# fsconfig, fsmount, fspick, mount_setattr, open_tree_attr (x86_64 numbers).
DENIED = (272, 308, 165, 166, 155, 161, 428, 429, 430, 431, 432, 433, 442, 467)
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def _filter():
    """Classic BPF: other arches and the x32 ABI are killed; EPERM for ``DENIED`` and for
    clone with any namespace flag (or any high bit), ENOSYS for clone3; the rest allowed
    (the template's own filter, which the tool policy's denials are in, still runs).
    A jump's offset counts from the next instruction; jumps go forward only."""
    n = len(DENIED)
    a = 6 + n  # the clone3 check
    prog = [
        (_LD, 0, 0, 4),  # 0: seccomp_data.arch
        (_JEQ, 1, 0, AUDIT_ARCH_X86_64),  # 1
        (_RET, 0, 0, RET_KILL_PROCESS),  # 2
        (_LD, 0, 0, 0),  # 3: seccomp_data.nr
        (_JGE, 0, 1, X32_BIT),  # 4
        (_RET, 0, 0, RET_KILL_PROCESS),  # 5
        *((_JEQ, n + 3 - i, 0, nr) for i, nr in enumerate(DENIED)),  # 6..: to a + 4
        (_JEQ, 0, 1, SYS_CLONE3),  # a
        (_RET, 0, 0, RET_ERRNO | ENOSYS),  # a + 1
        (_JEQ, 2, 0, SYS_CLONE),  # a + 2: to a + 5
        (_RET, 0, 0, RET_ALLOW),  # a + 3
        (_RET, 0, 0, RET_ERRNO | EPERM),  # a + 4
        (_LD, 0, 0, 16 + 4),  # a + 5: args[0], high half
        (_JEQ, 0, 3, 0),  # a + 6: to a + 10 unless 0
        (_LD, 0, 0, 16),  # a + 7: args[0], low half
        (_JSET, 1, 0, CLONE_NAMESPACES),  # a + 8: to a + 10
        (_RET, 0, 0, RET_ALLOW),  # a + 9
        (_RET, 0, 0, RET_ERRNO | EPERM),  # a + 10
    ]
    assert len(prog) == a + 11

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte),
                    ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]  # fmt: skip

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]

    insns = (Insn * len(prog))(*[Insn(*i) for i in prog])
    return Prog(len(prog), insns), insns


_PROG, _INSNS = _filter()


# --- the harness and the package set --------------------------------------------------------
def _load_harness(source_path, mode):
    """The harness as a module whose main has not run: its top-level calls (``_warm`` and
    ``main``) are left out here; ``_warm`` runs now (what it warms is inherited by every
    child), ``main`` in each child."""
    with open(source_path, "rb") as f:
        tree = ast.parse(f.read(), "/sandbox/harness_py.py")
    calls = []
    while (
        tree.body
        and isinstance(tree.body[-1], ast.Expr)
        and isinstance(tree.body[-1].value, ast.Call)
    ):
        calls.append(tree.body.pop())
    names = {getattr(c.value.func, "id", None) for c in calls}
    if not names <= {"_warm", "main"} or "main" not in names:
        raise RuntimeError(f"the harness ends in calls the template does not know: {names}")
    module = type(sys)("harness")
    module.__file__ = "/sandbox/harness_py.py"
    exec(compile(tree, "/sandbox/harness_py.py", "exec"), module.__dict__)
    module._warm(mode != "bytecode")
    return module


def _top_level_names(env_dir):
    """The import names of the packages in ``env_dir``: each dist-info's top_level.txt, or
    the first part of the paths its RECORD lists."""
    names = set()
    try:
        entries = os.listdir(env_dir)
    except OSError:
        return []
    for entry in entries:
        if not entry.endswith(".dist-info"):
            continue
        info = os.path.join(env_dir, entry)
        try:
            with open(os.path.join(info, "top_level.txt")) as f:
                names.update(line.strip() for line in f if line.strip())
            continue
        except OSError:
            pass
        try:
            with open(os.path.join(info, "RECORD")) as f:
                for line in f:
                    head = line.split(",", 1)[0].split("/", 1)
                    first = head[0]
                    if first.endswith((".dist-info", ".data")) or first in (
                        "..",
                        "__pycache__",
                        "bin",
                    ):
                        continue
                    if len(head) == 1:
                        if first.endswith(".py"):
                            names.add(first[:-3])
                        elif ".cpython-" in first or first.endswith(".abi3.so"):
                            names.add(first.split(".", 1)[0])
                    else:
                        names.add(first)
        except OSError:
            pass
    return sorted(n for n in names if n.isidentifier())


def _import_packages(env_dir):
    imported = []
    for name in _top_level_names(env_dir):
        try:
            __import__(name)
            imported.append(name)
        except BaseException:
            pass
    return imported


def _single_threaded():
    """True when this process has one thread: the kernel refuses unshare(CLONE_VM...)
    to a thread group of more than one (no /proc needed), and Python agrees."""
    if threading.active_count() != 1:
        return False
    return _libc.unshare(ctypes.c_int(CLONE_THREAD | CLONE_SIGHAND | CLONE_VM)) == 0


# --- the child -----------------------------------------------------------------------------
def _reseed():
    """What must differ between two fresh processes: Python's ``random`` (it also reseeds
    itself at fork), numpy's legacy global generator when a package set loaded it.
    os.urandom, secrets and uuid4 read the kernel; ssl's OpenSSL reseeds at fork;
    tempfile's names reseed when the pid changes (every child is pid 1; the template is
    not, and a child never forks a sibling). Not renewed: the str hash seed and the
    address-space layout (shared by one template's children until it is recycled)."""
    random.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        try:  # noqa: SIM105 - no contextlib here: it would be one more import
            np_random.seed()
        except BaseException:  # a numpy without the legacy global generator
            pass


def _make_pipes():
    """The call's pipes, made by the child itself: its ends at 0 (the request), 1 and 2
    (the logs), RESULT_FD; the daemon's ends at DAEMON_FDS, where the daemon takes them
    (pidfd_getfd) before it writes a byte of the request."""
    pipes = [os.pipe(), os.pipe(), os.pipe()]  # request, logs, result
    flat = [fd for pair in pipes for fd in pair]
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, SCRATCH_FD) for fd in flat]
    for fd in flat:
        os.close(fd)
    (in_r, in_w), (log_r, log_w), (res_r, res_w) = zip(high[::2], high[1::2], strict=True)
    for fd, target in (
        (in_r, 0),
        (log_w, 1),
        (log_w, 2),
        (res_w, RESULT_FD),
        (in_w, DAEMON_FDS[0]),
        (log_r, DAEMON_FDS[1]),
        (res_r, DAEMON_FDS[2]),
    ):
        os.dup2(fd, target, inheritable=target <= 2)  # fmt: skip
    for fd in high:
        os.close(fd)


def _loopback_up():
    """``lo`` up in the child's new network namespace, as nsjail does for a jail (the
    egress relay listens there; a refused connection is refused, not unreachable)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP_LOOPBACK_RUNNING))


def _clear_inheritable():
    """Empty the inheritable capabilities nsjail's --keep_caps left (the effective and
    permitted ones went with uid 0): the daemon checks that the child has none."""
    header = (ctypes.c_uint32 * 2)(CAPABILITY_V3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")


def _child(fields, ready, entries, harness, argv, egress_socket):
    """In the fork: become a fresh sandbox, make the call's pipes, say ready, and once the
    daemon has verified this process from outside (its one byte on stdin), run the
    harness's main. Never returns."""
    uid = int(fields[2])
    as_mb, cpu_s, fsize_mb, nofile, nproc, tmp_mb = (int(x) for x in fields[3:9])
    egress = fields[9] == "1"
    if ready != READY_FD:
        os.dup2(ready, READY_FD, inheritable=False)
    os.closerange(0, READY_FD)  # every other descriptor: control, pidfds, the template's
    os.closerange(READY_FD + 1, 1 << 16)
    try:
        _unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)
        _loopback_up()
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=65536,mode=755")
        for name in entries:
            os.mkdir(f"{NEW_ROOT}/{name}", 0o755)
            _mount(f"/{name}", f"{NEW_ROOT}/{name}", None, MS_BIND | MS_REC)
        # Of /sandbox, the harness only, as a fresh jail sees it (not this file).
        os.mkdir(NEW_ROOT + "/sandbox", 0o755)
        os.close(os.open(NEW_ROOT + argv[0], os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(argv[0], NEW_ROOT + argv[0], None, MS_BIND)
        if egress and egress_socket:
            os.makedirs(NEW_ROOT + os.path.dirname(egress_socket), 0o755, exist_ok=True)
            os.close(os.open(NEW_ROOT + egress_socket, os.O_CREAT | os.O_WRONLY, 0o644))
            _mount(egress_socket, NEW_ROOT + egress_socket, None, MS_BIND)
        os.mkdir(f"{NEW_ROOT}/tmp", 0o1777)
        _mount("tmpfs", f"{NEW_ROOT}/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
               f"size={tmp_mb * 1024 * 1024},mode=1777")  # fmt: skip
        _mount(None, NEW_ROOT, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.chdir(NEW_ROOT)
        _check(_libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
        _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
        os.chdir("/tmp")
        socket.sethostname("runnerd")
        os.setsid()
        mb = 1024 * 1024
        for limit, value in (
            (resource.RLIMIT_AS, as_mb * mb if as_mb > 0 else resource.RLIM_INFINITY),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_CPU, cpu_s),
            (resource.RLIMIT_FSIZE, fsize_mb * mb),
            (resource.RLIMIT_NOFILE, nofile),
            (resource.RLIMIT_NPROC, nproc),
        ):
            resource.setrlimit(limit, (value, value))
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # every capability goes with uid 0
        _clear_inheritable()
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, *map(ctypes.c_ulong, (1, 0, 0, 0))), "no_new_privs")
        _check(_libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(_PROG),
                           ctypes.c_ulong(0), ctypes.c_ulong(0)),
               "seccomp")  # fmt: skip
        _reseed()
        os.environ.clear()
        os.environ.update(ENV)
        sys.argv[:] = argv
        _make_pipes()
        os.write(READY_FD, READY)
        os.close(READY_FD)
    except BaseException as exc:
        try:
            os.write(READY_FD, f"E{type(exc).__name__}: {exc}".encode()[:1000])
        finally:
            os._exit(126)
    # The daemon's one byte: it has taken its ends and verified this process. Nothing of
    # the request has come yet; an end of file is the daemon giving up on this child.
    if os.read(0, 1) != GO:
        os._exit(126)
    for fd in DAEMON_FDS:
        os.close(fd)
    try:
        harness.main()
    finally:
        os._exit(1)  # main ends in os._exit(0); anything else is a harness failure


# --- the loop ------------------------------------------------------------------------------
def _say(control, text, fds=()):
    try:
        if fds:
            rights = array.array("i", fds).tobytes()
            control.sendmsg([text.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
        else:
            control.send(text.encode())
    except OSError:
        os._exit(0)  # the daemon has gone


def serve(control, harness, argv, egress_socket):
    """Fork one child per message; report each child's pid (with the read end of its
    ready pipe) and its exit. No descriptor ever comes from the daemon."""
    entries = sorted(n for n in os.listdir("/") if n not in ("tmp", "proc", "run", "sandbox"))
    own_pid_ns = os.pidfd_open(os.getpid())
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    children = {}  # pidfd -> (call id, pid)
    while True:
        for key, _ in selector.select():
            if key.fileobj is not control:
                pidfd = key.fileobj
                call_id, pid = children.pop(pidfd)
                selector.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                _say(control, f"X {call_id} {status}")
                continue
            try:
                data, ancdata, _, _ = control.recvmsg(4096, socket.CMSG_SPACE(16 * 4))
            except InterruptedError:
                continue
            if not data:
                os._exit(0)  # the daemon closed its end
            for level, kind, payload in ancdata:  # never sent; closed if it were
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    for fd in memoryview(payload).cast("i"):
                        os.close(fd)
            fields = data.decode().split()
            call_id = fields[1] if len(fields) > 1 else "?"
            if fields[0] != "C" or len(fields) != 10:
                _say(control, f"E {call_id} bad request")
                continue
            if not _single_threaded():
                _say(control, f"E {call_id} the template is no longer single-threaded")
                os._exit(3)
            ready_r, ready_w = os.pipe()
            try:
                _unshare(CLONE_NEWPID)
                pid = os.fork()
            except OSError as exc:
                os.close(ready_r)
                os.close(ready_w)
                _say(control, f"E {call_id} fork: {exc}")
                continue
            if pid == 0:
                try:  # a child never comes back into this loop, whatever it raised
                    selector.close()
                    control.detach()
                    _child(fields, ready_w, entries, harness, argv, egress_socket)
                finally:
                    os._exit(126)
            _check(_libc.setns(own_pid_ns, CLONE_NEWPID), "setns")
            os.close(ready_w)
            pidfd = os.pidfd_open(pid)
            children[pidfd] = (call_id, pid)
            selector.register(pidfd, selectors.EVENT_READ)
            _say(control, f"F {call_id} {pid}", (ready_r,))
            os.close(ready_r)


def main():
    control = socket.socket(fileno=int(sys.argv[1]))
    harness_source, mode = sys.argv[2], sys.argv[3]
    env_dir = sys.argv[4] if len(sys.argv) > 4 else None
    egress_socket = os.environ.get("RUNNERD_EGRESS_SOCKET") or None
    try:
        harness = _load_harness(harness_source, mode)
        imported = []
        if env_dir is not None:
            sys.path.insert(0, env_dir)
            imported = _import_packages(env_dir)
            sys.path.remove(env_dir)  # the harness's main puts it back, as in a fresh jail
    except BaseException as exc:
        _say(control, f"! the harness does not load: {type(exc).__name__}: {exc}")
        os._exit(2)
    if not _single_threaded():
        _say(control, f"! threads are running after the imports ({threading.active_count()} "
                      "seen by Python): a template must be single-threaded to fork")  # fmt: skip
        os._exit(3)
    argv = ["/sandbox/harness_py.pyc" if mode == "bytecode" else "/sandbox/harness_py.py",
            str(RESULT_FD), mode, *([env_dir] if env_dir else [])]  # fmt: skip
    _say(control, "R " + ",".join(imported))
    serve(control, harness, argv, egress_socket)


main()
