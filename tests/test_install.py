"""Installing runnerd as a user would: the built wheel (not the source tree) in a clean
venv outside the repository, used to bootstrap, serve, deploy the example app and run
both its tools."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from daemon import free_port
from runnerd.run.runtimes import system_node

REPO = Path(__file__).resolve().parent.parent
OFFER = {
    "discountPct": 12,
    "marginPct": 30,
    "termMonths": 24,
    "dealSize": 120000,
    "tier": "enterprise",
}
TICKET = {"subject": "Invoice is wrong", "customer_tier": "enterprise"}

pytestmark = [pytest.mark.jail, pytest.mark.network]


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done  # type: ignore[no-any-return]


def _serves_the_example(runnerd: list[str], base: Path, env: dict[str, str]) -> None:
    """Bootstrap, serve, deploy the example app and run both its tools with ``runnerd``
    (a command line), from ``base`` (outside the repository)."""
    data = base / "data"
    env = {**env, "RUNNERD_DATA_DIR": str(data),
           "RUNNERD_SANDBOX_UID_BASE": "650000", "RUNNERD_SANDBOX_UID_COUNT": "64"}  # fmt: skip
    boot = json.loads(
        _run([*runnerd, "admin", "bootstrap", "--workspace", "W", "--email", "w@example.com"],
             env=env, cwd=base).stdout
    )  # fmt: skip
    port = free_port()
    env = {**env, "RUNNERD_APPS_PORT": str(free_port())}  # not port + 1 by chance
    log = open(base / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([*runnerd, "serve", "--port", str(port)], env=env, cwd=base,
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        client = {**env, "RUNNERD_URL": url, "RUNNERD_API_KEY": boot["apiKey"],
                  "RUNNERD_WORKSPACE": boot["workspaceId"]}  # fmt: skip
        app = base / "deal-desk"
        shutil.copytree(REPO / "examples" / "deal-desk", app)
        deployed = json.loads(
            _run([*runnerd, "app", "deploy", str(app), "--json"], env=client, cwd=base).stdout
        )
        version = deployed["version"]["version"]
        for step in ("publish", "install"):
            _run([*runnerd, "app", step, "--app", "deal-desk", "--version", version],
                 env=client, cwd=base)  # fmt: skip
        cases = (("deal-desk/score_offer", OFFER, "decision"),
                 ("deal-desk/route_ticket", TICKET, "queue"))  # fmt: skip
        for reference, value, field in cases:
            argv = [*runnerd, "tools", "run", reference, "--input", json.dumps(value), "--json"]
            ran = json.loads(_run(argv, env=client, cwd=base).stdout)
            assert ran["status"] == "succeeded", ran
            assert field in ran["output"]
        page = httpx.get(f"{url}/")
        assert page.status_code == 200 and "app.js" in page.text  # the page ships too
    finally:
        proc.terminate()
        code = proc.wait(timeout=60)
        log.close()
    assert code == 0, (base / "serve.log").read_text()[-3000:]


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder outside the repository, enterable by jail uids."""
    base = Path(tempfile.mkdtemp(prefix="runnerd-install-", dir="/tmp"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_the_wheel_in_a_clean_venv_serves_the_example(toolchain_dir: Path, outside: Path) -> None:
    dist = outside / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(REPO)])
    [wheel] = dist.glob("runnerd-*.whl")
    closed = outside / "root"  # a venv where jail uids cannot reach, like one under /root
    closed.mkdir(mode=0o700)
    venv = closed / "venv"
    _run(["/usr/bin/python3", "-m", "venv", str(venv)])
    # With a Node from PyPI when the system has no Node >= 20, as the quickstart does.
    extra = "" if system_node() else "[node]"
    _run([str(venv / "bin/pip"), "install", "--quiet", f"{wheel}{extra}"])
    located = _run([str(venv / "bin/python"), "-c", "import runnerd; print(runnerd.__file__)"],
                   cwd=outside).stdout  # fmt: skip
    assert located.startswith(str(venv)), located  # the wheel's runnerd, not the tree's
    env = {"PATH": os.environ["PATH"], "HOME": str(outside),
           "RUNNERD_TOOLCHAIN_DIR": str(toolchain_dir)}  # fmt: skip
    _serves_the_example([str(venv / "bin/runnerd")], outside, env)
    # The sandbox harnesses were copied where jails can mount them.
    [harnesses] = (outside / "data" / "harness").iterdir()
    assert sorted(path.name for path in harnesses.iterdir()) == [
        "harness_js.cjs", "harness_py.py", "harness_py.pyc", "seccomp.kafel",
        "template.kafel", "template_py.py",
    ]  # fmt: skip


def test_the_zipapp_runs_from_any_folder_with_its_own_toolchain(outside: Path) -> None:
    """dist/runnerd.pyz with the system Python: no venv, no pip; a TypeScript tool deploys
    with the toolchain inside the file (no RUNNERD_TOOLCHAIN_DIR, nothing fetched)."""
    _run([str(REPO / "scripts" / "build-zipapp")], cwd=REPO)
    pyz = outside / "runnerd.pyz"
    shutil.copy(REPO / "dist" / "runnerd.pyz", pyz)
    home = outside / "root"  # shiv unpacks into ~/.shiv, a folder jail uids cannot reach
    home.mkdir(mode=0o700)
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    _serves_the_example(["/usr/bin/python3", str(pyz)], outside, env)
    assert not (outside / "data" / "toolchain").exists()  # the bundled one served
