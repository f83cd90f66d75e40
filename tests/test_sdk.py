"""The app SDKs against a live daemon: Python (runnerd.sdk, sync and async) here, and the
JS package's own node:test suite (clients/js/test), run with this module's daemon."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import AppDir, tool_doc
from daemon import Daemon
from redirect_lab import redirect_lab
from runnerd.run.runtimes import find_node
from runnerd.sdk import AppBridgeError, AppClient, AsyncAppClient
from test_sdk_redirects import CALLS, refused_redirect, sdk_call

pytestmark = pytest.mark.jail
# The tests on the module's daemon run on both stores.
BACKENDS = ("sqlite", "postgresql")

REPO = Path(__file__).resolve().parent.parent
JS_SDK = REPO / "clients" / "js"
TOOLS = {
    "echo": "def run(i):\n    return {'echo': i}\n",
    "boom": "def run(i):\n    raise ValueError('the ledger is closed')\n",
    "slow": "import time\ndef run(i):\n    time.sleep(5)\n    return {}\n",
}
INPUT = {
    "type": "object",
    "properties": {"n": {"type": "integer", "maximum": 10}},
    "additionalProperties": True,
}


def _app(root: Path, slug: str) -> Path:
    app = AppDir(root)
    app.write("agentserve.app.yaml", f"slug: {slug}\nname: {slug}\ntools: ./tools/*\n")
    for name, source in TOOLS.items():
        doc = tool_doc(name, input=INPUT, timeoutMs=1000 if name == "slow" else 10000)
        app.tool(name, yaml=doc, source=source)
    return root


@pytest.fixture(scope="module")
def world(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two apps: ``sdk-demo``, and ``sdk-broke`` whose budget is spent."""
    demo = daemon.ship(_app(tmp_path_factory.mktemp("demo"), "sdk-demo"))
    broke = daemon.ship(_app(tmp_path_factory.mktemp("broke"), "sdk-broke"))
    spent = daemon.call(
        "PUT", f"/api/v2/apps/installs/{broke['installId']}/budget", daemon.admin_key,
        json={"monthlyMs": 0},
    )  # fmt: skip
    assert spent.status_code == 200, spent.text
    return {
        "url": daemon.url,
        "workspaceId": daemon.workspace_id,
        "apiKey": daemon.admin_key,
        "viewerKey": daemon.person("sdk-viewer@example.com", role="viewer"),
        "workspaceKey": daemon.key(kind="workspace", workspace_id=daemon.workspace_id),
        "installId": demo["installId"],
    }


def _client(world: dict[str, Any], **kw: Any) -> AppClient:
    return AppClient(world["url"], kw.pop("api_key", world["apiKey"]), world["workspaceId"],
                     app=kw.pop("app", "sdk-demo"), **kw)  # fmt: skip


@pytest.mark.smoke
def test_a_run_that_started_resolves_whatever_its_status(world: dict[str, Any]) -> None:
    client = _client(world)
    ok = client.run_tool("echo", {"n": 3})
    assert ok.status == "succeeded" and ok.output == {"echo": {"n": 3}} and ok.run_id
    assert ok.duration_ms is not None and ok.duration_ms > 0
    failed = client.run_tool("boom", {})
    assert failed.status == "failed" and "the ledger is closed" in (failed.error or "")
    slow = client.run_tool("sdk-demo/slow", {})  # a full reference works too
    assert slow.status == "timed_out" and slow.output is None


@pytest.mark.parametrize(
    ("call", "envelope_code", "reason", "status"),
    [
        (lambda w: _client(w).run_tool("echo", {"n": 11}), "BAD_REQUEST", "INVALID_INPUT", 400),
        (lambda w: _client(w, app="sdk-broke").run_tool("echo", {}), "FORBIDDEN",
         "budget_exhausted", 403),
        (lambda w: _client(w, api_key=w["viewerKey"]).run_tool("echo", {}), "FORBIDDEN",
         "INSUFFICIENT_WORKSPACE_ROLE", 403),
        (lambda w: _client(w, api_key=w["workspaceKey"]).run_tool("echo", {}), "FORBIDDEN",
         "WORKSPACE_KEY_NOT_ALLOWED", 403),
        (lambda w: _client(w).run_tool("nope", {}), "NOT_FOUND", "TOOL_NOT_FOUND", 404),
        (lambda w: _client(w, api_key="rk_p_wrong").run_tool("echo", {}), "UNAUTHORIZED",
         "UNAUTHORIZED", 401),
    ],
)  # fmt: skip
def test_every_refusal_raises_with_its_reason(
    world: dict[str, Any], call: Any, envelope_code: str, reason: str, status: int
) -> None:
    with pytest.raises(AppBridgeError) as caught:
        call(world)
    found = caught.value
    assert (found.reason, found.code, found.envelope_code, found.status) == (
        reason, reason, envelope_code, status,
    )  # fmt: skip
    assert found.message and reason in repr(found)


