"""``runnerd service install`` puts nothing in ExecStart that its own unit cannot see:
the unit hides /home, /root and /run/user (ProtectHome=yes) and has a /tmp of its own
(PrivateTmp=yes). tests/test_service_systemd.py runs the result under a real systemd."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipapp
from pathlib import Path

import pytest

from conftest import run_cli

# The two tests below put runnerd under /tmp, which the unit's PrivateTmp=yes hides.
_UNDER_TMP = pytest.mark.skipif(
    not str(Path(tempfile.gettempdir())).startswith("/tmp"), reason="pytest's tmp is not /tmp"
)


def _zipapp(at: Path) -> Path:
    """A zipapp that is runnerd (this tree's), as dist/runnerd.pyz is, without building it."""
    source = at.parent / "source"
    source.mkdir()
    (source / "__main__.py").write_text(
        "from runnerd.cli.main import main\nraise SystemExit(main())\n"
    )
    zipapp.create_archive(source, at)
    return at


@_UNDER_TMP
def test_a_zipapp_in_a_folder_the_unit_cannot_see_is_copied_to_opt(tmp_path: Path) -> None:
    pyz = _zipapp(tmp_path / "runnerd.pyz")  # under /tmp: PrivateTmp hides it from the unit
    root = tmp_path / "root"
    done = _install(pyz, root)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # This Python, unless the unit cannot see it either (a venv under /tmp): the system's.
    hidden = sys.executable.startswith(("/home/", "/root/", "/run/user/", "/tmp/", "/var/tmp/"))
    python = "/usr/bin/python3" if hidden else sys.executable
    assert found["execStart"] == f"{python} /opt/runnerd/runnerd.pyz"
    copied = root / "opt/runnerd/runnerd.pyz"
    assert copied.read_bytes() == pyz.read_bytes()
    assert copied.stat().st_mode & 0o777 == 0o644
    assert f"copied the zipapp to {copied}, which the unit runs" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    unit = (root / "etc/systemd/system/runnerd.service").read_text()
    assert f"ExecStart={python} /opt/runnerd/runnerd.pyz serve" in unit
    # The zipapp unpacks itself where the unit may write, not into root's hidden ~/.shiv.
    assert "\nEnvironment=SHIV_ROOT=/var/cache/runnerd/shiv\n" in unit
    assert "\nCacheDirectory=runnerd\n" in unit
    # Run again from the copy (an upgrade in place): nothing is copied onto itself.
    again = _install(copied, root)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert json.loads(again.stdout)["execStart"] == f"{python} /opt/runnerd/runnerd.pyz"


def test_a_runnerd_the_unit_cannot_see_is_refused_with_one_line(tmp_path: Path) -> None:
    root = tmp_path / "root"
    script = root / "tmp" / "venv" / "bin" / "runnerd"  # the image's /tmp, as its /root
    script.parent.mkdir(parents=True)
    script.write_text(
        f"#!{sys.executable}\nfrom runnerd.cli.main import main\nraise SystemExit(main())\n"
    )
    script.chmod(0o755)
    done = _run_at(script, "service", "install", "--root", str(root))
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"runnerd service install: {script} is under /tmp, which the unit")
    assert "/opt/runnerd/bin/runnerd service install" in line
    assert not (root / "etc/systemd/system/runnerd.service").exists()


@pytest.mark.skipif(
    str(Path(sys.executable)).startswith(("/home/", "/root/", "/tmp/")),
    reason="this tree's runnerd is where the unit cannot see it",
)
def test_the_venv_runnerd_outside_hidden_folders_is_used_in_place(tmp_path: Path) -> None:
    done = run_cli("service", "install", "--root", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    assert not json.loads(done.stdout)["execStart"].startswith(("/tmp", "/root", "/home"))
    assert not (tmp_path / "opt").exists()


def _install(pyz: Path, root: Path) -> subprocess.CompletedProcess[str]:
    """``python3 PYZ service install --root ROOT --json``, with this tree's Python."""
    return subprocess.run([sys.executable, str(pyz), "service", "install", "--root", str(root),
                           "--json"], capture_output=True, text=True, timeout=60)  # fmt: skip


def _run_at(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=60)
