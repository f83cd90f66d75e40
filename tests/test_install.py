"""Installing runnerd as a user would: the built wheel (not the source tree) in a clean
venv outside the repository, used to bootstrap, serve, deploy the example app and run
both its tools."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from daemon import free_port

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


def test_the_wheel_in_a_clean_venv_serves_the_example(toolchain_dir: Path) -> None:
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="runnerd-wheel-", dir="/tmp"))
    base.chmod(0o711)
    try:
        dist = base / "dist"
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--quiet",
                "-w",
                str(dist),
                str(REPO),
            ]
        )
        [wheel] = dist.glob("runnerd-*.whl")
        venv = base / "venv"
        _run(["/usr/bin/python3", "-m", "venv", str(venv)])
        _run([str(venv / "bin/pip"), "install", "--quiet", str(wheel)])
        located = _run(
            [str(venv / "bin/python"), "-c", "import runnerd; print(runnerd.__file__)"], cwd=base
        ).stdout
        assert located.startswith(str(venv)), located  # the wheel's runnerd, not the tree's

        runnerd = str(venv / "bin/runnerd")
        data = base / "data"
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(base),
            "RUNNERD_DATA_DIR": str(data),
            "RUNNERD_TOOLCHAIN_DIR": str(toolchain_dir),
            "RUNNERD_SANDBOX_UID_BASE": "650000",
            "RUNNERD_SANDBOX_UID_COUNT": "64",
        }
        boot = json.loads(
            _run(
                [runnerd, "admin", "bootstrap", "--workspace", "Wheel", "--email", "w@example.com"],
                env=env,
                cwd=base,
            ).stdout
        )
        port = free_port()
        log = open(base / "serve.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [runnerd, "serve", "--port", str(port)],
            env=env,
            cwd=base,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{url}/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            client = {
                **env,
                "RUNNERD_URL": url,
                "RUNNERD_API_KEY": boot["apiKey"],
                "RUNNERD_WORKSPACE": boot["workspaceId"],
            }
            app = base / "deal-desk"
            shutil.copytree(REPO / "examples" / "deal-desk", app)
            deployed = json.loads(
                _run([runnerd, "app", "deploy", str(app), "--json"], env=client, cwd=base).stdout
            )
            version = deployed["version"]["version"]
            _run(
                [runnerd, "app", "publish", "--app", "deal-desk", "--version", version],
                env=client,
                cwd=base,
            )
            _run(
                [runnerd, "app", "install", "--app", "deal-desk", "--version", version],
                env=client,
                cwd=base,
            )
            for reference, value, field in (
                ("deal-desk/score_offer", OFFER, "decision"),
                ("deal-desk/route_ticket", TICKET, "queue"),
            ):
                ran = json.loads(
                    _run(
                        [
                            runnerd,
                            "tools",
                            "run",
                            reference,
                            "--input",
                            json.dumps(value),
                            "--json",
                        ],
                        env=client,
                        cwd=base,
                    ).stdout
                )
                assert ran["status"] == "succeeded", ran
                assert field in ran["output"]
            page = httpx.get(f"{url}/")
            assert page.status_code == 200 and "app.js" in page.text  # the page ships too
        finally:
            proc.terminate()
            assert proc.wait(timeout=60) == 0
            log.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