def test_a_spent_budget_an_invalid_input_and_an_unknown_tool_match_on_code(
    world: dict[str, Any],
) -> None:
    """What a user writes (docs/SDK.md, Errors): ``exc.code == "budget_exhausted"``, the
    seed's word, matches; so does ``exc.reason``."""
    calls: dict[str, tuple[str, str, Any]] = {
        "spent": ("sdk-broke", "echo", {}),
        "invalid": ("sdk-demo", "echo", {"n": 11}),
        "unknown": ("sdk-demo", "nope", {}),
    }
    caught: dict[str, AppBridgeError] = {}
    for name, (app, tool, value) in calls.items():
        try:
            _client(world, app=app).run_tool(tool, value)
        except AppBridgeError as exc:
            caught[name] = exc
    assert caught["spent"].code == "budget_exhausted" == caught["spent"].reason
    assert isinstance(caught["spent"].details["resetsAt"], str)
    assert (
        caught["invalid"].code == "INVALID_INPUT" and caught["invalid"].details["pointer"] == "/n"
    )
    assert caught["unknown"].code == "TOOL_NOT_FOUND"


def test_an_idempotent_retry_returns_the_first_run(world: dict[str, Any]) -> None:
    client = _client(world)
    first = client.run_tool("echo", {"n": 1}, idempotency_key="sdk-key-1")
    again = client.run_tool("echo", {"n": 1}, idempotency_key="sdk-key-1")
    assert again.run_id == first.run_id
    with pytest.raises(AppBridgeError) as caught:
        client.run_tool("echo", {"n": 2}, idempotency_key="sdk-key-1")
    assert caught.value.status == 409 or caught.value.reason.startswith("IDEMPOTENCY")


def test_list_tools_gives_the_apps_tools_with_schemas(world: dict[str, Any]) -> None:
    tools = {t.name: t for t in _client(world).list_tools()}
    assert set(tools) == set(TOOLS)
    assert tools["echo"].reference == "sdk-demo/echo"
    assert tools["echo"].input_schema["properties"]["n"]["maximum"] == 10
    everything = AppClient(world["url"], world["apiKey"], world["workspaceId"]).list_tools()
    assert {"sdk-demo", "sdk-broke"} <= {t.app_slug for t in everything}


def test_rate_limits_raise_with_retry_after_and_opt_in_retries_wait(
    daemon: Daemon, world: dict[str, Any]
) -> None:
    key = daemon.person("sdk-burst@example.com", role="member")
    client = _client(world, api_key=key)
    with pytest.raises(AppBridgeError) as caught:
        for _ in range(200):
            client.list_tools()
    assert caught.value.code == "RATE_LIMITED" and caught.value.status == 429
    assert caught.value.envelope_code == "RATE_LIMITED"
    assert caught.value.retry_after is not None and caught.value.retry_after >= 1
    patient = _client(world, api_key=key, retries=3)
    assert patient.run_tool("echo", {"n": 4}).status == "succeeded"


def test_one_client_keeps_one_connection_for_all_its_calls(
    daemon: Daemon, world: dict[str, Any]
) -> None:
    # The daemon's access log names each request's peer: one port for every call made
    # through one client, runs and tool lists alike.
    with _client(world) as client:
        for n in range(3):
            assert client.run_tool("echo", {"n": n}).status == "succeeded"
            assert client.list_tools()
    log = (daemon.data_dir / "serve.log").read_text()
    lines = [x for x in log.splitlines() if "sdk-demo/echo/run" in x or "/apps/tools?" in x]
    peers = {re.search(r"127\.0\.0\.1:(\d+) - ", x).group(1) for x in lines[-6:]}  # type: ignore[union-attr]
    assert len(lines) >= 6 and len(peers) == 1, lines[-6:]


def test_the_async_client_does_the_same(world: dict[str, Any]) -> None:
    async def calls() -> tuple[Any, ...]:
        client = AsyncAppClient(world["url"], world["apiKey"], world["workspaceId"], app="sdk-demo")
        ran, tools = await asyncio.gather(client.run_tool("echo", {"n": 5}), client.list_tools())
        with pytest.raises(AppBridgeError) as caught:
            await client.run_tool("echo", {"n": 50})
        return ran, tools, caught.value

    ran, tools, refused = asyncio.run(calls())
    assert (
        ran.output == {"echo": {"n": 5}} and len(tools) == 3 and refused.reason == "INVALID_INPUT"
    )


