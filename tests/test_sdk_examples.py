"""The example app (examples/deal-desk) through the SDKs: its Python client scores an
offer, and the types `runnerd tools types` prints check its clients at compile time (tsc
and mypy). On one store only: nothing here depends on which."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from daemon import Daemon
from runnerd.run.runtimes import SYSTEM_CA, find_node, npm_cli

pytestmark = pytest.mark.jail

REPO = Path(__file__).resolve().parent.parent
JS_SDK = REPO / "clients" / "js"
EXAMPLE = REPO / "examples" / "deal-desk"
CLIENT = REPO / "examples" / "deal-desk" / "client"


@pytest.fixture(scope="module")
def deal_desk(daemon: Daemon) -> str:
    return str(daemon.ship(EXAMPLE)["installId"])


@pytest.mark.smoke
def test_the_example_app_scores_an_offer_through_the_python_sdk(
    daemon: Daemon, deal_desk: str
) -> None:
    done = subprocess.run(
        [sys.executable, str(CLIENT / "quote.py")],
        env={**daemon.client_env(), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("approve (89/100): "), done.stdout


@pytest.mark.network
def test_generated_types_check_the_example_app_at_compile_time(
    daemon: Daemon, deal_desk: str, tmp_path: Path
) -> None:
    """tsc --noEmit on quote.ts with the types `runnerd tools types --lang ts` printed; the
    same with a wrong input fails on that field. mypy does the same for quote.py."""
    app = tmp_path / "examples" / "deal-desk" / "client"
    shutil.copytree(CLIENT, app)
    shutil.copytree(JS_SDK, tmp_path / "clients" / "js", ignore=shutil.ignore_patterns("test"))
    env = daemon.client_env()
    for lang, target in (("ts", "runnerd-tools.ts"), ("py", "runnerd_tools.py")):
        made = run_cli("tools", "types", "--lang", lang, "--app", "deal-desk", env=env)
        assert made.returncode == 0, made.stderr
        (app / target).write_text(made.stdout)
    node = find_node()
    npm = npm_cli(node) if node else None
    assert node and npm, "the type check needs Node.js >= 20 and npm"
    installed = subprocess.run(
        [node.path, str(npm), "install", "--no-save", "--ignore-scripts", "--no-audit", "--no-fund",
         "typescript@5.9"],
        cwd=app, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NODE_EXTRA_CA_CERTS": SYSTEM_CA},
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    tsc = [node.path, str(app / "node_modules" / "typescript" / "bin" / "tsc"), "-p", str(app)]
    checked = subprocess.run(tsc, capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    source = app / "quote.ts"
    source.write_text(source.read_text().replace("discountPct: 12,", "discountPct: '12',"))
    wrong = subprocess.run(tsc, capture_output=True, text=True, timeout=300)
    assert wrong.returncode != 0 and "quote.ts(30," in wrong.stdout, wrong.stdout
    assert "Type 'string' is not assignable to type 'number'" in wrong.stdout

    mypy = [sys.executable, "-m", "mypy", "--strict", str(app / "quote.py")]
    typed = subprocess.run(mypy, cwd=app, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "MYPYPATH": str(app)})  # fmt: skip
    assert typed.returncode == 0, typed.stdout
    script = app / "quote.py"
    script.write_text(script.read_text().replace('"discountPct": 12,', '"discountPct": "12",'))
    untyped = subprocess.run(mypy, cwd=app, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "MYPYPATH": str(app)})  # fmt: skip
    assert untyped.returncode != 0 and "discountPct" in untyped.stdout, untyped.stdout
