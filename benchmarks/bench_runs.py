"""Cold-run latency of runnerd against bare baselines measured in the same run.

    .venv/bin/python benchmarks/bench_runs.py [--runs N]

Every runnerd run starts a fresh nsjail sandbox (mode once), so "cold" is every run.
Baselines: the bare interpreter, and bare nsjail + interpreter with the same cgroup
limits, so the ratios show what runnerd itself adds (harness, pipes, checks). Results
go in docs/BENCHMARKS.md; this is not a test and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from runnerd.cli.bench import bare_jail, bench_tool
from runnerd.config import load_settings
from runnerd.model import Tool
from runnerd.run.machine import Machine, build_machine
from runnerd.run.runtimes import clean_env


def _time(fn: Callable[[], object], runs: int) -> list[float]:
    fn()  # warm the page cache
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


async def _warm_calls(machine: Machine, tool: Tool, runs: int) -> list[float]:
    """Call latency with a waiting jail: the pool refills between calls (a pause long
    enough for one jail start), as it does under a steady load below the pool size."""
    out = []
    await machine.pipeline.run(tool, {"n": 1})  # starts the pool of this kind
    for _ in range(runs + 1):
        await asyncio.sleep(0.15)
        start = time.perf_counter()
        result = await machine.pipeline.run(tool, {"n": 1}, logs=False)  # as the daemon calls
        out.append((time.perf_counter() - start) * 1000)
        assert result.status == "succeeded", result.error
    await machine.sandbox.close()
    return out[1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="runnerd-bench-", dir="/tmp"))
    data.chmod(0o711)
    machine = build_machine(load_settings(flags={"data_dir": data}))
    rt = machine.runtimes
    assert rt.python is not None and rt.node is not None
    env = clean_env()

    def sh(argv: list[str]) -> Callable[[], object]:
        return lambda: subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)

    def tool_run(tool: Tool) -> Callable[[], object]:
        def go() -> object:
            result = asyncio.run(machine.pipeline.run(tool, {"n": 1}))
            assert result.status == "succeeded", result.error
            return result

        return go

    py_tool = bench_tool(machine, "py", ".py", "def run(input):\n    return {'n': input['n']}\n")
    js_tool = bench_tool(machine, "js", ".mjs", "export function run(i) { return { n: i.n } }\n")
    ts_tool = bench_tool(
        machine, "ts", ".ts", "export function run(i: { n: number }) {\n  return { n: i.n }\n}\n"
    )
    rows = {
        "python3 -I -S -c pass (bare)": sh([rt.python.executable, "-I", "-S", "-c", "pass"]),
        "nsjail + python3 -c pass (bare)": sh(
            bare_jail(machine, [rt.python.executable, "-I", "-S", "-c", "pass"], rt.python.mounts)
        ),
        "runnerd: trivial Python tool": tool_run(py_tool),
        "node -e 0 (bare, clean env)": sh([rt.node.path, "-e", "0"]),
        "nsjail + node -e 0 (bare)": sh(
            bare_jail(machine, [rt.node.path, "-e", "0"], rt.node.mounts)
        ),
        "runnerd: trivial JavaScript tool": tool_run(js_tool),
        "runnerd: trivial TypeScript tool": tool_run(ts_tool),
    }
    results = {name: _time(fn, args.runs) for name, fn in rows.items()}
    # Warm jails: started ahead of calls (as the daemon does), each used for one call.
    for label, tool in (
        ("runnerd warm: trivial Python tool", py_tool),
        ("runnerd warm: trivial JavaScript tool", js_tool),
        ("runnerd warm: trivial TypeScript tool", ts_tool),
    ):
        warm = build_machine(load_settings(flags={"data_dir": data}), warm=1)
        results[label] = asyncio.run(_warm_calls(warm, tool, args.runs))
    med = {name: statistics.median(v) for name, v in results.items()}
    print(f"runs per row: {args.runs}; cgroups: {machine.cgroups.mode}")
    print(f"{'':40} {'median ms':>10} {'p95 ms':>8}")
    for name, values in results.items():
        p95 = sorted(values)[int(len(values) * 0.95) - 1]
        print(f"{name:40} {med[name]:10.1f} {p95:8.1f}")
    ratios = [
        (
            "Python tool / bare python",
            "runnerd: trivial Python tool",
            "python3 -I -S -c pass (bare)",
        ),
        (
            "Python tool / bare nsjail + python",
            "runnerd: trivial Python tool",
            "nsjail + python3 -c pass (bare)",
        ),
        (
            "JS tool / bare nsjail + node",
            "runnerd: trivial JavaScript tool",
            "nsjail + node -e 0 (bare)",
        ),
        (
            "TS tool / bare nsjail + node",
            "runnerd: trivial TypeScript tool",
            "nsjail + node -e 0 (bare)",
        ),
        (
            "warm Python tool / bare python",
            "runnerd warm: trivial Python tool",
            "python3 -I -S -c pass (bare)",
        ),
        (
            "warm Python tool / bare nsjail + python",
            "runnerd warm: trivial Python tool",
            "nsjail + python3 -c pass (bare)",
        ),
        (
            "warm JS tool / bare nsjail + node",
            "runnerd warm: trivial JavaScript tool",
            "nsjail + node -e 0 (bare)",
        ),
        (
            "warm TS tool / bare nsjail + node",
            "runnerd warm: trivial TypeScript tool",
            "nsjail + node -e 0 (bare)",
        ),
    ]
    print()
    for label, ours, base in ratios:
        print(f"{label + ':':36} {med[ours] / med[base]:.2f}x")


if __name__ == "__main__":
    main()
