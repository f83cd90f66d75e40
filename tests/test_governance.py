"""Governance through the daemon's app in this process (tests/inproc.py), where nothing
runs: secrets listed by name and their rules, approvals that cannot be released, a spent
budget before approval, budget values, one daemon per data dir. Runs (secrets in them,
budgets spent, the ledger, the audit of runs, approvals that run, idempotency, history)
are in test_governance_daemon.py, on a real daemon."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import RUNNERD, write_app
from daemon import Runnerd, envelope
from inproc import InProcess, in_process

# The tests on the module's app run on both stores.
BACKENDS = ("sqlite", "postgresql")
DAEMON_SETTINGS = {"approval_ttl_s": "600"}


def gov_app(root: Path, *, version: str = "1") -> Path:
    """Tools: `echo` reads its secret and echoes input; `send` is a write tool;
    `slow` sleeps input.ms."""
    tools = {
        "echo": (
            "read",
            "import os\ndef run(i):\n"
            "    return {'echo': i.get('text'), 'secret_len': len(os.environ.get('API_TOKEN', '')),"
            " 'leak': os.environ.get('API_TOKEN') if i.get('leak') else None}\n",
        ),
        "send": ("write", "def run(i):\n    return {'sent': i['to']}\n"),
        "slow": (
            "read",
            "import time\ndef run(i):\n    time.sleep(i.get('ms', 0) / 1000)\n"
            "    return {'slept': i.get('ms', 0)}\n",
        ),
    }
    docs = {
        name: {"description": f"the {name} tool", "effect": effect, "timeoutMs": 20000}
        for name, (effect, _) in tools.items()
    }
    sources = {name: source for name, (_, source) in tools.items()}
    return write_app(root, "gov", sources, version=version, docs=docs)


@pytest.fixture(scope="module")
def gov(
    app_daemon: InProcess, tmp_path_factory: pytest.TempPathFactory
) -> tuple[InProcess, dict[str, Any]]:
    return app_daemon, app_daemon.ship(gov_app(tmp_path_factory.mktemp("gov")))


def put_secret(d: Runnerd, install_id: str, name: str, value: str, key: str | None = None) -> Any:
    return d.call(
        "PUT",
        f"/api/v2/apps/installs/{install_id}/secrets/{name}",
        key or d.admin_key,
        json={"value": value},
    )


def audit(d: Runnerd, **params: str) -> list[dict[str, Any]]:
    response = d.call(
        "GET",
        "/api/v2/audit",
        d.admin_key,
        params={"workspaceId": d.workspace_id, "limit": "1000", **params},
    )
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


# --- secrets ----------------------------------------------------------------------------------


def test_secrets_are_listed_by_name_never_returned(gov: tuple[InProcess, dict[str, Any]]) -> None:
    d, install = gov
    iid = install["installId"]
    put_secret(d, iid, "STRIPE_KEY", "sk_live_" + "s" * 24)
    listed = d.call("GET", f"/api/v2/apps/installs/{iid}/secrets", d.admin_key).json()
    names = {s["name"] for s in listed["data"]}
    assert "STRIPE_KEY" in names
    assert all(set(s) == {"name", "updatedAt"} for s in listed["data"])
    assert "sk_live_" not in json.dumps(listed)
    builder = d.person("secret-builder@example.com", role="builder")
    assert d.call("GET", f"/api/v2/apps/installs/{iid}/secrets", builder).status_code == 200
    envelope(
        put_secret(d, iid, "X_KEY", "value-1234", key=builder), 403, "INSUFFICIENT_WORKSPACE_ROLE"
    )
    member = d.person("secret-member@example.com")
    envelope(
        d.call("GET", f"/api/v2/apps/installs/{iid}/secrets", member),
        403,
        "INSUFFICIENT_WORKSPACE_ROLE",
    )
    for bad in ("lower", "PATH", "LD_PRELOAD", "NODE_OPTIONS", "1ABC"):
        envelope(put_secret(d, iid, bad, "value-1234"), 400, "INVALID_SECRET_NAME")
    envelope(put_secret(d, iid, "SHORT", "abc"), 400, "INVALID_SECRET_VALUE")
    deleted = d.call("DELETE", f"/api/v2/apps/installs/{iid}/secrets/STRIPE_KEY", d.admin_key)
    assert deleted.json() == {"name": "STRIPE_KEY", "deleted": True}
    envelope(
        d.call("DELETE", f"/api/v2/apps/installs/{iid}/secrets/STRIPE_KEY", d.admin_key),
        404,
        "SECRET_NOT_FOUND",
    )
    actions = [
        (e["action"], e["detail"].get("name"))
        for e in audit(d, installId=iid)
        if e["action"].startswith("secret.")
    ]
    assert ("secret.set", "STRIPE_KEY") in actions and ("secret.delete", "STRIPE_KEY") in actions


# --- approvals --------------------------------------------------------------------------------


def test_an_approval_does_not_run_for_a_person_who_lost_the_right_to_run(
    gov: tuple[InProcess, dict[str, Any]],
) -> None:
    """A relay call waits; its asker is demoted to viewer meanwhile: approving it is
    refused (the run would be theirs), the approval stays pending, and nothing runs."""
    d, install = gov
    iid = install["installId"]
    asker = d.person("demoted@example.com")
    held = d.run(iid, "send", {"to": "z"}, key=asker, surface="relay").json()
    store = d.store()
    asker_id = store.ensure_user("demoted@example.com").id
    store.set_membership(d.workspace_id, asker_id, role="viewer", apps_access=True)
    store.close()
    approve = f"/api/v2/approvals/{held['approvalId']}/approve"
    envelope(d.call("POST", approve, d.admin_key), 409, "ASKER_NO_LONGER_ALLOWED")
    listed = d.call(
        "GET", "/api/v2/approvals", d.admin_key, params={"workspaceId": d.workspace_id}
    ).json()["data"]
    found = next(a for a in listed if a["approvalId"] == held["approvalId"])
    assert found["status"] == "pending" and found["runId"] is None


def test_approvals_expire_and_cannot_be_released(toolchain_dir: Path, tmp_path: Path) -> None:
    with in_process(toolchain_dir, approval_ttl_s="1") as d:
        iid = d.ship(gov_app(tmp_path))["installId"]
        pending = d.run(iid, "send", {"to": "z"}, surface="chat").json()
        time.sleep(1.5)
        envelope(
            d.call("POST", f"/api/v2/approvals/{pending['approvalId']}/approve", d.admin_key),
            409,
            "APPROVAL_NOT_PENDING",
        )
        listed = d.call(
            "GET", "/api/v2/approvals", d.admin_key, params={"workspaceId": d.workspace_id}
        ).json()["data"]
        assert [a["status"] for a in listed] == ["expired"]
        expiries = [e for e in audit(d, action="approval.expire")]
        assert [e["detail"]["approvalId"] for e in expiries] == [pending["approvalId"]]
        assert d.store().list_runs(iid) == []


# --- budgets ----------------------------------------------------------------------------------


def test_a_spent_budget_refuses_before_asking_for_approval(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    with in_process(toolchain_dir) as d:
        iid = d.ship(gov_app(tmp_path))["installId"]
        d.call("PUT", f"/api/v2/apps/installs/{iid}/budget", d.admin_key, json={"monthlyMs": 0})
        envelope(d.run(iid, "send", {"to": "x"}, surface="chat"), 403, "budget_exhausted")
        assert d.store().list_approvals(d.workspace_id) == []


def test_budget_values_out_of_range_are_400(gov: tuple[InProcess, dict[str, Any]]) -> None:
    d, install = gov
    path = f"/api/v2/apps/installs/{install['installId']}/budget"
    for bad in (-1, 2**60, 16739500013015972260580318773248, "1000", 1.5):
        envelope(d.call("PUT", path, d.admin_key, json={"monthlyMs": bad}), 400, "INVALID_BODY")


# --- one daemon per data dir ------------------------------------------------------------------


def test_one_daemon_per_data_dir(gov: tuple[InProcess, dict[str, Any]]) -> None:
    d, _ = gov
    second = subprocess.run(
        [RUNNERD, "serve", "--port", "1"], env=d.env, capture_output=True, text=True, timeout=60
    )
    assert second.returncode != 0
    assert f"another daemon is serving {d.data_dir}" in second.stderr
