"""Day two (issue 28): what an operator meets after the quickstart, through the real CLI,
a real daemon and the quickstart script: one clear line for every refusal, with its
documented exit code, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import REPO, RUNNERD, AppDir, run_cli, tool_doc
from daemon import Daemon, free_port, new_data_dir, runnerd_env, running_daemon, wait_until
from runnerd.store import Store

SLEEPER = "import time\ndef run(i):\n    time.sleep(i['s'])\n    return {'slept': i['s']}\n"
QUICKSTART = REPO / "scripts" / "quickstart"


def _sleeper_app(root: Path) -> Path:
    app = AppDir(root)
    app.write("agentserve.app.yaml", "slug: sleeper\nname: Sleeper\ntools: ./tools/*\n")
    app.tool("nap", yaml=tool_doc("nap", timeoutMs=120000), source=SLEEPER)
    return root


def _one_line(text: str) -> str:
    """``text`` is one line of runnerd's saying, no traceback: that line."""
    assert "Traceback" not in text, text
    assert text.count("\n") == 1 and text.startswith("runnerd: "), text
    return text


def _not_root(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``runnerd ARGV`` with root given up first (its effective uid 65534)."""
    code = (
        "import os, sys; from runnerd.cli.main import main\n"
        "os.seteuid(65534)\n"
        f"sys.exit(main({list(argv)!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


# --- serve: its start, and its refusals -------------------------------------------------------


@pytest.mark.jail
def test_serve_with_a_relative_data_dir_runs_tools(toolchain_dir: Path, tmp_path: Path) -> None:
    data = new_data_dir()
    try:
        env = runnerd_env(data, toolchain_dir, {"apps_port": "0"})
        del env["RUNNERD_DATA_DIR"]
        boot = json.loads(
            run_cli("admin", "bootstrap", "--data-dir", data.name, "--workspace", "W",
                    "--email", "w@example.com", env=env, cwd=data.parent, check=True).stdout
        )  # fmt: skip
        port = free_port()
        proc = subprocess.Popen(
            [RUNNERD, "serve", "--data-dir", data.name, "--port", str(port)],
            env=env, cwd=data.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            daemon = Daemon(data, port, proc, boot["workspaceId"], boot["apiKey"], env)
            wait_until(lambda: _ready(daemon.url), 30, "the daemon is ready")
            install = daemon.ship(_sleeper_app(tmp_path / "sleeper"))["installId"]
            ran = daemon.run(install, "nap", {"s": 0}).json()
            assert ran["status"] == "succeeded", ran
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
    finally:
        shutil.rmtree(data, ignore_errors=True)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz").status_code == 200
    except httpx.TransportError:
        return False


def test_serve_and_doctor_without_root_say_so_in_one_line(tmp_path: Path) -> None:
    for argv in (["serve", "--data-dir", str(tmp_path)], ["doctor", "--data-dir", str(tmp_path)]):
        done = _not_root(*argv)
        assert done.returncode == 2, done
        assert done.stdout == ""
        assert _one_line(done.stderr).startswith(
            "runnerd: runnerd serve needs root: each run is mapped to a uid of its own"
        )
    found = _not_root("doctor", "--json", "--data-dir", str(tmp_path))
    assert found.returncode == 2
    assert json.loads(found.stdout)["checks"][0]["check"] == "root"


@pytest.mark.jail
def test_startup_refusals_are_one_line_with_exit_1(toolchain_dir: Path) -> None:
    with running_daemon(toolchain_dir) as daemon:
        # Another daemon on the data dir (on a free port of its own).
        again = run_cli("serve", "--port", str(free_port()),
                        env={**daemon.env, "RUNNERD_APPS_PORT": "0"})  # fmt: skip
        assert again.returncode == 1, again.stderr
        assert _one_line(again.stderr.splitlines(keepends=True)[-1]) == (
            f"runnerd: another daemon is serving {daemon.data_dir}\n"
        )
        assert "Traceback" not in again.stderr
        # Its port, from another data dir: said before anything starts.
        other = new_data_dir()
        try:
            taken = run_cli("serve", "--data-dir", str(other), "--port", str(daemon.port),
                            env={"RUNNERD_APPS_PORT": "0"})  # fmt: skip
            assert taken.returncode == 1
            said = _one_line(taken.stderr)
            assert f"port {daemon.port} on 127.0.0.1 (port) is taken" in said
            assert "--port or RUNNERD_PORT" in said
            # A bad setting: 2.
            bad = run_cli("serve", "--data-dir", str(other),
                          env={"RUNNERD_MAX_CONCURRENT_RUNS": "many"})  # fmt: skip
            assert bad.returncode == 2
            assert "max_concurrent_runs" in _one_line(bad.stderr)
        finally:
            shutil.rmtree(other, ignore_errors=True)


@pytest.mark.jail
def test_a_restored_store_without_its_secrets_key_is_refused_in_one_line(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    with running_daemon(toolchain_dir) as daemon:
        install = daemon.ship(_sleeper_app(tmp_path / "sleeper"))["installId"]
        put = daemon.call("PUT", f"/api/v2/apps/installs/{install}/secrets/TOKEN",
                          daemon.admin_key, json={"value": "s3cret"})  # fmt: skip
        assert put.status_code in (200, 201, 204), put.text
        backup = tmp_path / "b.db"
        done = run_cli("admin", "backup", "--to", str(backup), env=daemon.env)
        assert done.returncode == 0, done.stderr
        key = (daemon.data_dir / "secrets.key").read_text()
        audit_key = (daemon.data_dir / "audit.key").read_text()
    elsewhere = new_data_dir()
    try:
        env = {**daemon.env, "RUNNERD_DATA_DIR": str(elsewhere)}
        refused = run_cli("admin", "restore", "--from", str(backup), env=env)
        assert refused.returncode == 1
        said = _one_line(refused.stderr)
        assert "no secrets.key at" in said and "put back the secrets.key" in said
        assert not (elsewhere / "runnerd.db").exists()  # nothing was changed
        # A data dir restored by hand, without its key: the daemon says so, makes none.
        shutil.copy(backup, elsewhere / "runnerd.db")
        (elsewhere / "audit.key").write_text(audit_key)
        serve = run_cli("serve", "--port", str(free_port()), env=env)
        assert serve.returncode == 1
        assert "there is no secrets key at" in _one_line(serve.stderr)
        assert not (elsewhere / "secrets.key").exists()
        # With the key put back, restore does it, and says so.
        (elsewhere / "runnerd.db").unlink()
        (elsewhere / "secrets.key").write_text(key)
        restored = run_cli("admin", "restore", "--from", str(backup), env=env)
        assert restored.returncode == 0, restored.stderr
        assert "its secrets open with the secrets.key there" in restored.stdout
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


# --- the drain --------------------------------------------------------------------------------


def _call_in_thread(
    daemon: Daemon, install: str, seconds: float
) -> tuple[threading.Thread, dict[str, Any]]:
    answer: dict[str, Any] = {}

    def call() -> None:
        try:
            response = daemon.run(install, "nap", {"s": seconds})
            answer.update(status=response.status_code, body=response.json())
        except (httpx.HTTPError, ValueError) as exc:
            answer["error"] = repr(exc)

    thread = threading.Thread(target=call)
    thread.start()
    return thread, answer


def _history(daemon: Daemon, run_id: str) -> Any:
    store = Store.in_data_dir(daemon.data_dir)
    try:
        return store.get_run(run_id)
    finally:
        store.close()


@pytest.mark.jail
def test_readyz_503_while_draining_and_a_second_sigterm_answers_the_caller(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    with running_daemon(toolchain_dir, stop_grace_s="30") as daemon:
        install = daemon.ship(_sleeper_app(tmp_path / "sleeper"))["installId"]
        thread, answer = _call_in_thread(daemon, install, 60)
        time.sleep(1.0)  # in its jail
        daemon.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: httpx.get(f"{daemon.url}/readyz").status_code == 503, 5,
                   "/readyz answers 503 while draining")  # fmt: skip
        assert (
            httpx.get(f"{daemon.url}/readyz").json()["error"]["details"]["checks"]["admitting"]
            == "no: stopping"
        )
        time.sleep(0.5)
        daemon.proc.send_signal(signal.SIGTERM)  # a second: the runs end now
        started = time.monotonic()
        assert daemon.proc.wait(timeout=20) == 0
        assert time.monotonic() - started < 10
        thread.join(timeout=20)
        assert answer.get("status") == 200, answer
        body = answer["body"]
        assert body["status"] == "failed" and "interrupted" in body["error"], body
        # The caller is told the duration the history has, not 0 ms.
        row = _history(daemon, body["runId"])
        assert body["durationMs"] == row.duration_ms and row.duration_ms >= 1000
        log = (daemon.data_dir / "serve.log").read_text()
        assert "Traceback" not in log and "a second signal" in log


@pytest.mark.jail
def test_an_interrupted_run_tells_its_caller_the_duration_its_history_has(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    with running_daemon(toolchain_dir, stop_grace_s="1") as daemon:
        install = daemon.ship(_sleeper_app(tmp_path / "sleeper"))["installId"]
        thread, answer = _call_in_thread(daemon, install, 60)
        time.sleep(1.0)
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(timeout=20) == 0
        thread.join(timeout=20)
        body = answer["body"]
        assert body["status"] == "failed", body
        assert body["durationMs"] == _history(daemon, body["runId"]).duration_ms >= 1500


# --- the quickstart ---------------------------------------------------------------------------


def _quickstart_env(data: Path, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "RUNNERD_DATA_DIR": str(data),
        "RUNNERD_PORT": str(port),
        "RUNNERD_APPS_PORT": str(free_port()),
        "RUNNERD_SANDBOX_UID_BASE": "660000",
        "RUNNERD_SANDBOX_UID_COUNT": "64",
    }


def test_the_quickstart_without_root_says_so_at_once(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    started = time.monotonic()
    done = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", "bash", str(QUICKSTART)],
        capture_output=True, text=True, timeout=60,
        env=_quickstart_env(tmp_path / "data", free_port()),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 10
    assert done.stderr.startswith("quickstart: runnerd serve needs root")
    assert done.stderr.count("\n") == 1


@pytest.mark.jail
def test_the_quickstart_never_deploys_to_another_daemon_and_stops_on_ctrl_c(
    toolchain_dir: Path,
) -> None:
    data = new_data_dir()
    port = free_port()
    env = {**_quickstart_env(data, port), "RUNNERD_TOOLCHAIN_DIR": str(toolchain_dir)}
    log = data.parent / f"{data.name}.quickstart.log"
    first = None
    try:
        with socket.socket() as squatter:  # another program on the port
            squatter.bind(("127.0.0.1", port))
            squatter.listen()
            taken = subprocess.run(["bash", str(QUICKSTART)], capture_output=True, text=True,
                                   env=env, timeout=300)  # fmt: skip
        assert taken.returncode == 1, taken.stderr
        assert f"quickstart: port {port} is taken" in taken.stderr
        assert "Traceback" not in taken.stderr and "deploying" not in taken.stderr

        with open(log, "wb") as out:
            first = subprocess.Popen(["bash", str(QUICKSTART)], env=env, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        wait_until(lambda: b"runnerd is serving the deal-desk example" in log.read_bytes(), 300,
                   "the quickstart serves", every_s=0.5)  # fmt: skip
        # Twice in one folder: on its port, then on another, each refused in its line.
        again = subprocess.run(["bash", str(QUICKSTART)], capture_output=True, text=True,
                               env=env, timeout=300)  # fmt: skip
        assert again.returncode == 1 and f"port {port} is taken" in again.stderr, again.stderr
        other = {**env, "RUNNERD_PORT": str(free_port()), "RUNNERD_APPS_PORT": "0"}
        beside = subprocess.run(["bash", str(QUICKSTART)], capture_output=True, text=True,
                                env=other, timeout=300)  # fmt: skip
        assert beside.returncode == 1, beside.stderr
        assert f"runnerd: another daemon is serving {data}" in beside.stderr
        for said in (again, beside):
            assert "Traceback" not in said.stderr and "runnerd is serving" not in said.stdout
        # Ctrl-C, as a terminal sends it: to the whole group.
        os.killpg(first.pid, signal.SIGINT)
        assert first.wait(timeout=60) == 0
        assert "Traceback" not in log.read_text()
    finally:
        if first is not None and first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        shutil.rmtree(data, ignore_errors=True)
        log.unlink(missing_ok=True)


# --- the CLI's rough edges --------------------------------------------------------------------


def _into_a_closed_pipe(*argv: str) -> tuple[int, bytes]:
    """``runnerd ARGV`` writing into a pipe its reader closed already (as ``| head`` does
    once it has its lines): the exit status and what it wrote on stderr."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([RUNNERD, *argv], stdout=write, capture_output=False,
                              stderr=subprocess.PIPE, timeout=60)  # fmt: skip
    finally:
        os.close(write)
    return done.returncode, done.stderr


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    assert _into_a_closed_pipe("openapi") == (141, b"")


