"""One governor for every surface: the same refusal, over the JSON API, over MCP (the
official MCP SDK's client) and from the Manage page's test-run form (a session), leaves
the same audit entry, the surface aside, and is counted the same; an expired approval is
refused as expired on both; and the CLI's local `tool test` refuses the secrets the daemon
refuses, for the same reason.

No run starts here (every call is refused before its sandbox would), and the daemon
keeps no warm jail: nothing spawns nsjail."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from conftest import AppDir, run_cli, tool_doc
from daemon import Daemon, envelope

TTL_S = 1  # an approval's time: a held call expires while the test waits
DAEMON_SETTINGS = {"warm_jails": "0", "approval_ttl_s": str(TTL_S)}

AMOUNT = {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}
QUOTE = "def run(i):\n    return {'quoted': i['amount']}\n"
BOOK = "def run(i):\n    return {'booked': i['amount']}\n"  # a write tool: never runs here
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
    app.tool("book", yaml=tool_doc("book", effect="write", input=AMOUNT), source=BOOK)
    return app.root


@pytest.fixture(scope="module")
def installs(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two installs of an app (``quote``, and ``book``, a write tool): ``desk``, and
    ``spent``, whose month is spent."""
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


def _over_mcp(daemon: Daemon, key: str, tool: str, arguments: dict[str, Any], **kw: Any) -> Any:
    """The result of one ``tools/call``, or the MCP error it raised; ``kw`` for Client."""

    async def work() -> Any:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
        url = f"{daemon.url}/mcp?workspaceId={daemon.workspace_id}"
        async with Client(streamable_http_client(url, http_client=http), **kw) as client:
            try:
                return await client.call_tool(tool, arguments)
            except MCPError as exc:
                return exc

    return asyncio.run(work())


