"""Shared fixtures: real toolchain, real SQLite files, app folders written to tmp_path."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pg_cluster import PgCluster
from runnerd.config import load_settings
from runnerd.model import Bundle, Tool
from runnerd.run.machine import Machine, build_machine
from runnerd.run.runtimes import find_node
from runnerd.run.toolchain import Toolchain
from runnerd.run.verdict import RunResult
from runnerd.store import Store, VersionRecord
from runnerd.upload.bundle import load_bundle
from runnerd.upload.deploy import check_upload

if TYPE_CHECKING:
    from daemon import Daemon
    from inproc import InProcess

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "deal-desk"
# The console script installed beside the Python running the tests.
RUNNERD = str(Path(sys.executable).with_name("runnerd"))


def run_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    input: str | None = None,
    check: bool = False,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``runnerd ARGS`` as a user runs it: this environment, plus ``env``."""
    return subprocess.run(
        [RUNNERD, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        input=input,
        check=check,
        timeout=timeout,
    )


def machine_env(machine: Machine) -> dict[str, str]:
    """The variables that make a local ``runnerd`` command use ``machine``'s data dir,
    toolchain and sandbox uids."""
    s = machine.settings
    return {
        "RUNNERD_TOOLCHAIN_DIR": str(s.toolchain_path),
        "RUNNERD_DATA_DIR": str(s.data_dir),
        "RUNNERD_SANDBOX_UID_BASE": str(s.sandbox_uid_base),
        "RUNNERD_SANDBOX_UID_COUNT": str(s.sandbox_uid_count),
    }


@pytest.fixture(scope="session")
def toolchain_dir() -> Path:
    """One toolchain for the whole run (installed by scripts/setup, or here if missing)."""
    return Path(os.environ.get("RUNNERD_TOOLCHAIN_DIR", REPO / ".cache" / "toolchain"))


@pytest.fixture(scope="session")
def toolchain(toolchain_dir: Path) -> Toolchain:
    chain = Toolchain(toolchain_dir, find_node())
    chain.install()
    return chain


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module with ``BACKENDS = ("sqlite", "postgresql")`` runs its ``daemon`` tests
    once on each store."""
    if "backend" in metafunc.fixturenames and hasattr(metafunc.module, "BACKENDS"):
        metafunc.parametrize("backend", metafunc.module.BACKENDS, indirect=True, scope="module")


@pytest.fixture(scope="module")
def backend(request: pytest.FixtureRequest) -> str:
    """The store of the module's daemon: "sqlite" unless the module's BACKENDS say more."""
    return str(getattr(request, "param", "sqlite"))


def _module_settings(request: pytest.FixtureRequest, backend: str) -> dict[str, str]:
    """The module's ``DAEMON_SETTINGS`` (setting name -> value), and a new PostgreSQL
    database when the backend is "postgresql"."""
    settings = dict(getattr(request.module, "DAEMON_SETTINGS", {}))
    if backend == "postgresql":
        settings["database_url"] = request.getfixturevalue("pg").new_database()
    return settings


@pytest.fixture(scope="module")
def daemon(request: pytest.FixtureRequest, toolchain_dir: Path, backend: str) -> Iterator[Daemon]:
    """A live ``runnerd serve`` for the module, with the module's ``DAEMON_SETTINGS``
    (setting name -> value) on top of the defaults; on PostgreSQL when the module's
    ``BACKENDS`` ask for it. For what runs tools, and the transport."""
    from daemon import running_daemon

    with running_daemon(toolchain_dir, **_module_settings(request, backend)) as d:
        yield d


@pytest.fixture(scope="module")
def app_daemon(
    request: pytest.FixtureRequest, toolchain_dir: Path, backend: str
) -> Iterator[InProcess]:
    """The daemon's app in this process for the module (tests/inproc.py), with the
    module's ``DAEMON_SETTINGS`` and ``BACKENDS`` as ``daemon`` has them: the same
    helpers, no port, no jail (a test that runs a tool fails)."""
    from inproc import in_process

    with in_process(toolchain_dir, **_module_settings(request, backend)) as d:
        yield d


@pytest.fixture(autouse=True)
def _no_jail_in_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test of the module's in-process app fails if it started nsjail (it runs a tool:
    it belongs on the ``daemon`` fixture, marked ``jail``)."""
    if "app_daemon" not in request.fixturenames:
        yield
        return
    app: InProcess = request.getfixturevalue("app_daemon")
    yield
    if app.jail_started:
        from inproc import JAIL_STARTED

        app.forget_jail_start()  # the next test of the module starts clean
        pytest.fail(JAIL_STARTED)


# --- egress: the tests' own network, and a daemon that may reach it ----------------------------


@pytest.fixture(scope="session")
def lab() -> Iterator[Any]:
    """The egress lab (tests/egress_lab.py): a network namespace with test servers."""
    from egress_lab import egress_lab

    with egress_lab() as found:
        yield found


@pytest.fixture(scope="session")
def egress_daemon(lab: Any, toolchain_dir: Path) -> Iterator[Daemon]:
    """A daemon that resolves names through the lab's hosts file and may reach the lab's
    network; per run at most 1 MB and 16 connections."""
    from daemon import running_daemon

    with running_daemon(
        toolchain_dir,
        wrap=lab.wrap,
        egress_allow_networks=lab.network,
        egress_max_mb="1",
        egress_max_connections="16",
    ) as d:
        yield d


@pytest.fixture(scope="session")
def caller(egress_daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An install of egress_daemon granted caller_grant, with the lab's CALLER_TOOLS."""
    from egress_lab import CALLER_TOOLS, app_dir, caller_grant

    grant = caller_grant(egress_daemon)
    root = app_dir(tmp_path_factory.mktemp("caller"), "caller", grant, CALLER_TOOLS)
    install = egress_daemon.ship(root)
    assert install["egress"] == grant
    return str(install["installId"])


@pytest.fixture(scope="session")
def pg() -> Iterator[PgCluster]:
    """A throwaway PostgreSQL cluster for the session (tests/pg_cluster.py)."""
    cluster = PgCluster()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The store on each backend: a SQLite file in a data dir, and a fresh PostgreSQL
    database."""
    if request.param == "sqlite":
        db = Store.in_data_dir(tmp_path / "data")
    else:
        db = Store(request.getfixturevalue("pg").new_database())
    yield db
    db.close()


OPEN_SCHEMA: dict[str, Any] = {"type": "object"}

TOOL_YAML = """\
name: {name}
description: Adds one to n.
input:
  type: object
  required: [n]
  properties:
    n: {{ type: number }}
output:
  type: object
  properties:
    n: {{ type: number }}
"""

PY_SOURCE = "def run(input):\n    return {'n': input['n'] + 1}\n"
TS_SOURCE = (
    "export function run(input: { n: number }): { n: number } {\n  return { n: input.n + 1 }\n}\n"
)


class AppDir:
    """An app folder under construction: ``write`` files, then check it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, rel: str, text: str | bytes) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(textwrap.dedent(text) if text.startswith("\n") else text)
        return path

    def tool(
        self, name: str, ext: str = ".py", *, yaml: str | None = None, source: str | None = None
    ) -> None:
        self.write(
            f"tools/{name}.tool.yaml", yaml if yaml is not None else TOOL_YAML.format(name=name)
        )
        default = PY_SOURCE if ext == ".py" else TS_SOURCE
        self.write(f"tools/{name}{ext}", source if source is not None else default)


def tool_doc(
    name: str,
    *,
    description: str = "a test tool",
    input: Any = None,
    output: Any = None,
    **fields: Any,
) -> str:
    """A ``<name>.tool.yaml`` with these fields, written as JSON (which YAML reads);
    input and output default to ``{type: object}``."""
    doc = {
        "name": name,
        "description": description,
        **fields,
        "input": OPEN_SCHEMA if input is None else input,
        "output": OPEN_SCHEMA if output is None else output,
    }
    return json.dumps(doc)


def write_app(
    root: Path,
    slug: str,
    tools: Mapping[str, str],
    *,
    version: str | None = None,
    docs: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """An app folder: its manifest, and for each tool (name -> Python source) the source
    and a tool file (tool_doc, with the fields ``docs[name]``)."""
    app = AppDir(root)
    line = f"version: '{version}'\n" if version is not None else ""
    app.write(
        "agentserve.app.yaml", f"slug: {slug}\nname: {slug.title()}\n{line}tools: ./tools/*\n"
    )
    for name, source in tools.items():
        app.tool(name, yaml=tool_doc(name, **(docs or {}).get(name, {})), source=source)
    return root


@pytest.fixture
def make_app(tmp_path: Path) -> Callable[..., AppDir]:
    """A factory of app folders with a manifest (slug ``demo``) and no tools yet."""
    count = 0

    def make(manifest: str = "slug: demo\nname: Demo\ntools: ./tools/*\n") -> AppDir:
        nonlocal count
        count += 1
        app = AppDir(tmp_path / f"app{count}")
        app.write("agentserve.app.yaml", manifest)
        return app

    return make


def upload_version(
    store: Store, files: Mapping[str, bytes], *, toolchain: Toolchain | None
) -> tuple[VersionRecord, Bundle]:
    """``files`` checked as a deploy checks them and stored as a new version, as the deploy
    route does (without package environments); raises what check_upload and add_version
    raise, and then the store is unchanged."""
    bundle = check_upload(files, toolchain=toolchain, envs=None)
    return store.add_version(bundle), bundle


# --- the run machinery: one machine per test session, real nsjail ------------------------------


@pytest.fixture(scope="session")
def machine(toolchain_dir: Path) -> Iterator[Machine]:
    # Not under pytest's 0700 tmp folder: jails' uids must be able to enter the data dir.
    data = Path(tempfile.mkdtemp(prefix="runnerd-test-", dir="/tmp"))
    data.chmod(0o711)
    settings = load_settings(
        env={},
        flags={
            "data_dir": data,
            "toolchain_dir": toolchain_dir,
            "sandbox_uid_base": 610_000,
            "sandbox_uid_count": 64,
        },
    )
    yield build_machine(settings)
    shutil.rmtree(data, ignore_errors=True)


def make_tool(
    machine: Machine,
    source: str,
    *,
    ext: str = ".py",
    name: str = "t",
    input_schema: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    timeout_ms: int = 10_000,
    packages: tuple[str, ...] = (),
    effect: str = "read",
) -> Tool:
    """A tool checked exactly as an upload checks it, from in-memory files."""
    doc = {
        "name": name,
        "description": "a test tool",
        "effect": effect,
        "timeoutMs": timeout_ms,
        "input": input_schema or OPEN_SCHEMA,
        "output": output_schema or OPEN_SCHEMA,
        "packages": list(packages),
    }
    files = {
        "agentserve.app.yaml": b"slug: test\nname: Test\ntools: ./*\n",
        f"{name}.tool.yaml": json.dumps(doc).encode(),
        f"{name}{ext}": source.encode(),
    }
    [tool] = load_bundle(files, toolchain=machine.toolchain).tools
    if packages:
        machine.envs.ensure_sync(tool.language, tool.packages)
    return tool


def run_tool(machine: Machine, tool: Tool, value: Any = None, **kw: Any) -> RunResult:
    return asyncio.run(machine.pipeline.run(tool, {} if value is None else value, **kw))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The slowest /healthz answer seen while the hostile tests attacked a daemon."""
    from daemon import WORST_HEALTH_MS

    if WORST_HEALTH_MS:
        worst = max(ms for ms, _ in WORST_HEALTH_MS)
        probes = sum(n for _, n in WORST_HEALTH_MS)
        terminalreporter.write_line(
            f"/healthz during {len(WORST_HEALTH_MS)} attacks: {probes} probes, "
            f"slowest {worst:.1f} ms"
        )
