"""What a granted HTTPS call through the egress proxy costs, against the same call made
directly from the host, in the same run.

    .venv/bin/python benchmarks/bench_egress.py [--runs N]

It builds the tests' egress lab (a network namespace of its own with an HTTPS server,
tests/egress_lab.py; needs root and trustme) and measures, each a fresh connection with
its TLS handshake:
- direct: the host's Python GETs the server (urllib, the test CA), in a warm process and
  in a new process (a tool's process is new at every run: its handshake is a cold one);
- through the proxy: a tool in a warm jail does the same GET, timed inside the tool
  (relay in the harness, the daemon's proxy, its checks and DNS-free IP literal);
- the whole run of that tool, and the whole run of the same tool without the call (its
  imports and TLS context only), so the difference is what the call adds to a run.
Results go in docs/BENCHMARKS.md; this is not a test and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from egress_lab import HTTPS_PORT, egress_lab
from runnerd.cli.bench import bench_tool
from runnerd.config import load_settings
from runnerd.model import Tool
from runnerd.run.machine import Machine, build_machine

CALL = """\
import ssl, time, urllib.request

def run(input):
    context = ssl.create_default_context(cadata=input["ca"])
    started = time.perf_counter()
    with urllib.request.urlopen(input["url"], context=context, timeout=10) as answer:
        answer.read()
    return {"ms": (time.perf_counter() - started) * 1000}
"""
# The same tool without the call: its imports and TLS context, so the difference between
# the two runs is the call itself.
PREPARE = """\
import ssl, urllib.request

def run(input):
    ssl.create_default_context(cadata=input["ca"])
    return {}
"""


def jails_python() -> str:
    from runnerd.run.runtimes import find_runtimes

    runtime = find_runtimes(None, "node").python
    assert runtime is not None
    return runtime.executable


def _fresh_process_get(python: str, url: str, ca: str) -> float:
    code = CALL + "\nimport json, sys\nprint(json.dumps(run(json.loads(sys.stdin.read()))))\n"
    done = subprocess.run(
        [python, "-I", "-S", "-c", code],
        input=json.dumps({"url": url, "ca": ca}),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(done.stdout)["ms"])


def _median(values: list[float]) -> float:
    return statistics.median(values)


async def _runs(
    machine: Machine, tool: Tool, value: dict[str, str], grant: tuple[str, ...], runs: int
) -> tuple[list[float], list[float]]:
    """Whole-run latencies, and the call times the tool measured (if it reports them)."""
    whole, inside = [], []
    await machine.pipeline.run(tool, value, egress=grant)  # starts the pool of this kind
    for _ in range(runs + 1):
        await asyncio.sleep(0.15)  # the pool refills, as under a steady load
        started = time.perf_counter()
        result = await machine.pipeline.run(tool, value, egress=grant, logs=False)
        whole.append((time.perf_counter() - started) * 1000)
        assert result.status == "succeeded", result.error
        if result.output and "ms" in result.output:
            inside.append(result.output["ms"])
    await machine.sandbox.close()
    return whole[1:], inside[1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    with egress_lab() as lab:
        url = f"https://{lab.server_ip}:{HTTPS_PORT}/bench"
        context = ssl.create_default_context(cadata=lab.ca_pem)

        def direct() -> float:
            started = time.perf_counter()
            with urllib.request.urlopen(url, context=context, timeout=10) as answer:
                answer.read()
            return (time.perf_counter() - started) * 1000

        direct()
        direct_ms = [direct() for _ in range(args.runs)]
        # A tool's process is new at every run: its first TLS handshake is a cold one. The
        # same GET from a new host process (the jail's Python, timed the same way).
        fresh_ms = [_fresh_process_get(jails_python(), url, lab.ca_pem) for _ in range(args.runs)]
        data = Path(tempfile.mkdtemp(prefix="runnerd-bench-", dir="/tmp"))
        data.chmod(0o711)
        settings = load_settings(
            env={},
            flags={"data_dir": data, "egress_allow_networks": [lab.network],
                   "sandbox_uid_base": 630_000, "sandbox_uid_count": 64},
        )  # fmt: skip
        grant = (f"{lab.server_ip}:{HTTPS_PORT}",)
        value = {"url": url, "ca": lab.ca_pem}
        machine = build_machine(settings, warm=2)
        call_whole, call_inside = asyncio.run(
            _runs(machine, bench_tool(machine, "call", ".py", CALL), value, grant, args.runs)
        )
        machine = build_machine(settings, warm=2)
        prepare = bench_tool(machine, "prepare", ".py", PREPARE)
        plain_whole, _ = asyncio.run(_runs(machine, prepare, value, (), args.runs))
    direct_median, through = _median(direct_ms), _median(call_inside)
    whole, without = _median(call_whole), _median(plain_whole)
    for name, value_ms in (
        ("direct HTTPS GET from the host", direct_median),
        ("the same GET from a new host process", _median(fresh_ms)),
        ("the same GET in a tool, through the proxy", through),
        ("whole run of that tool (warm jail)", whole),
        ("whole run of the same tool without the GET", without),
    ):
        print(f"{name:<45} {value_ms:7.2f} ms")
    print(f"{'proxy GET / direct GET':<45} {through / direct_median:7.2f}x")
    print(f"{'proxy GET / GET from a new host process':<45} {through / _median(fresh_ms):7.2f}x")
    print(f"{'what the GET adds to a run':<45} {whole - without:7.2f} ms")


if __name__ == "__main__":
    main()
