"""``runnerd bench``: how fast runnerd is on this machine, read against bare baselines
measured in the same run.

It starts a throwaway daemon (``runnerd serve`` in a process of its own, on a temporary
data dir with embedded SQLite and a free port) with a trivial Python tool and a trivial
JavaScript tool, and calls it over HTTP the way agents and workflows do: paced, back to
back, from 8 clients at once, and in a burst after an idle spell. In the same run it
times what no runner can beat on this machine: a bare interpreter, and a bare nsjail +
interpreter, alone and spawned by several workers. Cold runs (no warm jail) go through
the run machine in this process. The daemon's memory is read before and after the load.

Nothing here asserts a timing: the report gives medians, p95 and p99, the ratios, and
the targets they are read against (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import http.client
import importlib.util
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

import runnerd
from runnerd.config import Settings
from runnerd.model import Tool
from runnerd.run.jail import Job
from runnerd.run.machine import Machine, build_machine
from runnerd.run.runtimes import clean_env
from runnerd.store import Store
from runnerd.upload.bundle import load_bundle

__all__ = ["Bench", "bare_jail", "bench_tool", "run_bench"]

PY_TOOL = "def run(input):\n    return {'n': input.get('n', 0)}\n"
JS_TOOL = "export function run(input) { return { n: input.n ?? 0 } }\n"
TS_TOOL = "export function run(input: { n?: number }) {\n  return { n: input.n ?? 0 }\n}\n"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}
# A tool importing a heavy package set; the set is copied from this runnerd's own
# installation (the same interpreter), as a package env would hold it.
HEAVY_SET = ("pydantic", "pydantic_core", "annotated_types", "typing_extensions",
             "typing_inspection", "requests", "urllib3", "idna", "certifi",
             "charset_normalizer")  # fmt: skip
HEAVY_TOOL = "import pydantic, requests\ndef run(input):\n    return {'n': input.get('n', 0)}\n"
CLIENTS = Settings().max_concurrent_runs  # concurrent clients: the default admission
BURST = 50  # simultaneous calls after an idle spell
COLD_PAUSE_S = 0.05  # between cold runs


@dataclass(frozen=True)
class Sizes:
    """How much of each case a run does."""

    runs: int  # bare baselines and cold runs, each
    list_calls: int
    paced: int
    back_to_back_py: int
    back_to_back_js: int
    spawn_s: float  # the bare spawn rate, per worker count
    load_s: float  # 8 clients
    idle_s: float  # before the burst


FULL = Sizes(runs=30, list_calls=100, paced=40, back_to_back_py=300, back_to_back_js=150,
             spawn_s=4, load_s=10, idle_s=10)  # fmt: skip
QUICK = Sizes(runs=8, list_calls=30, paced=12, back_to_back_py=60, back_to_back_js=30,
              spawn_s=1.5, load_s=3, idle_s=5)  # fmt: skip


@dataclass
class Stats:
    """Latencies of one case, in ms; ``rate``: completed calls per second, when the
    case is a load; ``failed``: answers other than 200 (or runs that did not succeed)."""

    n: int
    p50: float
    p95: float
    p99: float
    max: float
    rate: float | None = None
    failed: int = 0

    @classmethod
    def of(cls, ms: list[float], *, rate: float | None = None, failed: int = 0) -> Stats:
        ordered = sorted(ms)

        def rank(q: float) -> float:
            return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

        return cls(len(ordered), statistics.median(ordered), rank(0.95), rank(0.99),
                   ordered[-1], rate, failed)  # fmt: skip


@dataclass
class Bench:
    """One run of the benchmark: every case, the machine, and what was skipped."""

    machine: dict[str, Any]
    cases: dict[str, Stats] = field(default_factory=dict)
    memory_mb: dict[str, float] = field(default_factory=dict)
    # The machine's CPU time per run under load (8 at once), and where it went.
    cpu_ms: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    checks_ms: float | None = None  # the daemon's checks of a template's child, mean
    import_ms: float | None = None  # the heavy package set's import in a bare interpreter

    def ratio(self, ours: str, base: str) -> float | None:
        """p50 of ``ours`` / p50 of ``base``."""
        a, b = _p50(self.cases, ours), _p50(self.cases, base)
        return a / b if a is not None and b else None

    def targets(self) -> list[tuple[str, float | None, str, bool | None]]:
        """(what, value, target, met): the figures docs/BENCHMARKS.md reads."""
        c = self.cases

        def check(value: float | None, ok: Callable[[float], bool]) -> bool | None:
            return None if value is None else ok(value)

        spawn = max((c[k].rate or 0 for k in c if k.startswith("bare nsjail + python,")),
                    default=None)  # fmt: skip
        load = c.get(f"Python tool, {CLIENTS} clients")
        nsjail_load = c.get(f"Python tool (nsjail), {CLIENTS} clients")
        cpu = self.cpu_ms
        burst = c.get(f"Python tool, burst of {BURST}")
        rows: list[tuple[str, float | None, str, Callable[[float], bool]]] = [
            ("paced p50, Python (ms)", _p50(c, "Python tool, paced"), "<= 3",
             lambda v: v <= 3),
            ("back to back / paced, p50, Python", self.ratio("Python tool, back to back",
             "Python tool, paced"), "<= 1.2x", lambda v: v <= 1.2),
            ("back to back p50, JS (ms)", _p50(c, "JS tool, back to back"), "<= 5",
             lambda v: v <= 5),
            ("8 clients runs/s / bare spawn rate",
             (load.rate or 0) / spawn if load and spawn else None, ">= 2x",
             lambda v: v >= 2),
            ("same, nsjail per call", (nsjail_load.rate or 0) / spawn
             if nsjail_load and spawn else None, "report", lambda v: True),
            ("CPU per run: bare spawn / runnerd run",
             cpu["bare spawn"] / cpu["runnerd run"] if {"bare spawn", "runnerd run"} <= set(cpu)
             else None, "report", lambda v: True),
            ("CPU per run, processes: jails / bare spawn",
             cpu["jails, processes"] / cpu["bare spawn, processes"]
             if {"bare spawn, processes", "jails, processes"} <= set(cpu) else None,
             "<= 0.33x", lambda v: v <= 1 / 3),
            ("same, nsjail per call",
             cpu["jails, processes, nsjail"] / cpu["bare spawn, processes"]
             if {"bare spawn, processes", "jails, processes, nsjail"} <= set(cpu) else None,
             "report", lambda v: True),
            ("paced p50, Python, nsjail per call (ms)", _p50(c, "Python tool (nsjail), paced"),
             "report", lambda v: True),
            ("heavy set p50 / trivial p50, template", self.ratio(
             "Python, pydantic + requests, template", "Python, trivial, template"), "<= 2x",
             lambda v: v <= 2),
            ("heavy set p50 / trivial p50, nsjail", self.ratio(
             "Python, pydantic + requests, nsjail", "Python, trivial, nsjail"), "report",
             lambda v: True),
            ("template child checks, mean (ms)", self.checks_ms, "< 1", lambda v: v < 1),
            ("8 clients p99 / p50", load.p99 / load.p50 if load else None, "<= 3x",
             lambda v: v <= 3),
            ("8 clients, answers other than 200", float(load.failed) if load else None, "0",
             lambda v: v == 0),
            (f"burst of {BURST}, failed", float(burst.failed) if burst else None, "0",
             lambda v: v == 0),
            ("cold JS / bare nsjail + node", self.ratio("cold JS tool", "bare nsjail + node"),
             "<= 1.2x", lambda v: v <= 1.2),
            ("cold TS / bare nsjail + node", self.ratio("cold TS tool", "bare nsjail + node"),
             "<= 1.2x", lambda v: v <= 1.2),
            ("cold Python / bare nsjail + python", self.ratio("cold Python tool",
             "bare nsjail + python"), "report", lambda v: True),
            ("list tools p50 (ms)", _p50(c, "list tools"), "report", lambda v: True),
        ]  # fmt: skip
        return [(what, value, target, check(value, ok)) for what, value, target, ok in rows]

    def as_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "cases": {name: asdict(s) for name, s in self.cases.items()},
            "memoryMb": self.memory_mb,
            "cpuMsPerRun": self.cpu_ms,
            "targets": [
                {"what": w, "value": v, "target": t, "met": m} for w, v, t, m in self.targets()
            ],
            "skipped": self.skipped,
            "templateChecksMs": self.checks_ms,
            "heavyImportMs": self.import_ms,
        }

    def report(self) -> str:
        m = self.machine
        lines = [
            f"runnerd bench {m['runnerd']} ({m['mode']}): {m['cpus']} CPUs, cgroups "
            f"{m['cgroups']}, Python {m['python']}, Node {m['node'] or 'none'}, "
            f"warm_jails {m['warm_jails']}, max_concurrent_runs {m['max_concurrent_runs']}",
            "",
            f"{'case':44} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'runs/s':>8}",
        ]
        for name, s in self.cases.items():
            rate = f"{s.rate:8.0f}" if s.rate is not None else f"{'':8}"
            failed = f"  ({s.failed} failed)" if s.failed else ""
            lines.append(f"{name:44} {s.n:5} {s.p50:8.1f} {s.p95:8.1f} {s.p99:8.1f} {rate}{failed}")
        if self.memory_mb:
            lines += ["", "daemon RSS: " + ", ".join(
                f"{k} {v:.0f} MB" for k, v in self.memory_mb.items())]  # fmt: skip
        if self.cpu_ms:
            lines += ["", "CPU time per run under load (all cores): " + ", ".join(
                f"{k} {v:.1f} ms" for k, v in self.cpu_ms.items())]  # fmt: skip
        if self.import_ms is not None:
            lines += ["", f"import of pydantic + requests (bare interpreter): "
                      f"{self.import_ms:.1f} ms"]  # fmt: skip
        lines += ["", f"{'read against':44} {'value':>8} {'target':>9}  met"]
        for what, value, target, met in self.targets():
            shown = "-" if value is None else f"{value:8.2f}"
            verdict = {None: "-", True: "yes", False: "no"}[met]
            lines.append(f"{what:44} {shown:>8} {target:>9}  {verdict}")
        lines += [f"skipped: {s}" for s in self.skipped]
        return "\n".join(lines)


def _p50(cases: dict[str, Stats], name: str) -> float | None:
    found = cases.get(name)
    return None if found is None else found.p50


# --- the throwaway daemon ---------------------------------------------------------------------


class _Daemon:
    """``runnerd serve`` on a temporary data dir, bootstrapped, with one app installed."""

    def __init__(self, settings: Settings, data: Path) -> None:
        self.settings = settings
        self.data = data
        self.port = _free_port()
        store = Store.in_data_dir(data)
        try:
            workspace = store.create_workspace("Bench")
            user = store.ensure_user("bench@localhost")
            store.set_membership(workspace.id, user.id, role="admin", apps_access=True)
            _, self.key = store.create_key(kind="personal", user_id=user.id, name="bench")
        finally:
            store.close()
        self.workspace_id = workspace.id
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNERD_")}
        env.update(_child_settings(settings, data, self.port))
        # The folder runnerd is imported from (a checkout, a venv, an unpacked zipapp).
        env["PYTHONPATH"] = str(Path(runnerd.__file__).resolve().parent.parent)
        self.log = open(data / "serve.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runnerd", "serve"],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                tail = (data / "serve.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the bench daemon did not start:\n{tail}")
            time.sleep(0.05)

    def _ready(self) -> bool:
        try:
            return self.request("GET", "/readyz")[0] == 200
        except OSError:
            return False

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        conn: http.client.HTTPConnection | None = None,
    ) -> tuple[int, Any]:
        own = conn is None
        conn = conn or self.connect()
        try:
            headers = {"X-API-Key": self.key, "Content-Type": "application/json"}
            data = None if body is None else json.dumps(body)
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
        finally:
            if own:
                conn.close()

    def install(self, files: dict[str, bytes]) -> str:
        ws = f"?workspaceId={self.workspace_id}"
        encoded = {p: base64.b64encode(d).decode() for p, d in files.items()}
        status, body = self.request("POST", f"/api/v2/apps/deploy{ws}", {"files": encoded})
        if status != 201:
            raise RuntimeError(f"the bench app was refused: {body}")
        version = body["version"]
        self.request("POST", f"/api/v2/apps/{version['appSlug']}/versions/"
                     f"{version['version']}/publish{ws}")  # fmt: skip
        wanted = {"appSlug": version["appSlug"], "version": version["version"]}
        status, body = self.request("POST", f"/api/v2/apps/installs{ws}", wanted)
        if status != 201:
            raise RuntimeError(f"the bench app could not be installed: {body}")
        return str(body["installId"])

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _child_settings(settings: Settings, data: Path, port: int) -> dict[str, str]:
    """The operator's runtimes, sandbox and admission settings; a data dir, SQLite store,
    port and secrets key of its own; no rate limit in the way of the clients."""
    keep = ("node", "python", "nsjail", "sandbox_uid_base", "sandbox_uid_count",
            "uid_lock_dir", "memory_mb", "pids", "tmp_mb", "file_mb", "open_files",
            "cpu_ms_per_sec", "warm_jails", "max_concurrent_runs", "max_queued_runs",
            "check_budget_ms", "python_templates", "package_templates")  # fmt: skip
    env = {f"RUNNERD_{k.upper()}": str(getattr(settings, k)).lower()
           if isinstance(getattr(settings, k), bool) else str(getattr(settings, k))
           for k in keep if getattr(settings, k) is not None}  # fmt: skip
    env.update({
        "RUNNERD_DATA_DIR": str(data),
        "RUNNERD_TOOLCHAIN_DIR": str(settings.toolchain_path),
        "RUNNERD_HOST": "127.0.0.1",
        "RUNNERD_PORT": str(port),
        "RUNNERD_RATE_LIMIT_PER_SECOND": "1000000",
        "RUNNERD_RATE_LIMIT_BURST": "1000000",
        "RUNNERD_LOG_LEVEL": "warning",
    })  # fmt: skip
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _app_files(tools: list[tuple[str, str, str]]) -> dict[str, bytes]:
    """An app of trivial tools: (name, file extension, source) each."""
    files = {"agentserve.app.yaml": b"slug: bench\nname: Bench\ntools: ./*\n"}
    for name, ext, source in tools:
        doc = {"name": name, "description": "Returns n.", "input": SCHEMA, "output": SCHEMA}
        files[f"{name}.tool.yaml"] = json.dumps(doc).encode()
        files[f"{name}{ext}"] = source.encode()
    return files


def bench_tool(machine: Machine, name: str, ext: str, source: str) -> Tool:
    """One trivial tool, checked as an upload checks it, for the machine."""
    [tool] = load_bundle(_app_files([(name, ext, source)]), toolchain=machine.toolchain).tools
    return tool


# --- the cases --------------------------------------------------------------------------------


def _timed(fn: Callable[[], bool], count: int, pause_s: float = 0.0) -> Stats:
    """``fn`` ``count`` times in a row (after one untimed call); it returns success."""
    fn()
    ms, failed = [], 0
    for _ in range(count):
        if pause_s:
            time.sleep(pause_s)
        start = time.perf_counter()
        failed += not fn()
        ms.append((time.perf_counter() - start) * 1000)
    return Stats.of(ms, failed=failed)


class _Cpu:
    """CPU seconds spent meanwhile: by the whole machine (every core, kernel included:
    other work on a shared machine too), by this process (the clients), and by ``pid``
    (the daemon); and by processes only, which other work does not touch: this
    process's reaped children (bare spawns), and the daemon's tree (the daemon, the
    jails it reaped through nsjail, and its Python templates with the children they
    reaped)."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid
        self.start = self._now()

    def _now(self) -> tuple[float, float, float, float, float]:
        tick = os.sysconf("SC_CLK_TCK")
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        machine = (sum(fields) - fields[3] - fields[4]) / tick  # all but idle and iowait
        times = os.times()
        own, spawned = times[0] + times[1], times[2] + times[3]
        daemon = tree = 0.0
        if self.pid is not None:
            daemon, tree = _tree_cpu(self.pid, tick)
        return machine, own, daemon, spawned, tree

    def per(self, count: int) -> tuple[float, float, float]:
        """(machine, clients, daemon) ms per one of ``count``."""
        (m0, c0, d0, _, _), (m1, c1, d1, _, _) = self.start, self._now()
        n = max(count, 1)
        return (m1 - m0) * 1000 / n, (c1 - c0) * 1000 / n, (d1 - d0) * 1000 / n

    def processes(self, count: int) -> tuple[float, float]:
        """(this process's reaped children, the daemon's tree) ms per one of ``count``."""
        (*_, s0, t0), (*_, s1, t1) = self.start, self._now()
        n = max(count, 1)
        return (s1 - s0) * 1000 / n, (t1 - t0) * 1000 / n