def test_ledger_export_json_is_json_and_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    data = str(tmp_path)
    run_cli("admin", "bootstrap", "--data-dir", data, "--workspace", "W", "--email",
            "w@example.com", check=True)  # fmt: skip
    done = run_cli("ledger", "export", "--json", "--data-dir", data)
    assert done.returncode == 0
    assert json.loads(done.stdout) == []
    assert _into_a_closed_pipe("ledger", "export", "--data-dir", data) == (141, b"")


def test_bootstrap_says_keep_this_key_on_stderr_and_json_alone_on_stdout(tmp_path: Path) -> None:
    made = run_cli("admin", "bootstrap", "--data-dir", str(tmp_path), "--workspace", "W",
                   "--email", "w@example.com")  # fmt: skip
    assert made.returncode == 0
    assert set(json.loads(made.stdout)) == {"workspaceId", "userId", "apiKey"}
    assert "keep this key" in _one_line(made.stderr)


def test_tool_list_points_to_tools_and_run_input_has_help() -> None:
    wrong = run_cli("tool", "list")
    assert wrong.returncode == 2
    assert "`runnerd tools list`" in wrong.stderr and "Traceback" not in wrong.stderr
    shown = run_cli("tools", "run", "--help").stdout
    assert "--input JSON" in shown and "@FILE, or - for stdin" in shown


