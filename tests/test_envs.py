"""Package environments: keys, sharing, coalescing, failures, listing and pruning."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from conftest import EXAMPLE, machine_env, make_tool, run_cli, upload_version
from runnerd.errors import EnvBuildFailed
from runnerd.run.machine import Machine
from runnerd.store import Store
from runnerd.upload.walk import read_app_dir

pytestmark = [pytest.mark.jail, pytest.mark.network]


def test_key_is_ecosystem_runtime_and_sorted_pins(machine: Machine) -> None:
    a = machine.envs.key("python", ["b==1.0", "a==2.0"])
    b = machine.envs.key("python", ["a==2.0", "b==1.0"])
    assert a == b and a.startswith("pypi-python3.")
    assert machine.envs.key("typescript", ["zod@3.25.76"]) == machine.envs.key(
        "javascript", ["zod@3.25.76"]
    )
    assert machine.envs.key("javascript", ["zod@3.25.76"]).startswith("npm-node")


def test_tools_without_packages_use_no_env(machine: Machine) -> None:
    assert asyncio.run(machine.envs.ensure("python", ())) is None


def test_concurrent_builds_of_one_key_coalesce(machine: Machine) -> None:
    pins = ("six==1.16.0",)
    key = machine.envs.key("python", pins)
    assert machine.envs.ready("python", pins) is None

    async def many() -> list[Path | None]:
        return await asyncio.gather(*(machine.envs.ensure("python", pins) for _ in range(4)))

    paths = asyncio.run(many())
    assert len(set(paths)) == 1 and paths[0] is not None
    built = [e for e in machine.envs.list() if e.key == key]
    assert len(built) == 1 and built[0].packages == pins
    # Nothing half-built is left beside it.
    assert not [p for p in machine.envs.root.iterdir() if p.name.startswith(".build-")]
    # Sealed: root-owned, not writable by the jails.
    site = machine.envs.root / key / "site"
    assert site.stat().st_uid == 0 and not site.stat().st_mode & 0o022


def test_build_failure_reports_the_installers_message(machine: Machine) -> None:
    with pytest.raises(EnvBuildFailed) as caught:
        machine.envs.ensure_sync("python", ("attrs==0.0.1",))
    assert "attrs" in str(caught.value) and "0.0.1" in str(caught.value)
    with pytest.raises(EnvBuildFailed) as npm:
        machine.envs.ensure_sync("javascript", ("zod@0.0.999",))
    assert "No matching version" in str(npm.value) or "ETARGET" in str(npm.value)


def test_run_uses_the_env_and_builds_it_first_when_missing(machine: Machine) -> None:
    tool = make_tool(
        machine,
        "import six\ndef run(i):\n    return {'v': six.__version__}\n",
        packages=("six==1.16.0",),
    )
    assert asyncio.run(machine.pipeline.run(tool, {})).output == {"v": "1.16.0"}


def test_envs_list_and_prune_through_the_cli(machine: Machine, tmp_path: Path) -> None:
    data = machine.settings.data_dir
    app = tmp_path / "app"
    (app / "tools").mkdir(parents=True)
    (app / "agentserve.app.yaml").write_text("slug: pk\nname: Pk\ntools: ./tools/*\n")
    (app / "tools" / "p.tool.yaml").write_text(
        json.dumps(
            {
                "name": "p",
                "description": "d",
                "input": {"type": "object"},
                "output": {"type": "object"},
                "packages": ["six==1.16.0"],
            }
        )
    )
    (app / "tools" / "p.py").write_text("def run(i):\n    return {}\n")
    store = Store.in_data_dir(data)
    upload_version(store, read_app_dir(app), toolchain=machine.toolchain)
    store.close()
    machine.envs.ensure_sync("python", ("six==1.16.0",))  # as the deploy route builds it
    machine.envs.ensure_sync("python", ("attrs==24.2.0",))  # used by no stored version
    env = {**machine_env(machine), "RUNNERD_DATA_DIR": str(data)}
    listed = json.loads(
        run_cli("envs", "list", "--json", "--data-dir", str(data), env=env, check=True).stdout
    )
    by_packages = {tuple(e["packages"]): e for e in listed}
    assert by_packages[("six==1.16.0",)]["usedBy"] == ["pk@1/p"]
    assert by_packages[("six==1.16.0",)]["sizeBytes"] > 10_000
    assert by_packages[("attrs==24.2.0",)]["usedBy"] == []
    pruned = json.loads(
        run_cli("envs", "prune", "--json", "--data-dir", str(data), env=env, check=True).stdout
    )
    assert pruned["removed"] == [by_packages[("attrs==24.2.0",)]["key"]]
    assert machine.envs.ready("python", ("six==1.16.0",)) is not None
    assert EXAMPLE.is_dir()