def _stat_cpu(pid: int | str, tick: int) -> tuple[float, float]:
    """(own, own + reaped children's) CPU seconds of ``pid``."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(stat[11]) + int(stat[12])) / tick
    return own, own + (int(stat[13]) + int(stat[14])) / tick


def _tree_cpu(daemon: int, tick: int) -> tuple[float, float]:
    """The daemon's own CPU seconds, and its tree's (see _Cpu)."""
    own, tree = _stat_cpu(daemon, tick)
    for children in Path(f"/proc/{daemon}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for pid in children.read_text().split():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    if b"/sandbox/template_py.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        for template in (
                            Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                        ):
                            tree += _stat_cpu(template, tick)[1]
    return own, tree


def _load(workers: list[Callable[[], bool]], seconds: float) -> Stats:
    """Each worker called in a loop by a thread of its own for ``seconds``."""
    ms: list[list[float]] = [[] for _ in workers]
    failed = [0] * len(workers)
    start_line = threading.Barrier(len(workers) + 1)
    stop_at = [0.0]

    def loop(i: int) -> None:
        start_line.wait()
        while time.monotonic() < stop_at[0]:
            began = time.perf_counter()
            failed[i] += not workers[i]()
            ms[i].append((time.perf_counter() - began) * 1000)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(workers))]
    for thread in threads:
        thread.start()
    stop_at[0] = time.monotonic() + seconds
    began = time.monotonic()
    start_line.wait()
    for thread in threads:
        thread.join()
    every = [x for row in ms for x in row]
    return Stats.of(every, rate=len(every) / (time.monotonic() - began), failed=sum(failed))


def _burst(daemon: _Daemon, path: str, count: int) -> Stats:
    """``count`` calls at the same moment, each on a connection of its own."""
    conns = [daemon.connect() for _ in range(count)]
    for conn in conns:
        conn.connect()
    ms = [0.0] * count
    ok = [False] * count
    start_line = threading.Barrier(count)

    def one(i: int) -> None:
        start_line.wait()
        began = time.perf_counter()
        with contextlib.suppress(OSError):
            ok[i] = _ran(daemon.request("POST", path, {"input": {"n": i}}, conns[i]))
        ms[i] = (time.perf_counter() - began) * 1000

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for conn in conns:
        conn.close()
    return Stats.of(ms, failed=ok.count(False))


def _ran(answer: tuple[int, Any]) -> bool:
    status, body = answer
    return status == 200 and isinstance(body, dict) and body.get("status") == "succeeded"


def _caller(daemon: _Daemon, path: str) -> Callable[[], bool]:
    """A client on one keep-alive connection, calling ``path``."""
    conn = daemon.connect()
    n = [0]

    def call() -> bool:
        n[0] += 1
        return _ran(daemon.request("POST", path, {"input": {"n": n[0]}}, conn))

    return call


def bare_jail(machine: Machine, argv: list[str], mounts: tuple[str, ...]) -> list[str]:
    """nsjail starting ``argv`` with runnerd's limits and nothing else: the floor of any
    sandboxed run here."""
    uid = machine.settings.sandbox_uid_base
    cmd = [machine.sandbox.nsjail, "--mode", "o", "--really_quiet", "--user", f"1000:{uid}:1",
           "--group", f"1000:{uid}:1", "--disable_proc", "--rlimit_as", "inf"]  # fmt: skip
    if machine.cgroups.enabled:
        cmd += [*machine.cgroups.nsjail_args, "--cgroup_mem_max",
                str(machine.settings.memory_mb << 20), "--cgroup_pids_max", "64"]  # fmt: skip
    for mount in mounts:
        cmd += ["--bindmount_ro", mount]
    return [*cmd, "--", *argv]


def _spawner(argv: list[str]) -> Callable[[], bool]:
    env = clean_env()
    return lambda: subprocess.run(argv, env=env, stdout=subprocess.DEVNULL).returncode == 0


async def _cold_runs(
    machine: Machine, bare: dict[str, Callable[[], bool]], tools: dict[str, Tool], count: int
) -> dict[str, Stats]:
    """``count`` turns; in each, every bare spawn once, and every tool once in a jail
    started for it (no warm pool), as the daemon calls it; one event loop for all, so
    every jail's end is awaited."""
    ms: dict[str, list[float]] = {label: [] for label in [*bare, *tools]}
    failed = dict.fromkeys(ms, 0)
    try:
        for spawn in bare.values():  # the page cache
            spawn()
        for tool in tools.values():
            await machine.pipeline.run(tool, {"n": 0}, logs=False)
        for i in range(count):
            for label, spawn in bare.items():
                began = time.perf_counter()
                failed[label] += not spawn()
                ms[label].append((time.perf_counter() - began) * 1000)
            for label, tool in tools.items():
                # the last jail ends after its answer: not on this one's clock
                await asyncio.sleep(COLD_PAUSE_S)
                began = time.perf_counter()
                result = await machine.pipeline.run(tool, {"n": i}, logs=False)
                ms[label].append((time.perf_counter() - began) * 1000)
                failed[label] += result.status != "succeeded"
    finally:
        await machine.sandbox.close()
    return {label: Stats.of(ms[label], failed=failed[label]) for label in ms}