def test_the_async_client_is_an_async_context_manager_with_one_connection(
    daemon: Daemon, world: dict[str, Any]
) -> None:
    """``async with AsyncAppClient(...)``: the calls in the block share one connection
    (one peer port in the daemon's access log); after it, the client still calls, on a
    connection of the call's own."""

    async def calls() -> tuple[list[str], Any]:
        client = AsyncAppClient(world["url"], world["apiKey"], world["workspaceId"], app="sdk-demo")
        async with client as same:
            assert same is client
            statuses = [(await client.run_tool("echo", {"n": n})).status for n in range(3)]
            assert len(await client.list_tools()) == 3
            with pytest.raises(AppBridgeError) as caught:
                await client.run_tool("nope", {})
            assert caught.value.code == "TOOL_NOT_FOUND"
        return statuses, await client.run_tool("echo", {"n": 9})

    statuses, after = asyncio.run(calls())
    assert statuses == ["succeeded"] * 3 and after.output == {"echo": {"n": 9}}
    log = (daemon.data_dir / "serve.log").read_text()
    lines = [x for x in log.splitlines() if "/api/v2/apps/tools" in x]
    peers = [re.search(r"127\.0\.0\.1:(\d+) - ", x).group(1) for x in lines[-6:]]  # type: ignore[union-attr]
    assert len(set(peers[:5])) == 1 and peers[5] != peers[0], lines[-6:]


def test_the_sync_client_closes_at_the_end_of_its_with_block(world: dict[str, Any]) -> None:
    with _client(world) as client:
        assert client.run_tool("echo", {"n": 1}).status == "succeeded"
    with pytest.raises(RuntimeError, match="closed"):
        client.run_tool("echo", {"n": 1})


# --- redirects that end at the daemon: the key and the input are kept ------------------


@pytest.mark.parametrize("call", CALLS)
def test_a_same_origin_redirect_keeps_the_key_and_the_input(
    world: dict[str, Any], call: str
) -> None:
    """307 and 308 for a run (the method and body kept), any redirect for a tool list; a
    host spelled in another case is the same origin."""
    statuses = (307, 308) if "run" in call else (301, 302, 303, 307, 308)
    args = {"key": world["apiKey"], "ws": world["workspaceId"], "app": "sdk-demo"}
    with redirect_lab(upstream=world["url"]) as lab:
        for status in statuses:
            lab.route = lambda path, status=status: (  # type: ignore[misc]
                status,
                f"http://LocalHost:{lab.port}/via{path}",
            )
            found = sdk_call(call, f"http://localhost:{lab.port}", **args)
            if "run" in call:
                assert found.status == "succeeded" and found.output == {"echo": {"n": 3}}, found
            else:
                assert {t.name for t in found} == set(TOOLS), found
            _, path, headers, body = lab.seen[-1]
            assert path.startswith("/via/api/v2/apps/tools") and "workspaceId=" in path
            assert headers["x-api-key"] == world["apiKey"]
            assert (json.loads(body)["input"] == {"n": 3}) if "run" in call else not body


def test_redirects_are_followed_at_most_five_hops(world: dict[str, Any]) -> None:
    def chain(hops: int) -> Any:
        def route(path: str) -> tuple[int, str]:
            found = re.match(r"/hop(\d+)(/.*)", path)
            done, rest = (int(found[1]), found[2]) if found else (0, path)
            return (307, f"/hop{done + 1}{rest}" if done + 1 < hops else f"/via{rest}")

        return route

    args = {"key": world["apiKey"], "ws": world["workspaceId"], "app": "sdk-demo"}
    with redirect_lab(upstream=world["url"]) as lab:
        lab.route = chain(5)
        assert sdk_call("run_tool", lab.url, **args).status == "succeeded"
        assert lab.connections == 6  # the call and its five hops
        lab.route = chain(6)
        for call in CALLS:
            found = refused_redirect(sdk_call(call, lab.url, **args), "TOO_MANY_REDIRECTS", 307)
            assert found.details["hops"] == 5
        assert lab.connections == 6 + 6 * len(CALLS)
        assert not any(path.startswith("/via") for _, path, *_ in lab.seen[6:])


@pytest.mark.smoke
def test_the_js_sdk_suite(world: dict[str, Any]) -> None:
    node = find_node()  # the Node runnerd uses: the system's, or runnerd[node]'s
    assert node, "the JS SDK tests need Node.js >= 20"
    done = subprocess.run(
        [
            node.path,
            "--test",
            "--test-reporter=spec",
            *sorted(str(path) for path in (JS_SDK / "test").glob("*.test.mjs")),
        ],
        env={**os.environ, "RUNNERD_SDK_TEST": json.dumps(world)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "# fail 0" in done.stdout or "fail 0" in done.stdout, done.stdout
