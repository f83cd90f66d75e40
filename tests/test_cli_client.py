"""The CLI as a client of a real daemon: admin, deploy, publish, install, tools list/run,
switch and rollback, with human and --json output and every problem printed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import EXAMPLE, RUNNERD, run_cli
from daemon import Daemon

pytestmark = pytest.mark.jail


def cli(
    d: Daemon, *args: str, key: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=d.client_env(key), cwd=cwd)


@pytest.mark.smoke
def test_the_example_from_deploy_to_run(daemon: Daemon) -> None:
    deployed = cli(daemon, "app", "deploy", str(EXAMPLE))
    assert deployed.returncode == 0, deployed.stderr
    assert deployed.stdout.startswith("deployed deal-desk version 1 (ver_")
    lines = deployed.stdout.splitlines()
    assert lines[0].endswith("2 tools: route_ticket, score_offer")
    assert lines[1] == "pages: 4 files"
    published = cli(daemon, "app", "publish", "--version", "1", cwd=EXAMPLE)
    assert published.stdout.startswith("published deal-desk version 1 at ")
    installed = cli(daemon, "app", "install", "--app", "deal-desk", "--version", "1", "--json")
    install = json.loads(installed.stdout)
    assert (install["appSlug"], install["version"]) == ("deal-desk", "1")
    listed = cli(daemon, "tools", "list")
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [
        "deal-desk/route_ticket",
        "deal-desk/score_offer",
    ]
    ran = cli(
        daemon,
        "tools",
        "run",
        "deal-desk/route_ticket",
        "--input",
        '{"subject": "Invoice", "customer_tier": "free"}',
        "--json",
    )
    body = json.loads(ran.stdout)
    assert ran.returncode == 0
    assert (body["status"], body["output"]) == (
        "succeeded",
        {"queue": "billing", "priority": "normal"},
    )
    row = daemon.store().get_run(body["runId"])
    assert row is not None and row.surface == "api"  # a personal key proves no more
    by_api = cli(daemon, "runs", "list", "--app", "deal-desk", "--surface", "api")
    assert by_api.stdout.startswith(body["runId"]), by_api.stderr
    by_app = cli(daemon, "runs", "list", "--app", "deal-desk", "--surface", "app")
    assert by_app.stdout == "no runs\n", by_app.stderr


def test_refused_run_prints_the_reason_and_exits_1(daemon: Daemon) -> None:
    proc = cli(daemon, "tools", "run", "deal-desk/route_ticket", "--input", '{"subject": 3}')
    assert proc.returncode == 1
    assert "BAD_REQUEST" in proc.stderr and "INVALID_INPUT" in proc.stderr


def test_deploy_prints_every_problem(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "agentserve.app.yaml").write_text("slug: bad\nname: Bad\ntools: ./tools/*\n")
    (tmp_path / "tools" / "x.tool.yaml").write_text(
        "name: y\ndescription: d\ninput: {type: object}\noutput: {type: array}\n"
    )
    (tmp_path / "tools" / "x.ts").write_text("export const nothing = 1\n")
    proc = cli(daemon, "app", "deploy", str(tmp_path))
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[0] == "runnerd: 3 problems in the upload; nothing stored"  # as the CLI's own
    assert "tools/x.tool.yaml:1: name 'y' does not match the file name x.tool.yaml" in lines[1]
    assert lines[2].startswith("tools/x.tool.yaml:4: output.type")
    assert lines[3] == "tools/x.ts: ES module without a `run` export or a default-exported function"


def test_switch_and_rollback_by_app(daemon: Daemon, tmp_path: Path) -> None:
    for version in ("1.0", "2.0"):
        root = tmp_path / version
        (root / "tools").mkdir(parents=True)
        (root / "agentserve.app.yaml").write_text(
            f"slug: flip\nname: Flip\nversion: '{version}'\ntools: ./tools/*\n"
        )
        (root / "tools" / "v.tool.yaml").write_text(
            json.dumps(
                {
                    "name": "v",
                    "description": "d",
                    "input": {"type": "object"},
                    "output": {"type": "object"},
                }
            )
        )
        (root / "tools" / "v.py").write_text(f"def run(i):\n    return {{'v': '{version}'}}\n")
        assert cli(daemon, "app", "deploy", str(root)).returncode == 0
        assert cli(daemon, "app", "publish", "--app", "flip", "--version", version).returncode == 0
    assert cli(daemon, "app", "install", "--app", "flip", "--version", "1.0").returncode == 0
    switched = cli(daemon, "app", "switch", "--app", "flip", "--version", "2.0")
    assert switched.stdout.startswith("switched flip version 2.0")
    run = json.loads(cli(daemon, "tools", "run", "flip/v", "--input", "{}", "--json").stdout)
    assert run["output"] == {"v": "2.0"}
    rolled = cli(daemon, "app", "rollback", "--app", "flip")
    assert rolled.stdout.startswith("rolled back flip version 1.0")
    again = cli(daemon, "app", "rollback", "--app", "flip", "--json")
    assert json.loads(again.stdout)["version"] == "2.0"  # rollback of a rollback
    listing = cli(daemon, "app", "list")
    assert "flip (Flip)" in listing.stdout and "published" in listing.stdout


def test_admin_commands_add_people_roles_and_keys(daemon: Daemon) -> None:
    env = {**daemon.env}
    added = subprocess.run(
        [
            RUNNERD,
            "admin",
            "add-person",
            "--workspace",
            daemon.workspace_id,
            "--email",
            "bo@example.com",
            "--role",
            "builder",
            "--apps-access",
            "--key",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    person = json.loads(added.stdout)
    assert (person["role"], person["appsAccess"]) == ("builder", True)
    listed = cli(daemon, "tools", "list", "--json", key=person["apiKey"])
    assert listed.returncode == 0
    token = json.loads(
        subprocess.run(
            [
                RUNNERD,
                "admin",
                "token",
                "--email",
                "bo@example.com",
                "--scope",
                "api:read",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
    )
    refused = cli(
        daemon,
        "tools",
        "run",
        "deal-desk/route_ticket",
        "--input",
        '{"subject": "x", "customer_tier": "free"}',
        key=token["apiKey"],
    )
    assert refused.returncode == 1 and "INSUFFICIENT_SCOPE" in refused.stderr
    ws_key = json.loads(
        subprocess.run(
            [RUNNERD, "admin", "workspace-key", "--workspace", daemon.workspace_id, "--json"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
    )
    refused = cli(daemon, "tools", "list", key=ws_key["apiKey"])
    assert "WORKSPACE_KEY_NOT_ALLOWED" in refused.stderr
    subprocess.run(
        [
            RUNNERD,
            "admin",
            "set-role",
            "--workspace",
            daemon.workspace_id,
            "--email",
            "bo@example.com",
            "--no-apps-access",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    refused = cli(daemon, "tools", "list", key=person["apiKey"])
    assert "INSUFFICIENT_WORKSPACE_ROLE" in refused.stderr
    revoked = subprocess.run(
        [RUNNERD, "admin", "revoke-key", token["keyId"]], env=env, capture_output=True, text=True
    )
    assert revoked.returncode == 0
    assert "UNAUTHORIZED" in cli(daemon, "tools", "list", key=token["apiKey"]).stderr
