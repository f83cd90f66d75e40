"""Chat agents over MCP, with the official MCP Python SDK's client against a live daemon:
streamable HTTP at /mcp, and stdio through `runnerd mcp`. What runs no tool is tested in
process, in tests/test_mcp_contract.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import RUNNERD, AppDir, tool_doc
from daemon import Daemon, Runnerd, running_daemon
from test_governance import audit

pytestmark = pytest.mark.jail
# The tests on the module's daemon run on both stores.
BACKENDS = ("sqlite", "postgresql")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "deal-desk"
HANDSHAKE = "2025-11-25"  # the newest revision with an initialize handshake (and session ids)
OFFER = {
    "discountPct": 12,
    "marginPct": 30,
    "termMonths": 24,
    "dealSize": 120000,
    "tier": "enterprise",
}
TOOLS = {
    "boom": ("read", "def run(i):\n    raise RuntimeError('the crm is down')\n", 10000),
    "slow": ("read", "import time\ndef run(i):\n    time.sleep(5)\n    return {}\n", 1000),
    "post_entry": ("write", "def run(i):\n    return {'posted': i['amount']}\n", 10000),
    "file_entry": ("write", "def run(i):\n    return {'filed': i['amount']}\n", 10000),
}
AMOUNT = {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}
# file_entry's output schema: strict, so a pending answer as structuredContent breaks it.
FILED = {
    "type": "object",
    "properties": {"filed": {"type": "integer"}},
    "required": ["filed"],
    "additionalProperties": False,
}


def ship_apps(d: Runnerd, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """deal-desk and a ledger of TOOLS shipped to ``d`` (tests/test_mcp_contract.py's
    in-process app too): their install ids."""
    desk = d.ship(EXAMPLE)
    app = AppDir(tmp_path_factory.mktemp("ledger"))
    app.write("agentserve.app.yaml", "slug: ledger\nname: Ledger\ntools: ./tools/*\n")
    for name, (effect, source, timeout) in TOOLS.items():
        schema = AMOUNT if name.endswith("_entry") else {"type": "object"}
        output = FILED if name == "file_entry" else None
        doc = tool_doc(name, effect=effect, input=schema, output=output, timeoutMs=timeout)
        app.tool(name, yaml=doc, source=source)
    ledger = d.ship(app.root)
    return {"deal-desk": desk["installId"], "ledger": ledger["installId"]}


@pytest.fixture(scope="module")
def installs(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return ship_apps(daemon, tmp_path_factory)


def _client(daemon: Daemon, key: str | None = None, **kw: Any) -> Client:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key or daemon.admin_key}"})
    url = f"{daemon.url}/mcp?workspaceId={daemon.workspace_id}"
    return Client(streamable_http_client(url, http_client=http), **kw)


def _run(work: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(work())


def test_the_mcp_sdk_loads_at_the_first_mcp_request(toolchain_dir: Path) -> None:
    """An install that never speaks MCP never pays for the SDK (most of an idle daemon's
    memory): it is not in the process until a chat agent connects, then it serves."""
    with running_daemon(toolchain_dir, warm_jails="0") as fresh:
        maps = Path(f"/proc/{fresh.proc.pid}/maps")
        fresh.ship(EXAMPLE)  # a deploy tells MCP sessions the tools changed: none yet
        assert fresh.call("GET", "/healthz").status_code == 200
        assert "pydantic_core" not in maps.read_text()

        async def work() -> Any:
            async with _client(fresh) as client:
                return await client.list_tools()

        assert "deal-desk__score_offer" in {t.name for t in _run(work).tools}
        assert "pydantic_core" in maps.read_text()


@pytest.mark.smoke
def test_call_returns_structured_content_and_is_audited_as_chat(
    daemon: Daemon, installs: dict[str, str]
) -> None:
    async def work() -> Any:
        async with _client(daemon) as client:
            return await client.call_tool("deal-desk__score_offer", OFFER)

    result = _run(work)
    assert result.is_error is not True
    assert result.structured_content["decision"] == "approve"
    assert '"decision": "approve"' in result.content[0].text
    run_id = result.meta["runnerd/run"]["runId"]
    run = daemon.call("GET", f"/api/v2/runs/{run_id}", daemon.admin_key).json()["run"]
    assert run["surface"] == "chat" and run["userEmail"] == "ada@example.com"
    [entry] = [e for e in audit(daemon, action="tool.run") if e["detail"].get("runId") == run_id]
    assert entry["surface"] == "chat" and entry["actorUserId"] == run["userId"]


def test_refusals_failures_and_timeouts(daemon: Daemon, installs: dict[str, str]) -> None:
    async def work() -> tuple[Any, ...]:
        async with _client(daemon) as client:
            invalid = await client.call_tool(
                "deal-desk__score_offer", {**OFFER, "discountPct": 150}
            )
            failed = await client.call_tool("ledger__boom", {})
            slow = await client.call_tool("ledger__slow", {})
            with pytest.raises(Exception) as unknown:
                await client.call_tool("ledger__nope", {})
            return invalid, failed, slow, unknown.value

    invalid, failed, slow, unknown = _run(work)
    # No structuredContent on an error: a client would check it against the output schema.
    assert invalid.is_error is True and invalid.structured_content is None
    error = invalid.meta["runnerd/error"]
    assert error["reason"] == "INVALID_INPUT" and error["code"] and error["status"] == 400
    assert error["details"]["pointer"] == "/discountPct" and error["message"]
    assert json.loads(invalid.content[0].text) == {"error": error}
    assert failed.is_error and "the crm is down" in failed.content[0].text
    assert failed.meta["runnerd/run"]["status"] == "failed"
    assert slow.is_error and slow.meta["runnerd/run"]["status"] == "timed_out"
    assert failed.structured_content is None and slow.structured_content is None
    assert "no tool 'ledger__nope'" in str(unknown)


def test_a_write_tool_asks_and_runs_only_when_accepted(
    daemon: Daemon, installs: dict[str, str]
) -> None:
    asked: list[str] = []

    def answer(confirm: Any) -> Any:
        async def elicit(ctx: Any, params: Any) -> types.ElicitResult:
            asked.append(params.message)
            if confirm is None:
                return types.ElicitResult(action="decline")
            return types.ElicitResult(action="accept", content={"confirm": confirm})

        return elicit

    def runs() -> int:
        found = daemon.call(
            "GET",
            f"/api/v2/apps/installs/{installs['ledger']}/runs",
            daemon.admin_key,
            params={"tool": "post_entry"},
        )
        return len(found.json()["data"])

    async def call(confirm: Any, amount: int) -> Any:
        async with _client(daemon, elicitation_callback=answer(confirm)) as client:
            return await client.call_tool("ledger__post_entry", {"amount": amount})

    before = runs()
    declined = _run(lambda: call(None, 7))
    assert declined.is_error and declined.structured_content is None
    assert declined.meta["runnerd/approval"]["status"] == "declined"
    unticked = _run(lambda: call(False, 8))
    assert unticked.is_error and runs() == before  # nothing ran unasked
    # The box is a boolean: a client that sends form values as text, or a number, has
    # not ticked it.
    for sent in ("false", "true", "yes", "0", 1):
        other = _run(lambda sent=sent: call(sent, 8))
        assert other.is_error and other.meta["runnerd/approval"]["status"] == "declined", sent
    assert runs() == before
    assert (
        "ledger/post_entry" in asked[0] and '"amount": 7' in asked[0] and "write tool" in asked[0]
    )
    accepted = _run(lambda: call(True, 9))
    assert accepted.is_error is not True and accepted.structured_content == {"posted": 9}
    assert runs() == before + 1
    assert len(audit(daemon, action="approval.deny")) >= 2  # declined, and not ticked
    assert len(audit(daemon, action="approval.approve")) >= 1


def test_a_client_without_elicitation_gets_a_pending_approval(
    daemon: Daemon, installs: dict[str, str]
) -> None:
    async def ask() -> Any:
        async with _client(daemon) as client:  # no elicitation callback: not declared
            return await client.call_tool("ledger__post_entry", {"amount": 3})

    pending = _run(ask)
    assert pending.is_error is True and pending.structured_content is None
    assert pending.meta["runnerd/approval"]["status"] == "pending_approval"
    approval_id = pending.meta["runnerd/approval"]["approvalId"]
    approved = daemon.call("POST", f"/api/v2/approvals/{approval_id}/approve", daemon.admin_key)
    assert approved.status_code == 200, approved.text

    async def outcome() -> Any:
        async with _client(daemon) as client:
            return await client.call_tool("runnerd.approval", {"approvalId": approval_id})

    found = _run(outcome).structured_content
    assert found["status"] == "approved" and found["run"]["status"] == "succeeded"
    assert found["run"]["output"] == {"posted": 3}


def _approval_status(daemon: Daemon, approval_id: str) -> str:
    found = daemon.call(
        "GET", "/api/v2/approvals", daemon.admin_key, params={"workspaceId": daemon.workspace_id}
    )
    [approval] = [a for a in found.json()["data"] if a["approvalId"] == approval_id]
    return str(approval["status"])


def test_a_write_tool_asks_every_era_in_the_form_it_reads(
    daemon: Daemon, installs: dict[str, str]
) -> None:
    """2025-11-25 has no InputRequiredResult (the SDK rejects it: -32603), so there the
    person is asked with an elicitation/create request during the call; 2026-07-28 gets
    the InputRequiredResult. Accepted, a strict-schema tool's result is its output; any
    other answer, an error from the client included, denies the approval at once."""
    asked: list[str] = []
    key = daemon.person("mcp-eras@example.com")  # its own rate limit: many sessions here

    def answer(reply: Any) -> Any:
        async def elicit(ctx: Any, params: Any) -> Any:
            asked.append(params.message)
            return reply

        return elicit

    async def call(mode: str, reply: Any, tool: str, amount: int) -> tuple[str, Any]:
        async with _client(daemon, key, mode=mode, elicitation_callback=answer(reply)) as client:
            result = await client.call_tool(f"ledger__{tool}", {"amount": amount})
            return client.protocol_version, result

    tick = types.ElicitResult(action="accept", content={"confirm": True})
    for mode, amount in (("legacy", 51), ("auto", 52)):
        version, ran = _run(lambda m=mode, n=amount: call(m, tick, "file_entry", n))
        assert version == (HANDSHAKE if mode == "legacy" else "2026-07-28")
        assert ran.is_error is not True and ran.structured_content == {"filed": amount}
        assert f'"amount": {amount}' in asked[-1] and "write tool" in asked[-1]

    refusals = (
        types.ElicitResult(action="decline"),
        types.ElicitResult(action="accept", content={"confirm": False}),
        types.ErrorData(code=types.INTERNAL_ERROR, message="this client shows no forms"),
    )

    def runs() -> int:
        found = daemon.call(
            "GET",
            f"/api/v2/apps/installs/{installs['ledger']}/runs",
            daemon.admin_key,
            params={"tool": "post_entry"},
        )
        return len(found.json()["data"])

    before = runs()
    for reply in refusals:
        _, refused = _run(lambda reply=reply: call("legacy", reply, "post_entry", 53))
        assert refused.is_error and refused.structured_content is None
        held = refused.meta["runnerd/approval"]
        assert held["status"] == "declined" and held["approvalId"] in refused.content[0].text
        # Decided now: no approval is left pending that the client could never act on.
        assert _approval_status(daemon, held["approvalId"]) == "denied"
    assert runs() == before


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_pending_answer_keeps_to_the_tools_output_schema(
    daemon: Daemon, installs: dict[str, str], mode: str
) -> None:
    """A client that cannot elicit, and a tool whose output schema requires fields, in
    2025-11-25 and 2026-07-28: the pending answer is isError without structuredContent
    (the SDK client does not raise), its text naming the approval id, its expiry and the
    Manage page's URL where a person decides it; the same in _meta."""
    key = daemon.person(f"mcp-pending-{mode}@example.com")

    async def ask() -> Any:
        async with _client(daemon, key, mode=mode) as client:  # no elicitation declared
            return await client.call_tool("ledger__file_entry", {"amount": 61})

    pending = _run(ask)  # the old answer: RuntimeError("Invalid structured content …")
    assert pending.is_error is True and pending.structured_content is None
    held = pending.meta["runnerd/approval"]
    assert held["status"] == "pending_approval" and held["expiresAt"]
    assert held["url"] == f"{daemon.url}/#/approvals"
    approval_id = held["approvalId"]
    text = pending.content[0].text
    assert "waits for approval" in text and approval_id in text and held["expiresAt"] in text
    assert held["url"] in text and "runnerd.approval" in text
    assert _approval_status(daemon, approval_id) == "pending"
    approved = daemon.call("POST", f"/api/v2/approvals/{approval_id}/approve", key)
    assert approved.status_code == 200, approved.text

    async def outcome() -> Any:
        async with _client(daemon, key, mode=mode) as client:
            return await client.call_tool("runnerd.approval", {"approvalId": approval_id})

    found = _run(outcome).structured_content
    assert found["status"] == "approved" and found["run"]["output"] == {"filed": 61}


