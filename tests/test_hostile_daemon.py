"""Hostile bundles, schemas, JSON and callers against the daemon *around* the jail.

Every attack goes through the real interface: a live ``runnerd serve`` over HTTP, or the
``runnerd`` command. Each one must be refused or fail cleanly (never a 500, never a
traceback, never a file's contents echoed), and the event loop must keep answering: a
/healthz probe from a process of its own runs through every attack on the daemon and
its slowest answer must stay under 50 ms. docs/SECURITY.md has the table of the limits
these tests prove.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import AppDir, run_cli, tool_doc
from daemon import Daemon, HealthProbe, envelope

pytestmark = pytest.mark.jail

# The slowest /healthz answer allowed while an attack is under way.
HEALTH_MS = 50.0
BUDGET_MS = 500  # the daemon's check budget in this module (settings: check_budget_ms)


DAEMON_SETTINGS = {"check_budget_ms": str(BUDGET_MS)}


@pytest.fixture
def app(make_app: Callable[..., AppDir]) -> Callable[..., AppDir]:
    """An app folder with a manifest of its own slug."""
    count = 0

    def make(slug: str | None = None) -> AppDir:
        nonlocal count
        count += 1
        name = slug or f"hostile-{os.getpid()}-{time.monotonic_ns() % 10**9}-{count}"
        return make_app(f"slug: {name}\nname: Hostile\ntools: ./tools/*\n")

    return make


def ship_tool(daemon: Daemon, app: AppDir, name: str, source: str, **doc: Any) -> str:
    """Deploy, publish and install an app with one Python tool; its install id."""
    app.write(f"tools/{name}.tool.yaml", tool_doc(name, **doc))
    app.write(f"tools/{name}.py", source)
    return str(daemon.ship(app.root)["installId"])


def deploy_files(daemon: Daemon, files: dict[str, bytes]) -> httpx.Response:
    return daemon.call(
        "POST",
        "/api/v2/apps/deploy",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id},
        json={"files": {p: base64.b64encode(d).decode() for p, d in files.items()}},
    )


def problems(response: httpx.Response) -> list[str]:
    error = envelope(response, 400, "BUNDLE_REJECTED")
    return [
        f"{p['file']}:{p.get('line', '')}: {p['message']}" for p in error["details"]["problems"]
    ]


Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(daemon: Daemon) -> Cli:
    """``runnerd ARGS`` with the daemon's data dir, toolchain and uids, and its URL, admin
    key and workspace for the client commands."""
    return lambda *args, env=None: run_cli(*args, env={**daemon.client_env(), **(env or {})})


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr


@pytest.fixture
def healthy(daemon: Daemon) -> Iterator[HealthProbe]:
    """A /healthz probe through the test; its slowest answer must stay under HEALTH_MS."""
    with HealthProbe(daemon) as probe:
        yield probe
    assert probe.probes > 0
    assert probe.worst_ms < HEALTH_MS, f"/healthz took {probe.worst_ms:.1f} ms during the attack"


# --- 1. validation never freezes the event loop ------------------------------------------------

EVIL = r"^(a+)+$"  # exponential on Python's backtracking re; linear on RE2


def test_catastrophic_input_pattern_is_answered_at_once(
    daemon: Daemon, app: Callable[..., AppDir], healthy: HealthProbe
) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": EVIL}}}
    install = ship_tool(daemon, app(), "evil_in", "def run(i):\n    return {}\n", input=schema)
    for _ in range(3):
        response = daemon.run(install, "evil_in", {"s": "a" * 5000 + "!"})
        error = envelope(response, 400, "INVALID_INPUT")
        assert error["details"]["pointer"] == "/s" and "pattern" in error["message"]
    assert daemon.run(install, "evil_in", {"s": "aaaa"}).json()["status"] == "succeeded"


def test_catastrophic_output_pattern_fails_the_run_at_once(
    daemon: Daemon, app: Callable[..., AppDir], healthy: HealthProbe
) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": EVIL}}}
    source = "def run(i):\n    return {'s': 'a' * 5000 + '!'}\n"
    install = ship_tool(daemon, app(), "evil_out", source, output=schema)
    body = daemon.run(install, "evil_out", {}).json()
    assert body["status"] == "failed" and "output schema" in body["error"], body


def test_unique_items_with_colliding_integers_is_linear(
    daemon: Daemon, app: Callable[..., AppDir], healthy: HealthProbe
) -> None:
    # Integers a multiple of 2**61 - 1 apart share Python's hash: a set of them is
    # quadratic, in one C call that holds the GIL.
    schema = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
    install = ship_tool(daemon, app(), "uniq", "def run(i):\n    return {}\n", input=schema)
    colliding = [7 + (2**61 - 1) * i for i in range(10_000)]  # 245 KB of JSON
    assert daemon.run(install, "uniq", {"xs": colliding}).json()["status"] == "succeeded"
    response = daemon.run(install, "uniq", {"xs": [*colliding, 7]})
    assert "unique" in envelope(response, 400, "INVALID_INPUT")["message"]


# anyOf of two equal branches, recursing into each item: a value nested d levels that
# fails at the bottom is checked 2**d times. Linear keywords, exponential schema.
EXPONENTIAL = {
    "type": "object",
    "properties": {"v": {"$ref": "#/$defs/n"}},
    "$defs": {
        "n": {
            "anyOf": [
                {"type": "array", "items": {"$ref": "#/$defs/n"}},
                {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 0},
            ]
        }
    },
}


def nested(depth: int, bottom: Any) -> Any:
    value = bottom
    for _ in range(depth):
        value = [value]
    return value


def test_input_check_past_its_budget_is_refused(
    daemon: Daemon, app: Callable[..., AppDir], healthy: HealthProbe
) -> None:
    install = ship_tool(daemon, app(), "expo_in", "def run(i):\n    return {}\n", input=EXPONENTIAL)
    started = time.monotonic()
    response = daemon.run(install, "expo_in", {"v": nested(60, 1)})
    waited = time.monotonic() - started
    error = envelope(response, 400, "INVALID_INPUT")
    assert "budget" in error["message"] and f"{BUDGET_MS} ms" in error["message"]
    assert waited < 30  # it was abandoned, not finished (2**60 checks)
    # The checker threads are free again: an ordinary call is answered.
    assert daemon.run(install, "expo_in", {"v": nested(3, [])}).json()["status"] == "succeeded"


def test_duration_counts_the_checks_the_caller_waited_for(
    daemon: Daemon, app: Callable[..., AppDir], healthy: HealthProbe
) -> None:
    source = (
        "def run(i):\n    v = 1\n    for _ in range(60):\n        v = [v]\n    return {'v': v}\n"
    )
    install = ship_tool(daemon, app(), "expo_out", source, output=EXPONENTIAL)
    started = time.monotonic()
    body = daemon.run(install, "expo_out", {}).json()
    waited_ms = (time.monotonic() - started) * 1000
    assert body["status"] == "failed" and "budget" in body["error"], body
    assert BUDGET_MS <= body["durationMs"] <= waited_ms


def test_patterns_a_linear_engine_cannot_run_are_refused_at_upload(
    daemon: Daemon, app: Callable[..., AppDir]
) -> None:
    for pattern in ["^(?=a)", r"^(a)\1$", "(?<!x)y"]:
        folder = app()
        schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
        folder.write("tools/p.tool.yaml", tool_doc("p", input=schema))
        folder.write("tools/p.py", "def run(i):\n    return {}\n")
        found = problems(daemon.deploy(folder.root))
        assert len(found) == 1 and "tools/p.tool.yaml:1: input:" in found[0], found
        assert "linear-time" in found[0]


def test_the_largest_bundle_is_checked_and_stored_off_the_event_loop(
    daemon: Daemon, healthy: HealthProbe
) -> None:
    # 50 tools of 500 KB each: decoding, checking and storing 25 MB takes a while; none
    # of it may hold the event loop.
    source = b"def run(i):\n    return {}\n# " + b"x" * (500 * 1024) + b"\n"
    files = {"agentserve.app.yaml": b"slug: largest\nname: Largest\ntools: ./tools/*\n"}
    for i in range(50):
        files[f"tools/t{i}.tool.yaml"] = tool_doc(f"t{i}").encode()
        files[f"tools/t{i}.py"] = source
    response = deploy_files(daemon, files)
    assert response.status_code == 201, response.text[:500]
    assert len(response.json()["version"]["tools"]) == 50


def test_deploy_files_are_read_one_by_one_with_every_json_form_and_every_refusal_clean(
    daemon: Daemon,
) -> None:
    # The daemon reads a deploy's file contents one file at a time (the body's strings
    # are left unread at first). Each file may still come in any legal JSON form; and no
    # value a file cannot be, however deep, may get past a clean 400.
    source = b"def run(i):\n    return {'q': '???'}\n"  # base64 has '/': "Pz8/"
    files = {
        "agentserve.app.yaml": b"slug: escapes\nname: Escapes\ntools: ./tools/*\n",
        "tools/q.tool.yaml": tool_doc("q").encode(),
        "tools/q.py": source,
    }
    plain = json.dumps({"files": {p: base64.b64encode(d).decode() for p, d in files.items()}})
    assert "/" in base64.b64encode(source).decode()
    url, params = "/api/v2/apps/deploy", {"workspaceId": daemon.workspace_id}

    def post(body: str) -> httpx.Response:
        return daemon.call(
            "POST",
            url,
            daemon.admin_key,
            params=params,
            content=body.encode(),
            headers={"content-type": "application/json"},
        )

    escaped = post(plain.replace("/", "\\/"))  # "\/" is JSON for "/"
    assert escaped.status_code == 201, escaped.text
    again = post(plain)
    assert again.status_code == 201, again.text
    assert escaped.json()["version"]["contentHash"] == again.json()["version"]["contentHash"]

    def refused(value: str) -> str:
        body = plain.replace(f'"{base64.b64encode(source).decode()}"', value)
        assert body != plain
        return str(envelope(post(body), 400, "INVALID_BODY")["message"])

    assert "files['tools/q.py'] must be a base64 string" in refused("12")
    assert "files['tools/q.py'] must be a base64 string" in refused('{"a": "b"}')
    assert "files['tools/q.py'] is not" in refused('"not base64!"')
    assert "nested too deeply" in refused("[" * 100_000 + "]" * 100_000)
    assert "not JSON" in refused('"unterminated')


# --- 2. manifest globs -------------------------------------------------------------------------


def test_backtracking_glob_against_a_long_name_is_linear(
    daemon: Daemon, healthy: HealthProbe
) -> None:
    manifest = b"slug: globs\nname: Globs\ntools: tools/*a*a*a*a*a*a*a*a*a*a*a*a*b\n"
    files = {
        "agentserve.app.yaml": manifest,
        "tools/" + "a" * 250: b"x",
        "tools/t.tool.yaml": tool_doc("t").encode(),
        "tools/t.py": b"def run(i):\n    return {}\n",
    }
    found = problems(deploy_files(daemon, files))
    assert any("name no <name>.tool.yaml" in p for p in found), found


@pytest.mark.parametrize("glob", ["tools/[", "tools/[z-a]*", "tools/(*", "tools/[]"])
def test_globs_with_brackets_are_matched_or_refused_never_a_500(
    daemon: Daemon, app: Callable[..., AppDir], glob: str, cli: Cli
) -> None:
    folder = app()
    folder.write("agentserve.app.yaml", f"slug: brackets\nname: B\ntools: '{glob}'\n")
    folder.write("tools/t.tool.yaml", tool_doc("t"))
    folder.write("tools/t.py", "def run(i):\n    return {}\n")
    found = problems(daemon.deploy(folder.root))
    assert found and all(p.startswith("agentserve.app.yaml:") and "tools:" in p for p in found)
    validate = cli("app", "validate", str(folder.root))
    assert validate.returncode == 1
    no_traceback(validate)


# --- 3. YAML aliases and anchors ---------------------------------------------------------------

LAUGHS = "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" if i else 'l0: &l0 ["lol"]\n'
    for i in range(8)
)


def test_alias_bomb_in_a_tool_file_is_refused_unexpanded(
    daemon: Daemon, app: Callable[..., AppDir], healthy: HealthProbe
) -> None:
    folder = app()
    folder.write("tools/b.tool.yaml", "name: b\ndescription: d\ninput: {}\noutput: {}\n" + LAUGHS)
    folder.write("tools/b.py", "def run(i):\n    return {}\n")
    found = problems(daemon.deploy(folder.root))
    assert any(p.startswith("tools/b.tool.yaml:5:") and "anchors and aliases" in p for p in found)


def test_alias_bomb_in_the_manifest_is_refused_by_the_cli(
    app: Callable[..., AppDir], cli: Cli
) -> None:
    folder = app()
    folder.write("agentserve.app.yaml", "slug: bomb\nname: Bomb\ntools: ./tools/*\n" + LAUGHS)
    folder.write("tools/t.tool.yaml", tool_doc("t"))
    folder.write("tools/t.py", "def run(i):\n    return {}\n")
    proc = cli("app", "validate", str(folder.root), "--json")
    assert proc.returncode == 1
    found = json.loads(proc.stdout)["problems"]
    assert found[0]["file"] == "agentserve.app.yaml" and found[0]["line"] == 4, found
    assert "anchors and aliases" in found[0]["message"]


def test_merge_keys_need_aliases_and_are_refused(app: Callable[..., AppDir], cli: Cli) -> None:
    folder = app()
    yaml = "base: &base {type: object}\nname: m\ndescription: d\ninput:\n  <<: *base\noutput: {}\n"
    folder.write("tools/m.tool.yaml", yaml)
    folder.write("tools/m.py", "def run(i):\n    return {}\n")
    proc = cli("app", "validate", str(folder.root))
    assert proc.returncode == 1 and "m.tool.yaml:1: invalid YAML" in proc.stdout, proc.stdout


# --- 4. nesting --------------------------------------------------------------------------------


def test_deeply_nested_input_is_a_400_not_a_500(
    daemon: Daemon, app: Callable[..., AppDir], healthy: HealthProbe
) -> None:
    install = ship_tool(daemon, app(), "deep_in", "def run(i):\n    return {}\n")
    for depth in (129, 1_000, 50_000):
        body = '{"input": {"v": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}}"
        response = daemon.call(
            "POST",
            f"/api/v2/apps/installs/{install}/tools/deep_in/run",
            daemon.admin_key,
            content=body,
            headers={"content-type": "application/json"},
        )
        assert "128 levels" in envelope(response, 400, "INVALID_INPUT")["message"]
    # 128 levels, the input object included, is allowed.
    assert daemon.run(install, "deep_in", {"v": nested(127, [])[0]}).json()["status"] == (
        "succeeded"
    )


def test_tool_returning_a_deep_list_fails_its_run_with_a_reason(
    daemon: Daemon, app: Callable[..., AppDir], healthy: HealthProbe
) -> None:
    source = (
        "def run(i):\n    v = []\n    for _ in range(980):\n        v = [v]\n    return {'v': v}\n"
    )
    install = ship_tool(daemon, app(), "deep_out", source)
    body = daemon.run(install, "deep_out", {}).json()
    assert body["status"] == "failed" and "nested deeper than 128 levels" in body["error"], body


FORGE_DEEP = (
    "import os, sys\ndef run(i):\n    os.write(int(sys.argv[1]), b'[' * 200000)\n    os._exit(0)\n"
)


def test_forged_deep_reply_fails_the_run(
    daemon: Daemon, app: Callable[..., AppDir], healthy: HealthProbe
) -> None:
    install = ship_tool(daemon, app(), "forge", FORGE_DEEP)
    body = daemon.run(install, "forge", {}).json()
    assert body["status"] == "failed", body


def test_forged_deep_reply_under_tool_test_is_no_traceback(tmp_path: Path, cli: Cli) -> None:
    (tmp_path / "forge.tool.yaml").write_text(tool_doc("forge"))
    (tmp_path / "forge.py").write_text(FORGE_DEEP)
    proc = cli("tool", "test", str(tmp_path / "forge.tool.yaml"), "--input", "{}")
    assert proc.returncode == 1 and proc.stdout.startswith("failed"), proc.stdout
    no_traceback(proc)


def test_deep_input_to_the_cli_is_refused_before_decoding(tmp_path: Path, cli: Cli) -> None:
    (tmp_path / "t.tool.yaml").write_text(tool_doc("t"))
    (tmp_path / "t.py").write_text("def run(i):\n    return {}\n")
    deep = '{"v": ' + "[" * 5000 + "]" * 5000 + "}"
    proc = cli("tool", "test", str(tmp_path / "t.tool.yaml"), "--input", deep)
    assert proc.returncode == 1 and "INVALID_INPUT" in proc.stderr, proc.stderr
    no_traceback(proc)


def test_deep_yaml_is_a_problem_with_its_line(
    daemon: Daemon, app: Callable[..., AppDir], healthy: HealthProbe
) -> None:
    folder = app()
    folder.write("tools/d.tool.yaml", "name: d\ndescription: x\ninput: " + "[" * 20_000 + "\n")
    folder.write("tools/d.py", "def run(i):\n    return {}\n")
    found = problems(daemon.deploy(folder.root))
    assert any(p.startswith("tools/d.tool.yaml:3:") and "128 levels" in p for p in found), found
    block = "name: d\ndescription: x\ninput:\n" + "".join("  " * i + "- \n" for i in range(1, 200))
    folder.write("tools/d.tool.yaml", block)
    found = problems(daemon.deploy(folder.root))
    assert any("d.tool.yaml" in p and "128 levels" in p for p in found), found


# --- 5. $ref cycles ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        (
            {
                "type": "object",
                "properties": {"x": {"$ref": "#/$defs/loop"}},
                "$defs": {"loop": {"$ref": "#/$defs/loop"}},
            },
            "/$defs/loop",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/a"}},
                "$defs": {
                    "a": {"allOf": [{"$ref": "#/$defs/b"}]},
                    "b": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/a"}]},
                },
            },
            "/$defs/",
        ),
    ],
)
def test_ref_cycles_are_refused_at_upload_with_the_pointer(
    daemon: Daemon, app: Callable[..., AppDir], schema: dict[str, Any], pointer: str
) -> None:
    folder = app()
    folder.write("tools/r.tool.yaml", tool_doc("r", input=schema))
    folder.write("tools/r.py", "def run(i):\n    return {}\n")
    found = problems(daemon.deploy(folder.root))
    assert len(found) == 1 and found[0].startswith("tools/r.tool.yaml:1: input:"), found
    assert "leads back to itself" in found[0] and f"at {pointer}" in found[0]


def test_recursion_that_steps_into_the_value_is_allowed(
    daemon: Daemon, app: Callable[..., AppDir]
) -> None:
    schema = {"type": "object", "properties": {"child": {"$ref": "#"}}}
    install = ship_tool(daemon, app(), "tree", "def run(i):\n    return {}\n", input=schema)
    deep = {"child": {"child": {"child": {}}}}
    assert daemon.run(install, "tree", deep).json()["status"] == "succeeded"
    envelope(daemon.run(install, "tree", {"child": 1}), 400, "INVALID_INPUT")


# --- 7. symlinks and what files say ------------------------------------------------------------

SHADOW = "root:$y$j9T$SECRETHASHSECRET:19000:0:99999:7:::\nsvc:$6$ANOTHERSECRETLINE:19000::::::\n"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside any app, with a file that must never be read or echoed."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "shadow").write_text(SHADOW)
    (folder / "x.tool.yaml").write_text(tool_doc("x"))
    (folder / "x.py").write_text("def run(i):\n    return {'stolen': True}\n")
    return folder


def never_echoed(proc: subprocess.CompletedProcess[str]) -> None:
    text = proc.stdout + proc.stderr
    assert "SECRET" not in text and "$y$" not in text, text
    no_traceback(proc)


def test_tool_file_symlinked_out_of_the_app_is_refused_unread(
    app: Callable[..., AppDir], outside: Path, daemon: Daemon, cli: Cli
) -> None:
    folder = app()
    folder.write("tools/t.py", "def run(i):\n    return {}\n")
    (folder.root / "tools" / "t.tool.yaml").symlink_to(outside / "shadow")
    validate = cli("app", "validate", str(folder.root))
    assert validate.returncode == 1 and "tools/t.tool.yaml" in validate.stdout
    assert "symlink to a place outside the app folder" in validate.stdout
    never_echoed(validate)
    test = cli("tool", "test", str(folder.root / "tools" / "t.tool.yaml"), "--input", "{}")
    assert test.returncode == 1 and "symlink" in test.stderr
    never_echoed(test)
    deploy = cli("app", "deploy", str(folder.root))
    assert deploy.returncode == 1 and "symlink" in deploy.stderr
    never_echoed(deploy)


def test_manifest_symlinked_out_of_the_app_is_refused(
    app: Callable[..., AppDir], outside: Path, cli: Cli
) -> None:
    folder = app()
    (folder.root / "agentserve.app.yaml").unlink()
    (folder.root / "agentserve.app.yaml").symlink_to(outside / "shadow")
    proc = cli("app", "validate", str(folder.root))
    assert proc.returncode == 1 and "agentserve.app.yaml" in proc.stdout
    never_echoed(proc)


def test_folder_symlink_named_by_a_glob_is_not_followed_out(
    app: Callable[..., AppDir], outside: Path, cli: Cli
) -> None:
    folder = app()
    folder.write("tools/t.tool.yaml", tool_doc("t"))
    folder.write("tools/t.py", "def run(i):\n    return {}\n")
    (folder.root / "tools" / "vendor").symlink_to(outside)
    folder.write("agentserve.app.yaml", "slug: links\nname: L\ntools: ['./tools/*', 'tools/**']\n")
    proc = cli("app", "validate", str(folder.root), "--json")
    assert proc.returncode == 1
    found = json.loads(proc.stdout)["problems"]
    assert [p["file"] for p in found] == ["tools/vendor"], found
    never_echoed(proc)


def test_source_symlinked_out_of_the_app_is_refused(
    app: Callable[..., AppDir], outside: Path, cli: Cli
) -> None:
    folder = app()
    folder.write("tools/x.tool.yaml", tool_doc("x"))
    (folder.root / "tools" / "x.py").symlink_to(outside / "x.py")
    proc = cli("app", "validate", str(folder.root))
    assert proc.returncode == 1 and "tools/x.py" in proc.stdout and "symlink" in proc.stdout


def test_links_inside_the_app_are_followed(app: Callable[..., AppDir], cli: Cli) -> None:
    folder = app()
    folder.write("shared/t.tool.yaml", tool_doc("t"))
    folder.write("shared/t.py", "def run(i):\n    return {}\n")
    (folder.root / "tools").symlink_to(folder.root / "shared")
    (folder.root / "shared" / "loop").symlink_to(folder.root / "shared")
    folder.write("agentserve.app.yaml", "slug: inside\nname: I\ntools: 'tools/**'\n")
    proc = cli("app", "validate", str(folder.root), "--json")
    assert proc.returncode == 0, proc.stdout
    assert [t["source"] for t in json.loads(proc.stdout)["tools"]] == ["tools/t.py"]


def test_unknown_fields_are_named_only_when_plain(app: Callable[..., AppDir], cli: Cli) -> None:
    folder = app()
    yaml = tool_doc("u")[:-1] + ', "root:$y$SECRETHASH:19000": 1, "colour": 2}'
    folder.write("tools/u.tool.yaml", yaml)
    folder.write("tools/u.py", "def run(i):\n    return {}\n")
    proc = cli("app", "validate", str(folder.root))
    assert proc.returncode == 1
    assert "unknown field 'colour'" in proc.stdout and "not a plain name" in proc.stdout
    never_echoed(proc)


@pytest.mark.parametrize(
    "path", ["../outside.tool.yaml", "tools/../../etc/x.tool.yaml", "/etc/x.tool.yaml", "a//b"]
)
def test_uploaded_paths_with_dot_dot_are_refused(daemon: Daemon, path: str) -> None:
    files = {
        "agentserve.app.yaml": b"slug: paths\nname: P\ntools: '**'\n",
        path: tool_doc("x").encode(),
    }
    found = problems(deploy_files(daemon, files))
    assert len(found) == 1 and "a path" in found[0], found


# --- 9. terminal escapes -----------------------------------------------------------------------

ESCAPES = (
    "import sys\ndef run(i):\n"
    "    print('\\x1b]0;pwned\\x07\\x1b[31mred\\x1b[0m \\u202egnp.exe')\n"
    "    raise ValueError('\\x1b[2J\\x1b[Hcleared')\n"
)


def test_tool_test_shows_control_characters_escaped(tmp_path: Path, cli: Cli) -> None:
    (tmp_path / "e.tool.yaml").write_text(tool_doc("e"))
    (tmp_path / "e.py").write_text(ESCAPES)
    proc = cli("tool", "test", str(tmp_path / "e.tool.yaml"), "--input", "{}")
    assert proc.returncode == 1
    assert "\x1b" not in proc.stdout and "\u202e" not in proc.stdout and "\x07" not in proc.stdout
    assert "\\x1b[31mred" in proc.stdout and "\\x1b[2J" in proc.stdout, proc.stdout
    as_json = cli("tool", "test", str(tmp_path / "e.tool.yaml"), "--input", "{}", "--json")
    assert "\x1b[31m" in json.loads(as_json.stdout)["logs"]  # JSON keeps the real text


def test_tools_run_shows_control_characters_escaped(
    daemon: Daemon, app: Callable[..., AppDir], cli: Cli
) -> None:
    folder = app()
    ship_tool(daemon, folder, "esc", ESCAPES)
    slug = folder.root.joinpath("agentserve.app.yaml").read_text().split()[1]
    proc = cli("tools", "run", f"{slug}/esc", "--input", "{}")
    assert proc.returncode == 1 and "\x1b" not in proc.stdout
    assert "\\x1b[2J\\x1b[Hcleared" in proc.stdout, proc.stdout


# --- 10. secrets -------------------------------------------------------------------------------

SECRET = "sk_live_Q7w9ZpX2vT"

LEAKS = """
import base64, os, urllib.parse

