"""The zipapp under its own systemd unit, for real: a Debian 12 root booted with systemd as
PID 1 (systemd-nspawn -b), where ``python3 /root/runnerd.pyz service install`` writes the
shipped unit, ``systemctl start runnerd`` waits for READY=1, ``/readyz`` answers and both
tools of the example app run in their jails, with every directive of the unit in force.

The root (debootstrap: minbase, systemd, python3) is built once and cached in
``$RUNNERD_CI_CACHE/debian-12-systemd`` (default /var/cache/runnerd-ci, as
scripts/fresh-machine's roots); each boot writes to a tmpfs over it (--volatile=overlay)
and has a network namespace of its own with only ``lo`` (--private-network)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("RUNNERD_CI_CACHE", "/var/cache/runnerd-ci"))
ROOT = CACHE / "debian-12-systemd"
OFFER = {"discountPct": 12, "marginPct": 30, "termMonths": 24, "dealSize": 120000,
         "tier": "enterprise"}  # fmt: skip
TICKET = {"subject": "Invoice is wrong", "customer_tier": "enterprise"}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(os.geteuid() != 0, reason="systemd-nspawn -b needs root"),
    pytest.mark.skipif(
        not shutil.which("systemd-nspawn"),
        reason="needs systemd-nspawn (apt-get install systemd-container; scripts/setup does)",
    ),
    pytest.mark.skipif(
        not (ROOT / ".runnerd-complete").exists() and not shutil.which("debootstrap"),
        reason=f"needs debootstrap to build {ROOT} (apt-get install debootstrap)",
    ),
]


def _build_root() -> None:
    """The cached Debian 12 root: minbase with systemd (PID 1) and python3, nothing else."""
    if (ROOT / ".runnerd-complete").exists():
        return
    partial = ROOT.with_name(ROOT.name + ".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "debian-12-systemd.debootstrap.log", "wb") as log:
        subprocess.run(
            ["debootstrap", "--variant=minbase",
             "--include=systemd,systemd-sysv,dbus,python3,ca-certificates",
             "bookworm", str(partial), "http://deb.debian.org/debian"],
            stdout=log, stderr=subprocess.STDOUT, check=True, timeout=900,
        )  # fmt: skip
    for deb in (partial / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    (partial / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\t\tlocalhost\n")
    (partial / "etc/hostname").write_text("runnerd-systemd\n")
    (partial / ".runnerd-complete").touch()
    partial.rename(ROOT)


class Machine:
    """A booted container: ``run`` executes a command in all its namespaces (nsenter)."""

    def __init__(self, leader: int) -> None:
        self.leader = leader

    def run(self, *argv: str, check: bool = True, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        fixed = [f"{k}={v}" for k, v in {"PATH": PATH, "HOME": "/root", **(env or {})}.items()]
        done = subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", "env", "-i", *fixed, *argv],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if check:
            assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
        return done

    def journal(self) -> str:
        return self.run("journalctl", "-u", "runnerd", "--no-pager", "-n", "60", check=False).stdout


def _leader(nspawn: subprocess.Popen[bytes], log: Path) -> int:
    """The pid (on this host) of the container's systemd, once it runs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert nspawn.poll() is None, log.read_text()[-3000:]
        for task in Path(f"/proc/{nspawn.pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                    return int(child)
        time.sleep(0.1)
    raise AssertionError(f"the container's systemd never started:\n{log.read_text()[-3000:]}")


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    """The zipapp (built now, from this tree) at /root/runnerd.pyz in a booted Debian 12."""
    _build_root()
    build = subprocess.run([str(REPO / "scripts" / "build-zipapp")], cwd=REPO,
                           capture_output=True, text=True, timeout=900)  # fmt: skip
    assert build.returncode == 0, build.stderr
    pyz = tmp_path / "runnerd.pyz"
    shutil.copy(REPO / "dist" / "runnerd.pyz", pyz)
    log = tmp_path / "nspawn.log"
    with open(log, "wb") as out:
        nspawn = subprocess.Popen(
            ["systemd-nspawn", "--quiet", "-D", str(ROOT), "--volatile=overlay",
             "--private-network", "--register=no", "--keep-unit", "--console=passive",
             # nspawn's own filter refuses pidfd_getfd (EPERM); the unit's lets it through.
             "--system-call-filter=pidfd_getfd",
             f"--machine=runnerd-test-{os.getpid()}",
             f"--bind-ro={pyz}:/root/runnerd.pyz",
             f"--bind-ro={REPO / 'examples' / 'deal-desk'}:/srv/deal-desk", "-b"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    leader = 0
    try:
        leader = _leader(nspawn, log)
        booted = Machine(leader)
        deadline = time.monotonic() + 60
        while True:  # until its systemd listens, then until the boot is done
            state = booted.run("systemctl", "is-system-running", "--wait", check=False)
            early = "connect to bus" in state.stderr or state.stdout.strip() == "offline"
            if not early or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert state.stdout.strip() in ("running", "degraded"), state.stdout + state.stderr
        yield booted
    finally:
        if nspawn.poll() is None and leader:
            subprocess.run(["nsenter", "-t", str(leader), "-a", "systemctl", "poweroff"],
                           capture_output=True, timeout=30)  # fmt: skip
        try:
            nspawn.wait(timeout=30)
        except subprocess.TimeoutExpired:
            nspawn.send_signal(signal.SIGKILL)
            nspawn.wait(timeout=10)


def test_the_zipapp_serves_and_runs_tools_under_its_own_unit(machine: Machine) -> None:
    # From root's home, as the operator did: the unit cannot see /root
    # (ProtectHome=yes), so service install copies the file to /opt/runnerd.
    made = machine.run("python3", "/root/runnerd.pyz", "service", "install", "--bootstrap-email",
                       "ops@example.com", "--workspace", "Ops", "--json")  # fmt: skip
    found = json.loads(made.stdout)
    assert found["execStart"] == "/usr/bin/python3 /opt/runnerd/runnerd.pyz"
    assert "copied the zipapp to /opt/runnerd/runnerd.pyz" in made.stderr
    machine.run("systemctl", "daemon-reload")
    # Type=notify: start returns once the daemon said READY=1 (store open, warm jails up).
    started = machine.run("systemctl", "start", "runnerd", check=False, timeout=120)
    assert started.returncode == 0, machine.journal()
    # It unpacked itself where the unit lets it write (SHIV_ROOT), not into ~/.shiv.
    assert machine.run("ls", "/var/cache/runnerd/shiv").stdout.strip(), machine.journal()
    ready = machine.run("python3", "-c", "import urllib.request as u; print(u.urlopen("
                        "'http://127.0.0.1:8686/readyz', timeout=10).read().decode())")  # fmt: skip
    assert json.loads(ready.stdout)["status"] == "ready", ready.stdout
    client = {"RUNNERD_URL": "http://127.0.0.1:8686", "RUNNERD_API_KEY": found["apiKey"],
              "RUNNERD_WORKSPACE": found["workspaceId"]}  # fmt: skip
    runnerd = ("python3", "/opt/runnerd/runnerd.pyz")
    machine.run(*runnerd, "app", "deploy", "/srv/deal-desk", env=client)
    for step in ("publish", "install"):
        machine.run(*runnerd, "app", step, "--app", "deal-desk", "--version", "1", env=client)
    cases = (
        ("deal-desk/route_ticket", TICKET, "queue"),  # Python, the system's
        ("deal-desk/score_offer", OFFER, "decision"),
    )  # TypeScript, the bundled Node
    for reference, value, field in cases:
        ran = json.loads(machine.run(*runnerd, "tools", "run", reference, "--input",
                                     json.dumps(value), "--json", env=client,
                                     check=False).stdout)  # fmt: skip
        assert ran["status"] == "succeeded", f"{ran}\n{machine.journal()}"
        assert field in ran["output"]
    # The Python tool ran in a child of its template: the unit lets the daemon take the
    # child's pipes (pidfd_getfd) and the template's jail start (BindPaths=/dev/null).
    journal = machine.run("journalctl", "-u", "runnerd", "--no-pager").stdout
    assert "its calls run in fresh nsjails" not in journal, journal[-3000:]
    # A stop drains and exits 0: the unit ends as a success, not a failure.
    machine.run("systemctl", "stop", "runnerd", timeout=90)
    shown = machine.run("systemctl", "show", "runnerd", "-p", "Result", "-p", "ExecMainStatus")
    assert "Result=success" in shown.stdout and "ExecMainStatus=0" in shown.stdout, shown.stdout
