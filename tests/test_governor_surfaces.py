"""One governor for every surface: the same refusal, over the JSON API and over MCP (the
official MCP SDK's client), leaves the same audit entry, the surface aside; and the
CLI's local `tool test` refuses the secrets the daemon refuses, for the same reason.

No run starts here (every call is refused before its sandbox would), and the daemon
keeps no warm jail: nothing spawns nsjail."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import AppDir, run_cli, tool_doc
from daemon import Daemon, envelope

DAEMON_SETTINGS = {"warm_jails": "0"}

AMOUNT = {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}
QUOTE = "def run(i):\n    return {'quoted': i['amount']}\n"
# What each refusal is, as the API and MCP name it (details.code), and who meets it.
REFUSALS = {
    "a role too low": ("INSUFFICIENT_WORKSPACE_ROLE", "viewer", "desk", {"amount": 1}),
    "a bad input": ("INVALID_INPUT", "member", "desk", {"amount": "ten"}),
    "a budget spent": ("budget_exhausted", "member", "spent", {"amount": 1}),
}
# The audit entry's fields a refusal sets, apart from the surface (and its id, seq, time).
ENTRY_FIELDS = ("action", "workspaceId", "actorUserId", "actorKeyId", "installId", "versionId",
                "tool", "reason")  # fmt: skip


def _app(root: Path, slug: str) -> Path:
    app = AppDir(root)
    app.write("agentserve.app.yaml", f"slug: {slug}\nname: {slug.title()}\ntools: ./tools/*\n")
    app.tool("quote", yaml=tool_doc("quote", input=AMOUNT), source=QUOTE)
    return app.root


@pytest.fixture(scope="module")
def installs(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two installs of a one-tool app: ``desk``, and ``spent``, whose month is spent."""
    found = {
        slug: daemon.ship(_app(tmp_path_factory.mktemp(slug), slug))["installId"]
        for slug in ("desk", "spent")
    }
    budget = daemon.call(
        "PUT", f"/api/v2/apps/installs/{found['spent']}/budget", daemon.admin_key,
        json={"monthlyMs": 0},
    )  # fmt: skip
    assert budget.status_code == 200, budget.text
    return found


@pytest.fixture(scope="module")
def keys(daemon: Daemon) -> dict[str, str]:
    """A personal key of a viewer and of a member of the workspace."""
    return {role: daemon.person(f"{role}@example.com", role=role) for role in ("viewer", "member")}


def _refusals(daemon: Daemon, after_seq: int) -> list[dict[str, Any]]:
    found = daemon.call(
        "GET",
        "/api/v2/audit",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id, "action": "tool.refuse", "limit": 1000},
    )
    return [e for e in found.json()["data"] if e["seq"] > after_seq]


def _last_seq(daemon: Daemon) -> int:
    found = daemon.call(
        "GET",
        "/api/v2/audit",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id, "limit": 1000},
    ).json()["data"]
    return max((e["seq"] for e in found), default=0)


def _over_mcp(daemon: Daemon, key: str, tool: str, arguments: dict[str, Any]) -> Any:
    async def work() -> Any:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
        url = f"{daemon.url}/mcp?workspaceId={daemon.workspace_id}"
        async with Client(streamable_http_client(url, http_client=http)) as client:
            return await client.call_tool(tool, arguments)

    return asyncio.run(work())


@pytest.mark.parametrize("refusal", REFUSALS)
def test_the_same_refusal_over_the_api_and_mcp_leaves_the_same_audit_entry(
    daemon: Daemon, installs: dict[str, str], keys: dict[str, str], refusal: str
) -> None:
    reason, role, slug, value = REFUSALS[refusal]
    key = keys[role]

    before = _last_seq(daemon)
    status = 400 if reason == "INVALID_INPUT" else 403
    envelope(daemon.run(installs[slug], "quote", value, key), status, reason)
    [over_api] = _refusals(daemon, before)

    before = _last_seq(daemon)
    result = _over_mcp(daemon, key, f"{slug}__quote", value)
    assert result.is_error is True
    assert result.structured_content["error"]["reason"] == reason
    [over_mcp] = _refusals(daemon, before)

    assert {f: over_api.get(f) for f in ENTRY_FIELDS} == {f: over_mcp.get(f) for f in ENTRY_FIELDS}
    assert (over_api["reason"], over_api["installId"], over_api["tool"]) == (
        reason,
        installs[slug],
        "quote",
    )
    assert (over_api["surface"], over_mcp["surface"]) == ("api", "chat")


@pytest.mark.parametrize(
    ("secret", "reason"),
    [
        ("LD_PRELOAD=/tmp/evil.so", "INVALID_SECRET_NAME"),
        ("lower_case=value-1234", "INVALID_SECRET_NAME"),
        ("TOKEN=abc", "INVALID_SECRET_VALUE"),
    ],
)
def test_tool_test_refuses_the_secrets_the_daemon_refuses_for_the_same_reason(
    daemon: Daemon, installs: dict[str, str], tmp_path: Path, secret: str, reason: str
) -> None:
    name, _, value = secret.partition("=")
    answer = daemon.call(
        "PUT",
        f"/api/v2/apps/installs/{installs['desk']}/secrets/{name}",
        daemon.admin_key,
        json={"value": value},
    )
    said = envelope(answer, 400, reason)["message"]

    tool = tmp_path / "quote.tool.yaml"
    tool.write_text(tool_doc("quote", input=AMOUNT))
    (tmp_path / "quote.py").write_text(QUOTE)
    proc = run_cli("tool", "test", str(tool), "--input", '{"amount": 1}', "--secret", secret)
    assert proc.returncode != 0
    assert f"--secret {name}: refused ({reason}): {said}" in proc.stderr
    assert value not in proc.stderr  # a secret's value is never repeated back
    assert proc.stdout == ""  # nothing ran