def run(i):
    s = os.environ['API_KEY']
    forms = [s, s[::-1], s.upper(), s.lower(), s.encode().hex(), s.encode().hex().upper(),
             base64.b32encode(s.encode()).decode(), base64.b32encode(b'xy' + s.encode()).decode(),
             base64.b64encode(b'z' + s.encode()).decode(), urllib.parse.quote(s, safe='')]
    lines = [f'leak {form}' for form in forms]
    for line in lines:
        print(line)
    written = sum(len(line) + 1 for line in lines)
    print('x' * (64 * 1024 - written - 10) + s + 'y' * 100)  # s straddles the 64 KB cap
    raise RuntimeError(' '.join(forms) + ' ' + 'e' * 900_000)
"""


def test_secrets_are_scrubbed_in_common_encodings_and_across_the_log_cap(
    tmp_path: Path, cli: Cli
) -> None:
    (tmp_path / "leak.tool.yaml").write_text(tool_doc("leak"))
    (tmp_path / "leak.py").write_text(LEAKS)
    proc = cli(
        "tool", "test", str(tmp_path / "leak.tool.yaml"), "--input", "{}", "--json",
        "--secret", "API_KEY", env={"API_KEY": SECRET},
    )  # fmt: skip
    result = json.loads(proc.stdout)
    text = result["logs"] + result["error"]
    for fragment in (SECRET[:6], SECRET[::-1][:6], SECRET.upper()[:6], SECRET.encode().hex()[:8]):
        assert fragment.lower() not in text.lower(), fragment
    assert result["logs"].count("[secret]") >= 10 and result["logsTruncated"]
    assert len(result["logs"].encode()) <= 64 * 1024
    # The 900 KB exception message comes back cut to 8 KB, scrubbed first.
    assert len(result["error"]) < 9 * 1024 and "more characters cut" in result["error"]
    assert result["error"].startswith("RuntimeError: [secret] [secret]")


def test_output_with_a_hex_encoded_secret_is_withheld(tmp_path: Path, cli: Cli) -> None:
    (tmp_path / "hex.tool.yaml").write_text(tool_doc("hex"))
    (tmp_path / "hex.py").write_text(
        "import os\ndef run(i):\n    return {'v': os.environ['API_KEY'].encode().hex()}\n"
    )
    proc = cli(
        "tool", "test", str(tmp_path / "hex.tool.yaml"), "--input", "{}", "--json",
        "--secret", "API_KEY", env={"API_KEY": SECRET},
    )  # fmt: skip
    result = json.loads(proc.stdout)
    assert result["status"] == "failed" and result["output"] is None
    assert "withheld" in result["error"] and "API_KEY" in result["error"]