def test_the_stdio_bridge(daemon: Daemon, installs: dict[str, str]) -> None:
    server = StdioServerParameters(
        command=RUNNERD,
        args=["mcp", "--url", daemon.url, "--workspace", daemon.workspace_id],
        env={"RUNNERD_API_KEY": daemon.admin_key, "PATH": "/usr/bin:/bin"},
    )

    async def confirm(ctx: Any, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"confirm": True})

    async def work() -> tuple[Any, ...]:
        async with Client(server, elicitation_callback=confirm) as client:
            tools = await client.list_tools()
            scored = await client.call_tool("deal-desk__score_offer", OFFER)
            posted = await client.call_tool("ledger__post_entry", {"amount": 11})
            return tools, scored, posted

    tools, scored, posted = _run(work)
    assert "deal-desk__score_offer" in {t.name for t in tools.tools}
    assert scored.structured_content["decision"] == "approve"
    assert posted.structured_content == {"posted": 11}


# --- sessions follow their key and their person (more in tests/test_mcp_contract.py) --------


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_sdk_client_works_in_each_era(
    daemon: Daemon, installs: dict[str, str], mode: str
) -> None:
    """The binding lets through the client that opened a session (the handshake era)
    and a client that sends no session id at all (2026-07-28)."""

    async def work() -> Any:
        async with _client(daemon, mode=mode) as client:
            tools = await client.list_tools()
            scored = await client.call_tool("deal-desk__score_offer", OFFER)
            return client.protocol_version, tools, scored

    version, tools, scored = _run(work)
    assert version == (HANDSHAKE if mode == "legacy" else "2026-07-28")
    assert "deal-desk__score_offer" in {t.name for t in tools.tools}
    assert scored.structured_content["decision"] == "approve"


