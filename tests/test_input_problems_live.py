"""Every problem of a refused input, through a live daemon: the CLI's ``tools run``
prints them all, and an MCP client's tool error carries them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import run_cli
from daemon import Daemon

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "deal-desk"
BAD = {"discountPct": 150, "marginPct": -300, "tier": "gold"}  # and two fields missing
POINTERS = {"/discountPct", "/marginPct", "/tier", "/termMonths", "/dealSize"}


@pytest.fixture(scope="module")
def shipped(daemon: Daemon) -> str:
    return str(daemon.ship(EXAMPLE)["installId"])


def test_the_cli_prints_every_problem(daemon: Daemon, shipped: str) -> None:
    env = {
        **daemon.env,
        "RUNNERD_URL": daemon.url,
        "RUNNERD_API_KEY": daemon.admin_key,
        "RUNNERD_WORKSPACE": daemon.workspace_id,
    }
    ran = run_cli("tools", "run", "deal-desk/score_offer", "--input", json.dumps(BAD), env=env)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr
    for pointer in POINTERS:
        assert pointer in ran.stderr
    assert "/dealSize is required" in ran.stderr


def test_an_mcp_tool_error_names_every_problem(daemon: Daemon, shipped: str) -> None:
    async def work() -> Any:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {daemon.admin_key}"})
        url = f"{daemon.url}/mcp?workspaceId={daemon.workspace_id}"
        async with Client(streamable_http_client(url, http_client=http)) as client:
            return await client.call_tool("deal-desk__score_offer", BAD)

    result = asyncio.run(work())
    assert result.is_error is True
    wire = json.loads(result.content[0].text)["error"]
    assert wire["reason"] == "INVALID_INPUT"
    assert {p["pointer"] for p in wire["details"]["inputProblems"]} == POINTERS
    assert wire["details"]["pointer"] in POINTERS
    for pointer in POINTERS:
        assert pointer in wire["message"]
    assert result.meta["runnerd/error"] == wire