def _heavy_env(folder: Path) -> Path | None:
    """A package env of HEAVY_SET, copied from this runnerd's own site-packages (with
    their dist-info folders, as an env holds them), readable by jails; None when a
    package of the set is missing here."""
    env = folder / "heavy-env"
    for name in HEAVY_SET:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            return None
        origin = Path(spec.origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        site = source.parent
        if source.is_dir():
            shutil.copytree(source, env / source.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            env.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, env / source.name)
        for info in site.glob(f"{name.replace('_', '[-_]')}-*.dist-info"):
            shutil.copytree(info, env / info.name)
    for path in [env, *env.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return env


def _import_ms(python: str, env: Path, count: int) -> float:
    """The median time of importing pydantic and requests in a bare interpreter, less
    the interpreter's own start."""
    run = clean_env()

    def timed(code: str) -> float:
        ms = []
        for _ in range(count):
            began = time.perf_counter()
            subprocess.run([python, "-I", "-S", "-c", code], env=run, check=True)
            ms.append((time.perf_counter() - began) * 1000)
        return statistics.median(ms)

    heavy = f"import sys; sys.path.insert(0, {str(env)!r}); import pydantic, requests"
    return timed(heavy) - timed("pass")


async def _sandbox_runs(
    machine: Machine, cases: dict[str, tuple[Job, bool]], count: int, checks: list[float | None]
) -> dict[str, Stats]:
    """``count`` turns of every case, each a Job run by the machine's Sandbox with its
    Python jails forked from templates (True) or fresh nsjails (False); one untimed run
    of each first (a template's start, the page cache). ``checks``: gets the mean time of
    the daemon's checks of a template's child."""
    sandbox = machine.sandbox
    base = sandbox.limits
    ms: dict[str, list[float]] = {label: [] for label in cases}
    failed = dict.fromkeys(ms, 0)

    async def one(label: str, job: Job, templates: bool) -> tuple[float, bool]:
        sandbox.limits = dataclasses.replace(
            base, python_templates=templates, package_templates=templates
        )
        await asyncio.sleep(COLD_PAUSE_S)
        began = time.perf_counter()
        out = await sandbox.run(job, logs=False)
        took = (time.perf_counter() - began) * 1000
        return took, b'"ok":true' in (out.result or b"")

    try:
        for label, (job, templates) in cases.items():
            await one(label, job, templates)
        for _ in range(count):
            for label, (job, templates) in cases.items():
                took, ok = await one(label, job, templates)
                ms[label].append(took)
                failed[label] += not ok
        checks.append(_checks_ms(machine))
    finally:
        sandbox.limits = base
        await sandbox.close()
    return {label: Stats.of(ms[label], failed=failed[label]) for label in ms}


def _checks_ms(machine: Machine) -> float | None:
    checks = sum(t.checks for t in machine.sandbox.templates.values())
    spent = sum(t.check_s for t in machine.sandbox.templates.values())
    return spent * 1000 / checks if checks else None


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    data = Path(tempfile.mkdtemp(prefix="runnerd-bench-", dir="/tmp"))
    data.chmod(0o711)  # jails reach the tool code under it
    try:
        yield data
    finally:
        shutil.rmtree(data, ignore_errors=True)


def run_bench(
    settings: Settings, *, quick: bool = False, say: Callable[[str], None] = lambda _: None
) -> Bench:
    """Every case, in an order that keeps them apart: baselines, cold runs, then the
    daemon (idle memory, list tools, paced, back to back, 8 clients, burst, memory)."""
    sizes = QUICK if quick else FULL
    with _scratch() as data:
        cold = msgspec.structs.replace(
            settings, data_dir=data / "cold", cache_dir=None, toolchain_dir=settings.toolchain_path
        )
        machine = build_machine(cold)
        rt = machine.runtimes
        with_js = rt.node is not None and machine.toolchain.is_installed()
        bench = Bench(machine={
            "runnerd": runnerd.__version__,
            "mode": "quick" if quick else "full",
            "cpus": os.cpu_count(),
            "cgroups": machine.cgroups.mode,
            "python": rt.python.version if rt.python else None,
            "node": rt.node.version if rt.node else None,
            "warm_jails": settings.warm_jails,
            "max_concurrent_runs": settings.max_concurrent_runs,
        })  # fmt: skip
        if rt.node is None:
            bench.skipped.append("JS and TypeScript cases: no Node.js (setting node)")
        elif not with_js:
            bench.skipped.append(
                "JS and TypeScript cases: no toolchain (`runnerd toolchain install`)"
            )
        c = bench.cases
        # Bare spawns and cold runs in turns (the machine's drift hits them alike), then
        # the spawn rate of bare jails.
        bare: dict[str, Callable[[], bool]] = {}
        if rt.python is not None:
            bare_py = [rt.python.executable, "-I", "-S", "-c", "pass"]
            jailed_py = bare_jail(machine, bare_py, rt.python.mounts)
            bare["bare python3 -I -S -c pass"] = _spawner(bare_py)
            bare["bare nsjail + python"] = _spawner(jailed_py)
        if rt.node is not None:
            bare["bare node -e 0"] = _spawner([rt.node.path, "-e", "0"])
            jailed_node = bare_jail(machine, [rt.node.path, "-e", "0"], rt.node.mounts)
            bare["bare nsjail + node"] = _spawner(jailed_node)
        say("baselines and cold runs (no warm jail), in turns")
        cold_tools = [("Python", "cold_py", ".py", PY_TOOL)]
        if with_js:
            cold_tools += [("JS", "cold_js", ".mjs", JS_TOOL), ("TS", "cold_ts", ".ts", TS_TOOL)]
        cold_jobs = {f"cold {label} tool": bench_tool(machine, name, ext, source)
                 for label, name, ext, source in cold_tools}  # fmt: skip
        machine.sandbox.limits = dataclasses.replace(machine.sandbox.limits,
                                                     python_templates=False)  # fmt: skip
        c.update(asyncio.run(_cold_runs(machine, bare, cold_jobs, sizes.runs)))
        if rt.python is not None:
            say("Python runs in the sandbox: forked from templates, and fresh nsjails")
            request = json.dumps({"code": PY_TOOL, "file": "/tool/t.py", "input": {"n": 1}})
            jobs = {"trivial": Job("python", 10_000, request.encode())}
            heavy = _heavy_env(data)
            if heavy is None:
                bench.skipped.append(f"the heavy package set: not all of {HEAVY_SET} here")
            else:
                heavy_request = json.dumps({"code": HEAVY_TOOL, "file": "/tool/t.py",
                                            "input": {"n": 1}})  # fmt: skip
                jobs["pydantic + requests"] = Job("python", 10_000, heavy_request.encode(),
                                                  env_dir=heavy)  # fmt: skip
                bench.import_ms = _import_ms(rt.python.executable, heavy, sizes.runs)
            cases = {f"Python, {name}, {path}": (job, path == "template")
                     for name, job in jobs.items() for path in ("template", "nsjail")}  # fmt: skip
            checks: list[float | None] = []
            sandboxed = asyncio.run(_sandbox_runs(machine, cases, sizes.runs, checks))
            bench.checks_ms = checks[0] if checks else None
            c.update(sandboxed)
        if rt.python is not None:
            say("the spawn rate of bare jails")
            for workers in (2, CLIENTS):
                cpu = _Cpu()
                c[f"bare nsjail + python, {workers} workers"] = spawned = _load(
                    [_spawner(jailed_py)] * workers, sizes.spawn_s
                )
            total, clients, _ = cpu.per(spawned.n)
            bench.cpu_ms["bare spawn"] = total - clients  # the spawner is no jail's cost
            bench.cpu_ms["bare spawn, processes"] = cpu.processes(spawned.n)[0]

        say("starting a throwaway daemon")
        daemon = _Daemon(settings, data / "daemon")
        try:
            tools_of_app = [("bench_py", ".py", PY_TOOL)]
            tools_of_app += [("bench_js", ".mjs", JS_TOOL)] * with_js
            install = daemon.install(_app_files(tools_of_app))
            runs = f"/api/v2/apps/installs/{install}/tools/{{}}/run"
            py, js = runs.format("bench_py"), runs.format("bench_js")
            time.sleep(1)  # the pools of both kinds are warm again after the deploy
            bench.memory_mb["idle"] = daemon.rss_mb()
            say("list tools, paced and back-to-back calls")
            conn = daemon.connect()
            tools = f"/api/v2/apps/tools?workspaceId={daemon.workspace_id}"
            c["list tools"] = _timed(
                lambda: daemon.request("GET", tools, conn=conn)[0] == 200, sizes.list_calls
            )
            c["Python tool, paced"] = _timed(_caller(daemon, py), sizes.paced, pause_s=0.15)
            c["Python tool, back to back"] = _timed(_caller(daemon, py), sizes.back_to_back_py)
            if with_js:
                c["JS tool, paced"] = _timed(_caller(daemon, js), sizes.paced, pause_s=0.15)
                c["JS tool, back to back"] = _timed(_caller(daemon, js), sizes.back_to_back_js)
            say(f"{CLIENTS} clients for {sizes.load_s:g} s")
            callers = [_caller(daemon, py) for _ in range(CLIENTS)]
            cpu = _Cpu(daemon.proc.pid)
            c[f"Python tool, {CLIENTS} clients"] = loaded = _load(callers, sizes.load_s)
            total, clients, served = cpu.per(loaded.n)
            bench.cpu_ms.update({"runnerd run": total - clients, "daemon": served,
                                 "jails and kernel": total - clients - served,
                                 "clients": clients})  # fmt: skip
            tree = cpu.processes(loaded.n)[1]
            bench.cpu_ms["runnerd run, processes"] = tree
            bench.cpu_ms["jails, processes"] = tree - served
            bench.memory_mb["after load"] = daemon.rss_mb()
            say(f"a burst of {BURST} calls after {sizes.idle_s:g} s idle")
            time.sleep(sizes.idle_s)
            c[f"Python tool, burst of {BURST}"] = _burst(daemon, py, BURST)
            bench.memory_mb["after the burst"] = daemon.rss_mb()
        finally:
            daemon.close()
        if settings.python_templates:
            say("the same daemon with Python templates off: a fresh nsjail per call")
            off = msgspec.structs.replace(settings, python_templates=False)
            daemon = _Daemon(off, data / "daemon-nsjail")
            try:
                install = daemon.install(_app_files([("bench_py", ".py", PY_TOOL)]))
                py = f"/api/v2/apps/installs/{install}/tools/bench_py/run"
                time.sleep(1)
                c["Python tool (nsjail), paced"] = _timed(
                    _caller(daemon, py), sizes.paced, pause_s=0.15
                )
                c["Python tool (nsjail), back to back"] = _timed(
                    _caller(daemon, py), sizes.back_to_back_py
                )
                callers = [_caller(daemon, py) for _ in range(CLIENTS)]
                cpu = _Cpu(daemon.proc.pid)
                c[f"Python tool (nsjail), {CLIENTS} clients"] = loaded = _load(
                    callers, sizes.load_s
                )
                total, clients, served = cpu.per(loaded.n)
                bench.cpu_ms["runnerd run, nsjail"] = total - clients
                bench.cpu_ms["daemon, nsjail"] = served
                bench.cpu_ms["jails and kernel, nsjail"] = total - clients - served
                tree = cpu.processes(loaded.n)[1]
                bench.cpu_ms["runnerd run, processes, nsjail"] = tree
                bench.cpu_ms["jails, processes, nsjail"] = tree - served
            finally:
                daemon.close()
    return bench