def test_bash_completion_completes_commands_subcommands_and_choices(tmp_path: Path) -> None:
    script = run_cli("completion", "bash")
    assert script.returncode == 0
    (tmp_path / "runnerd.bash").write_text(script.stdout)

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        done = subprocess.run(
            ["bash", "-c", f'source {tmp_path}/runnerd.bash; COMP_WORDS=({line}); '
             f'COMP_CWORD={len(words) - 1}; _runnerd_complete; printf "%s\\n" "${{COMPREPLY[@]}}"'],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout.split()

    assert complete("runnerd", "too") == ["tool", "toolchain", "tools"]
    assert complete("runnerd", "tools", "r") == ["run"]
    assert "--input" in complete("runnerd", "tools", "run", "--i")
    assert complete("runnerd", "runs", "list", "--status", "f") == ["failed"]
    assert complete("runnerd", "admin", "rest") == ["restore"]


def test_a_bad_schema_type_names_the_word(make_app: Any) -> None:
    app = make_app()
    app.tool("t", yaml=tool_doc("t", input={"type": "object", "properties": {
        "n": {"type": "nubmer"}}}))  # fmt: skip
    done = run_cli("app", "validate", str(app.root))
    assert done.returncode == 1
    assert (
        "input: not a usable JSON Schema: Unknown type 'nubmer' at properties.n.type" in done.stdout
    )


def test_deploy_of_one_tool_says_1_tool(toolchain_dir: Path, make_app: Any) -> None:
    app = make_app()
    app.tool("t")
    done = run_cli("app", "validate", str(app.root))
    assert "1 tool," in done.stdout and "1 tools" not in done.stdout


# --- the API ----------------------------------------------------------------------------------


def test_rest_takes_a_bearer_key_and_a_missing_workspace_is_not_found(
    app_daemon: Any,
) -> None:
    key = app_daemon.admin_key
    listed = app_daemon.http.get("/api/v2/apps/installs",
                                 params={"workspaceId": app_daemon.workspace_id},
                                 headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    assert listed.status_code == 200, listed.text
    missing = app_daemon.http.get("/api/v2/apps/installs", params={"workspaceId": "ws_nope"},
                                  headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    assert missing.status_code == 404
    assert missing.json()["error"]["details"]["code"] == "WORKSPACE_NOT_FOUND"
    # A workspace that exists, of which the caller is no member: still 403, as before.
    stranger = app_daemon.person("stranger@example.com", workspace_id=_other_workspace(app_daemon))
    refused = app_daemon.http.get("/api/v2/apps/installs",
                                  params={"workspaceId": app_daemon.workspace_id},
                                  headers={"X-API-Key": stranger})  # fmt: skip
    assert refused.status_code == 403
    assert refused.json()["error"]["details"]["code"] == "INSUFFICIENT_WORKSPACE_ROLE"


def _other_workspace(app: Any) -> str:
    store = app.store()
    try:
        return str(store.create_workspace("Other").id)
    finally:
        store.close()
