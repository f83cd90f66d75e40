"""`runnerd bench --quick`: the command users run to measure their own machine. It
works end to end and its report has every field, each a sane number; no timing is
asserted, nor that no run failed (a loaded machine may time a run out), only that every
case measured runs that succeeded (docs/BENCHMARKS.md holds the figures)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from runnerd.cli.bench import BURST, CLIENTS, Bench, Stats


@pytest.mark.jail
def test_bench_quick_measures_every_case_against_the_bare_baselines(
    toolchain: object, toolchain_dir: Path, tmp_path: Path
) -> None:
    env = {
        "RUNNERD_DATA_DIR": str(tmp_path / "operator"),  # never touched: bench uses its own
        "RUNNERD_TOOLCHAIN_DIR": str(toolchain_dir),
        "RUNNERD_SANDBOX_UID_BASE": "640000",
        "RUNNERD_SANDBOX_UID_COUNT": "128",
    }
    # A guard against a hang, not a speed bound (about a minute here, alone).
    done = run_cli("bench", "--quick", "--json", env=env, timeout=900)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    cases = {name: Stats(**stats) for name, stats in found["cases"].items()}
    expected = {
        "bare python3 -I -S -c pass", "bare nsjail + python", "bare nsjail + python, 2 workers",
        f"bare nsjail + python, {CLIENTS} workers", "bare node -e 0", "bare nsjail + node",
        "cold Python tool", "cold JS tool", "cold TS tool", "list tools",
        "Python tool, paced", "Python tool, back to back", "JS tool, paced",
        "JS tool, back to back", f"Python tool, {CLIENTS} clients",
        f"Python tool, burst of {BURST}",
        # Python both ways: forked from templates (the default) and fresh nsjails.
        "Python tool (nsjail), paced", "Python tool (nsjail), back to back",
        f"Python tool (nsjail), {CLIENTS} clients",
        "Python, trivial, template", "Python, trivial, nsjail",
    }  # fmt: skip
    if not any("heavy package set" in why for why in found["skipped"]):
        expected |= {"Python, pydantic + requests, template", "Python, pydantic + requests, nsjail"}
    assert set(cases) == expected, set(cases) ^ expected
    assert all(s.n > 0 and 0 < s.p50 <= s.p95 <= s.p99 <= s.max for s in cases.values())
    assert all(math.isfinite(s.max) for s in cases.values())
    # Each case timed runs that succeeded; how many did not is reported (and read against
    # its target), not asserted: a loaded machine may time a run out.
    assert {name: s.failed for name, s in cases.items() if not 0 <= s.failed < s.n} == {}
    load, burst = cases[f"Python tool, {CLIENTS} clients"], cases[f"Python tool, burst of {BURST}"]
    assert burst.n == BURST
    assert load.rate is not None and 0 < load.rate < math.inf
    assert set(found["memoryMb"]) == {"idle", "after load", "after the burst"}
    assert all(0 < mb < math.inf for mb in found["memoryMb"].values()), found["memoryMb"]
    cpu = found["cpuMsPerRun"]
    wanted = {"bare spawn", "runnerd run", "daemon", "jails and kernel", "clients",
              "runnerd run, nsjail", "daemon, nsjail", "jails and kernel, nsjail"}  # fmt: skip
    assert wanted <= set(cpu), cpu
    assert all(math.isfinite(ms) for ms in cpu.values()), cpu
    assert cpu["runnerd run"] == pytest.approx(cpu["daemon"] + cpu["jails and kernel"])
    # Every target's figure is computed; whether it is met is this machine's business.
    targets = found["targets"]
    assert all(row["value"] is not None and math.isfinite(row["value"])
               and row["met"] in (True, False, None) for row in targets), targets  # fmt: skip
    failures = {row["what"]: row["value"] for row in targets if "failed" in row["what"]
                or "other than 200" in row["what"]}  # fmt: skip
    assert failures == {
        f"{CLIENTS} clients, answers other than 200": load.failed,
        f"burst of {BURST}, failed": burst.failed,
    }
    assert [why for why in found["skipped"] if "heavy package set" not in why] == []
    assert not (tmp_path / "operator").exists()
    # The people's report (without --json): every case, and what it is read against.
    table = Bench(found["machine"], cases, found["memoryMb"], cpu).report()
    assert all(name in table for name in expected)
    assert "back to back / paced, p50, Python" in table and "cold TS / bare nsjail" in table


def test_bench_without_root_says_so_in_one_line() -> None:
    code = (  # as root, it gives root up first; without root, it has none to give up
        "import os, sys; from runnerd.cli.main import main\n"
        "if os.geteuid() == 0:\n    os.seteuid(65534)\n"
        "sys.exit(main(['bench', '--quick']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("runnerd: bench needs root") and done.stderr.count("\n") == 1