def test_an_approved_calls_output_is_only_for_whom_it_belongs(
    daemon: Daemon, installs: dict[str, str]
) -> None:
    """runnerd.approval applies GET /runs/{id}'s rule: the asker, the approver who
    released it and an admin see the output; another member and a viewer the status."""
    asker = daemon.person("mcp-asker@example.com")
    member = daemon.person("mcp-colleague@example.com")
    viewer = daemon.person("mcp-viewer@example.com", role="viewer")

    async def ask() -> Any:
        async with _client(daemon, asker) as client:  # no elicitation: the call is held
            return await client.call_tool("ledger__post_entry", {"amount": 42})

    held = _run(ask).meta["runnerd/approval"]
    assert held["status"] == "pending_approval"
    approval_id = held["approvalId"]
    approved = daemon.call("POST", f"/api/v2/approvals/{approval_id}/approve", asker)
    assert approved.status_code == 200, approved.text

    def read(key: str) -> Any:
        async def work() -> Any:
            async with _client(daemon, key) as client:
                return await client.call_tool("runnerd.approval", {"approvalId": approval_id})

        return _run(work)

    for key in (asker, daemon.admin_key):
        found = read(key).structured_content
        assert found["run"]["output"] == {"posted": 42} and found["run"]["outputAvailable"]
    for key in (member, viewer):
        result = read(key)
        found = result.structured_content
        assert found["status"] == "approved" and found["run"]["status"] == "succeeded"
        assert found["run"]["output"] is None and found["run"]["error"] is None
        assert found["run"]["outputAvailable"] is False
        assert '"posted"' not in result.content[0].text
        # GET /api/v2/runs/{id} says the same to them: the status, not the output.
        detail = daemon.call("GET", f"/api/v2/runs/{found['run']['runId']}", key)
        assert detail.status_code == 200, detail.text
        assert detail.json()["run"]["status"] == "succeeded" and detail.json()["output"] is None