def _counted(daemon: Daemon, reason: str) -> float:
    """``runnerd_refusals_total`` of ``reason``, as an admin scrapes it."""
    text = httpx.get(
        f"{daemon.url}/metrics", headers={"Authorization": f"Bearer {daemon.admin_key}"}
    ).text
    found = re.search(rf'^runnerd_refusals_total\{{reason="{reason}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


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
    assert result.structured_content is None
    assert result.meta["runnerd/error"]["reason"] == reason
    [over_mcp] = _refusals(daemon, before)

    assert {f: over_api.get(f) for f in ENTRY_FIELDS} == {f: over_mcp.get(f) for f in ENTRY_FIELDS}
    assert (over_api["reason"], over_api["installId"], over_api["tool"]) == (
        reason,
        installs[slug],
        "quote",
    )
    assert (over_api["surface"], over_mcp["surface"]) == ("api", "chat")


def test_an_unknown_tool_is_an_mcp_error_audited_and_counted_as_over_the_api(
    daemon: Daemon, installs: dict[str, str], keys: dict[str, str]
) -> None:
    key = keys["member"]
    counted = _counted(daemon, "TOOL_NOT_FOUND")

    before = _last_seq(daemon)
    envelope(daemon.run(installs["desk"], "nope", {"amount": 1}, key), 404, "TOOL_NOT_FOUND")
    [over_api] = _refusals(daemon, before)
    assert _counted(daemon, "TOOL_NOT_FOUND") == counted + 1

    before = _last_seq(daemon)
    unknown = _over_mcp(daemon, key, "desk__nope", {"amount": 1})
    assert isinstance(unknown, MCPError)  # a protocol error, as before: not a result
    assert unknown.error.code == types.INVALID_PARAMS
    assert unknown.error.message == "no tool 'desk__nope' in this workspace"
    [over_mcp] = _refusals(daemon, before)
    assert _counted(daemon, "TOOL_NOT_FOUND") == counted + 2

    assert {f: over_api.get(f) for f in ENTRY_FIELDS} == {f: over_mcp.get(f) for f in ENTRY_FIELDS}
    assert (over_api["reason"], over_api["tool"]) == ("TOOL_NOT_FOUND", "nope")
    assert (over_api["surface"], over_mcp["surface"]) == ("api", "chat")


def test_a_refusal_over_mcp_is_counted_as_over_the_api(
    daemon: Daemon, installs: dict[str, str], keys: dict[str, str]
) -> None:
    counted = _counted(daemon, "INVALID_INPUT")
    bad = {"amount": "ten"}
    envelope(daemon.run(installs["desk"], "quote", bad, keys["member"]), 400, "INVALID_INPUT")
    assert _counted(daemon, "INVALID_INPUT") == counted + 1
    refused = _over_mcp(daemon, keys["member"], "desk__quote", bad)
    assert refused.is_error and refused.meta["runnerd/error"]["reason"] == "INVALID_INPUT"
    assert _counted(daemon, "INVALID_INPUT") == counted + 2


def test_an_expired_approval_confirmed_over_mcp_is_refused_as_expired_as_over_the_api(
    daemon: Daemon, installs: dict[str, str], keys: dict[str, str]
) -> None:
    """A held write call whose approval expired before its decision: approved over the
    API, and confirmed over MCP (2026-07-28: the confirmation comes back in the retry,
    after the approval's time), the same refusal, expired, and nothing runs."""
    key = keys["member"]
    before = _last_seq(daemon)
    held = daemon.run(installs["desk"], "book", {"amount": 2}, key, surface="chat")
    assert held.status_code == 202, held.text
    time.sleep(TTL_S + 0.3)
    approve = f"/api/v2/approvals/{held.json()['approvalId']}/approve"
    over_api = envelope(daemon.call("POST", approve, key), 409, "APPROVAL_NOT_PENDING")
    assert over_api["message"] == "the approval is expired"

    async def confirm_late(ctx: Any, params: Any) -> types.ElicitResult:
        await asyncio.sleep(TTL_S + 0.3)
        return types.ElicitResult(action="accept", content={"confirm": True})

    result = _over_mcp(daemon, key, "desk__book", {"amount": 3}, elicitation_callback=confirm_late)
    assert result.is_error is True, result
    error = result.meta["runnerd/error"]
    assert (error["reason"], error["status"], error["message"]) == (
        "APPROVAL_NOT_PENDING",
        409,
        over_api["message"],
    )
    runs = daemon.call(
        "GET", f"/api/v2/apps/installs/{installs['desk']}/runs", daemon.admin_key,
        params={"tool": "book"},
    )  # fmt: skip
    assert runs.json()["data"] == []
    # Both refused decisions are in the trail, as refusals of the held call.
    refused = [e for e in _refusals(daemon, before) if e["reason"] == "APPROVAL_NOT_PENDING"]
    assert len(refused) == 2, refused
    assert {e["detail"]["approvalId"] for e in refused} >= {held.json()["approvalId"]}
    assert {(e["tool"], e["surface"], e["actorUserId"]) for e in refused} == {
        ("book", "chat", refused[0]["actorUserId"])
    }


def test_a_run_by_reference_is_refused_and_audited_as_a_run_of_the_install(
    daemon: Daemon, installs: dict[str, str], keys: dict[str, str]
) -> None:
    """A viewer's run by reference (the workflow block's call) is refused by the governor
    as a run of the install is: the same answer, the same audit entry."""
    key, value = keys["viewer"], {"amount": 1}
    before = _last_seq(daemon)
    answer = daemon.run(installs["desk"], "quote", value, key)
    by_install = envelope(answer, 403, "INSUFFICIENT_WORKSPACE_ROLE")
    [of_install] = _refusals(daemon, before)

    before = _last_seq(daemon)
    answer = daemon.call(
        "POST", "/api/v2/apps/tools/desk/quote/run", key,
        params={"workspaceId": daemon.workspace_id}, json={"input": value},
    )  # fmt: skip
    by_reference = envelope(answer, 403, "INSUFFICIENT_WORKSPACE_ROLE")
    [of_reference] = _refusals(daemon, before)

    assert by_reference == by_install
    fields = (*ENTRY_FIELDS, "surface")
    assert {f: of_install.get(f) for f in fields} == {f: of_reference.get(f) for f in fields}


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
    shown = name if name.isupper() else "#1"  # a name that is no name is not repeated
    assert f"--secret {shown}: refused ({reason}): {said}" in proc.stderr
    assert value not in proc.stderr  # a secret's value is never repeated back
    assert proc.stdout == ""  # nothing ran


def test_tool_test_never_repeats_a_secret_given_with_the_wrong_separator(
    tmp_path: Path,
) -> None:
    tool = tmp_path / "quote.tool.yaml"
    tool.write_text(tool_doc("quote", input=AMOUNT))
    (tmp_path / "quote.py").write_text(QUOTE)
    value = "Zq9xSecretValue-4711"
    for mistyped in (f"API_TOKEN:{value}", f"API_TOKEN {value}", f"API TOKEN={value}"):
        proc = run_cli("tool", "test", str(tool), "--input", '{"amount": 1}', "--secret", mistyped)
        assert proc.returncode == 2
        assert "--secret #1: refused (INVALID_SECRET_NAME)" in proc.stderr, proc.stderr
        assert value not in proc.stderr + proc.stdout


def test_tool_test_names_every_refused_secret_at_once(tmp_path: Path) -> None:
    tool = tmp_path / "quote.tool.yaml"
    tool.write_text(tool_doc("quote", input=AMOUNT))
    (tmp_path / "quote.py").write_text(QUOTE)
    proc = run_cli(
        "tool", "test", str(tool), "--input", '{"amount": 1}',
        "--secret", "LD_PRELOAD=/tmp/evil.so", "--secret", "GOOD_ONE=long-enough-value",
        "--secret", "TOKEN=abc", "--json",
    )  # fmt: skip
    assert proc.returncode == 2
    refused = [line for line in proc.stderr.splitlines() if "refused (" in line]
    assert [line.split("--secret ")[1].split(":")[0] for line in refused] == [
        "LD_PRELOAD",
        "TOKEN",
    ], proc.stderr
    assert "(INVALID_SECRET_NAME)" in refused[0] and "(INVALID_SECRET_VALUE)" in refused[1]
    assert proc.stdout == ""


@pytest.mark.parametrize("refusal", REFUSALS)
def test_the_manage_pages_test_run_is_refused_and_audited_as_over_the_api(
    daemon: Daemon, installs: dict[str, str], keys: dict[str, str], refusal: str
) -> None:
    """The page's test-run form posts to the run route with its session (cookie and CSRF
    token) and surface test, as views.js does: the same governor, the same entry."""
    reason, role, slug, value = REFUSALS[refusal]
    before = _last_seq(daemon)
    envelope(
        daemon.run(installs[slug], "quote", value, keys[role]),
        400 if reason == "INVALID_INPUT" else 403,
        reason,
    )
    [over_api] = _refusals(daemon, before)

    with httpx.Client(base_url=daemon.url) as page:
        signed_in = page.post("/api/v2/session", json={"apiKey": keys[role]})
        assert signed_in.status_code == 200, signed_in.text
        csrf = {"X-CSRF-Token": str(signed_in.json()["csrfToken"])}
        before = _last_seq(daemon)
        answer = page.post(
            f"/api/v2/apps/installs/{installs[slug]}/tools/quote/run",
            json={"input": value, "surface": "test"},
            headers=csrf,
        )
    envelope(answer, 400 if reason == "INVALID_INPUT" else 403, reason)
    [over_page] = _refusals(daemon, before)
    # A session acts for its person; the audit names the session, not the key it began with.
    same = [f for f in ENTRY_FIELDS if f != "actorKeyId"]
    assert {f: over_api.get(f) for f in same} == {f: over_page.get(f) for f in same}
    assert over_page["actorKeyId"].startswith("ses_")
    assert over_page["surface"] == "test"
