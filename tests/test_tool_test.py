"""`runnerd tool test`: one local tool through the server's checks and the real jail."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLE, machine_env, run_cli, tool_doc
from runnerd.run.machine import Machine

CASES: list[tuple[str, str, list[str], Any]] = [
    ("sync_py", ".py", [], "def run(input):\n    return {'n': input['n'] * 2}\n"),
    (
        "async_py",
        ".py",
        [],
        "import asyncio\nasync def run(input):\n    await asyncio.sleep(0.01)\n"
        "    return {'n': input['n'] * 2}\n",
    ),
    ("ts_tool", ".ts", [], "export function run(i: { n: number }) { return { n: i.n * 2 } }\n"),
    ("mjs_default", ".mjs", [], "export default (input) => ({ n: input.n * 2 })\n"),
    (
        "cjs_tool",
        ".js",
        [],
        "module.exports.run = function (input) { return { n: input.n * 2 } }\n",
    ),
    (
        "pypi_tool",
        ".py",
        ["six==1.16.0"],
        "import six\ndef run(input):\n    return {'n': input['n'] * 2, 'six': six.__version__}\n",
    ),
    (
        "npm_tool",
        ".ts",
        ["zod@3.25.76"],
        "import { z } from 'zod'\nexport function run(i: unknown) {\n"
        "  return { n: z.object({ n: z.number() }).parse(i).n * 2 }\n}\n",
    ),
]


def cli(
    machine: Machine, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={**machine_env(machine), **(env or {})}, timeout=300)


def write_tool(folder: Path, name: str, ext: str, packages: list[str], source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doubles = {"type": "object", "required": ["n"], "properties": {"n": {"type": "number"}}}
    (folder / f"{name}.tool.yaml").write_text(
        tool_doc(
            name,
            description="doubles n",
            packages=packages,
            input=doubles,
            output={"type": "object", "properties": {"n": {"type": "number"}}},
        )
    )
    (folder / f"{name}{ext}").write_text(source)
    return folder / f"{name}.tool.yaml"


@pytest.mark.jail
@pytest.mark.parametrize(
    ("name", "ext", "packages", "source"),
    [pytest.param(*case, marks=[pytest.mark.network] if case[2] else []) for case in CASES],
)
def test_every_kind_of_tool_succeeds(
    machine: Machine, tmp_path: Path, name: str, ext: str, packages: list[str], source: str
) -> None:
    path = write_tool(tmp_path, name, ext, packages, source)
    proc = cli(machine, "tool", "test", str(path), "--input", '{"n": 21}', "--json")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    body = json.loads(proc.stdout)
    assert body["status"] == "succeeded" and body["output"]["n"] == 42
    assert body["durationMs"] > 0


@pytest.mark.jail
@pytest.mark.smoke
def test_example_score_offer_runs_by_its_source_path(machine: Machine) -> None:
    proc = cli(
        machine,
        "tool",
        "test",
        str(EXAMPLE / "tools" / "score_offer.ts"),
        "--input",
        '{"discountPct": 30, "marginPct": 12, "termMonths": 6, "dealSize": 1000,'
        ' "tier": "standard"}',
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    output = json.loads(proc.stdout)["output"]
    assert (output["decision"], output["score"]) == ("reject", 0)
    assert "Deal size 1000 is small: the discount allowance is halved" in output["reasons"]


@pytest.mark.jail
def test_human_output_shows_status_output_and_logs(machine: Machine, tmp_path: Path) -> None:
    path = write_tool(
        tmp_path,
        "talk",
        ".py",
        [],
        "def run(i):\n    print('hello from the tool')\n    return {'n': 1}\n",
    )
    proc = cli(machine, "tool", "test", str(path), "--input", '{"n": 1}')
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0
    assert lines[0].startswith("succeeded in ") and lines[0].endswith(" ms")
    assert lines[1:] == ["{", '  "n": 1', "}", "--- logs", "hello from the tool"]


def test_invalid_input_is_a_refusal_with_the_pointer(machine: Machine, tmp_path: Path) -> None:
    path = write_tool(tmp_path, "dbl", ".py", [], CASES[0][3])
    proc = cli(machine, "tool", "test", str(path), "--input", '{"n": "x"}', "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {
        "error": {"code": "INVALID_INPUT", "message": "input /n must be number", "pointer": "/n"}
    }


@pytest.mark.jail
def test_secrets_from_flag_or_from_the_environment(machine: Machine, tmp_path: Path) -> None:
    path = write_tool(
        tmp_path,
        "sec",
        ".py",
        [],
        "import os\ndef run(i):\n    raise RuntimeError(os.environ['A'] + ' ' + os.environ['B'])\n",
    )
    proc = cli(
        machine,
        "tool",
        "test",
        str(path),
        "--input",
        '{"n": 1}',
        "--json",
        "--secret",
        "A=alpha-secret-1",
        "--secret",
        "B",
        env={"B": "beta-secret-2"},
    )
    body = json.loads(proc.stdout)
    assert body["status"] == "failed"
    assert body["error"].startswith("RuntimeError: [secret] [secret]")


def test_a_broken_tool_file_is_refused_with_file_and_line(machine: Machine, tmp_path: Path) -> None:
    (tmp_path / "bad.tool.yaml").write_text(
        "name: bad\ndescription: x\ntimeoutMs: 5\ninput: {type: object}\noutput: {type: object}\n"
    )
    (tmp_path / "bad.py").write_text("def run(i):\n    return {}\n")
    proc = cli(machine, "tool", "test", str(tmp_path / "bad.tool.yaml"), "--input", "{}")
    assert proc.returncode == 1
    assert f"{tmp_path}/bad.tool.yaml:3: timeoutMs:" in proc.stderr
