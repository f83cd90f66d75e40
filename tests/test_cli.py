"""`runnerd` as users run it: the installed console script, human output and exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import EXAMPLE, AppDir, run_cli
from runnerd.run.toolchain import Toolchain


def runnerd(
    *args: str, toolchain: Toolchain, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"RUNNERD_TOOLCHAIN_DIR": str(toolchain.directory), **(env or {})}
    return run_cli(*args, env=env, cwd=cwd, timeout=60)


@pytest.mark.smoke
def test_validate_example_prints_a_summary_of_the_tools(
    toolchain: Toolchain, tmp_path: Path
) -> None:
    proc = runnerd(
        "app", "validate", str(EXAMPLE), "--data-dir", str(tmp_path), toolchain=toolchain
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "deal-desk (Deal Desk): 2 tools, all checks passed"
    assert lines[1].split() == ["route_ticket", "python", "read", "30000", "ms"]
    assert lines[2].split() == ["score_offer", "typescript", "read", "10000", "ms"]
    assert lines[3] == "pages: 4 files from pages/ (entry index.html)"


def test_validate_defaults_to_the_current_folder(toolchain: Toolchain, tmp_path: Path) -> None:
    proc = runnerd(
        "app", "validate", "--json", "--data-dir", str(tmp_path), toolchain=toolchain, cwd=EXAMPLE
    )
    assert proc.returncode == 0
    found = json.loads(proc.stdout)
    assert found["app"]["slug"] == "deal-desk"
    assert found["pages"] == {"folder": "pages/", "files": 4, "entry": "index.html"}


def test_validate_prints_every_problem_as_file_line_and_exits_1(
    make_app: Callable[..., AppDir], toolchain: Toolchain
) -> None:
    app = make_app()
    app.write(
        "tools/a.tool.yaml",
        "name: a\ndescription: x\ntimeoutMs: 5\ninput: {type: object}\noutput: {type: object}\n",
    )
    app.write("tools/a.py", "def run(input:\n")
    proc = runnerd("app", "validate", str(app.root), toolchain=toolchain)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        "tools/a.py:1: Python syntax error: '(' was never closed",
        "tools/a.tool.yaml:3: timeoutMs: time limit for one run in milliseconds, "
        "including starting the sandbox: an integer from 1000 to 300000 (default 30000); got 5",
        "",
        "2 problems; the app would be refused.",
    ]


def test_validate_a_missing_folder_is_a_usage_error(toolchain: Toolchain) -> None:
    proc = runnerd("app", "validate", "/nonexistent/app", toolchain=toolchain)
    assert proc.returncode == 2
    assert "not a folder" in proc.stderr


def test_bad_config_file_is_named(toolchain: Toolchain, tmp_path: Path) -> None:
    config = tmp_path / "runnerd.toml"
    config.write_text("prot = 1\n")
    proc = runnerd("app", "validate", str(EXAMPLE), "--config", str(config), toolchain=toolchain)
    assert proc.returncode == 2
    assert f"{config}: unknown setting(s) prot" in proc.stderr


@pytest.mark.smoke
@pytest.mark.jail
def test_doctor_checks_the_machine_and_runs_a_tool(toolchain: Toolchain, tmp_path: Path) -> None:
    data = Path(tempfile.mkdtemp(prefix="runnerd-doctor-", dir="/tmp"))
    data.chmod(0o711)
    proc = runnerd("doctor", "--json", "--data-dir", str(data), toolchain=toolchain)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    body = json.loads(proc.stdout)
    checks = {c["check"]: c for c in body["checks"]}
    assert body["ok"] is True
    assert checks["python run"]["ok"] and "fresh sandbox" in checks["python run"]["detail"]
    assert checks["typescript run"]["ok"]
    assert checks["root"]["ok"] and checks["nsjail"]["ok"]


@pytest.mark.jail
def test_doctor_fails_without_a_usable_python(toolchain: Toolchain, tmp_path: Path) -> None:
    proc = runnerd(
        "doctor",
        "--data-dir",
        str(tmp_path),
        toolchain=toolchain,
        env={"RUNNERD_PYTHON": "/nonexistent/python3"},
    )
    assert proc.returncode == 1
    assert "FAIL python" in proc.stdout
    assert "/nonexistent/python3 is not a working Python" in proc.stdout


@pytest.mark.jail
def test_doctor_says_why_a_python_in_a_private_folder_is_passed_by(
    toolchain: Toolchain, tmp_path: Path
) -> None:
    # A Python under a folder only root can enter (pyenv under /root, say): sandboxes,
    # which run as other uids, cannot mount it, and the doctor says so by name.
    private = tmp_path / "private"
    (private / "bin").mkdir(parents=True)
    python = private / "bin" / "python3"
    shutil.copy2(os.path.realpath("/usr/bin/python3"), python)
    private.chmod(0o700)
    proc = runnerd(
        "doctor", "--data-dir", str(tmp_path / "data"), toolchain=toolchain,
        env={"RUNNERD_PYTHON": str(python)},
    )  # fmt: skip
    assert proc.returncode == 1
    line = next(x for x in proc.stdout.splitlines() if x.split()[1:2] == ["python"])
    assert line.startswith("FAIL"), line
    assert f"not using {python} for tools: sandboxes cannot mount it" in line
    assert f"({python} is not readable by unprivileged users)" in line
