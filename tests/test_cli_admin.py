"""`runnerd admin` and `runnerd ledger export` on a data dir meet the API's rules: an
email is taken as the API takes it, a key is made only for a person of a workspace, a
month is YYYY-MM; a refusal prints the API's message and exits non-zero. The ledger's
CSV keeps each surface's header (the CLI's column names, the API's wire names)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

from conftest import run_cli
from inproc import InProcess


def admin(d: InProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """``runnerd ARGS`` on the in-process app's data dir."""
    return run_cli(*args, env=d.env)


def test_add_person_and_set_role_take_the_email_as_the_api_does(app_daemon: InProcess) -> None:
    d = app_daemon
    added = admin(d, "admin", "add-person", "--workspace", d.workspace_id,
                  "--email", "  lee@example.com \n", "--json")  # fmt: skip
    assert added.returncode == 0, added.stderr
    person = json.loads(added.stdout)
    changed = admin(d, "admin", "set-role", "--workspace", d.workspace_id,
                    "--email", " lee@example.com", "--role", "builder", "--json")  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout)["userId"] == person["userId"]
    put = d.call("PUT", f"/api/v2/workspaces/{d.workspace_id}/members", d.admin_key,
                 json={"email": "lee@example.com", "role": "builder"})  # fmt: skip
    assert put.status_code == 200, put.text
    assert put.json()["userId"] == person["userId"]
    members = d.call("GET", f"/api/v2/workspaces/{d.workspace_id}/members", d.admin_key).json()
    assert [m["email"] for m in members["data"]].count("lee@example.com") == 1


def test_a_key_is_made_only_for_a_person_of_a_workspace(app_daemon: InProcess) -> None:
    d = app_daemon
    api = d.call("POST", f"/api/v2/workspaces/{d.workspace_id}/keys", d.admin_key,
                 json={"kind": "personal", "email": "stranger@example.com"})  # fmt: skip
    assert api.status_code == 400 and api.json()["error"]["details"]["code"] == "NOT_A_MEMBER"
    said = api.json()["error"]["message"]
    for command in (
        ("create-key", "--email", "stranger@example.com"),
        ("token", "--email", "stranger@example.com", "--scope", "api:read"),
    ):
        refused = admin(d, "admin", *command)
        assert refused.returncode == 1, refused.stdout
        assert refused.stdout == ""
        # The API names its workspace; the CLI's keys act in every workspace of their person.
        assert (
            refused.stderr == "runnerd: " + said.replace("this workspace", "any workspace") + "\n"
        )
    # Nobody was made on the way: the stranger is still unknown.
    unknown = admin(d, "admin", "login-link", "--email", "stranger@example.com")
    assert unknown.returncode == 1 and "no person with the email" in unknown.stderr
    made = admin(d, "admin", "add-person", "--workspace", d.workspace_id,
                 "--email", "kim@example.com")  # fmt: skip
    assert made.returncode == 0, made.stderr
    token = admin(d, "admin", "token", "--email", "KIM@example.com", "--scope", "api:read",
                  "--json")  # fmt: skip
    assert token.returncode == 0, token.stderr
    assert json.loads(token.stdout)["scopes"] == ["api:read"]


def test_ledger_export_refuses_a_month_as_the_api_does(app_daemon: InProcess) -> None:
    d = app_daemon
    for month in ("2026-13", "2026-1", "november"):
        api = d.call("GET", "/api/v2/ledger", d.admin_key,
                     params={"workspaceId": d.workspace_id, "month": month})  # fmt: skip
        assert api.status_code == 400, api.text
        refused = admin(d, "ledger", "export", "--month", month)
        assert refused.returncode == 2, refused.stdout
        assert refused.stdout == ""
        assert refused.stderr == f"runnerd: {api.json()['error']['message']}\n"
    assert admin(d, "ledger", "export", "--month", "2026-12").returncode == 0


def test_the_ledger_csv_keeps_each_surfaces_header(app_daemon: InProcess) -> None:
    d = app_daemon
    row = {
        "id": "led_csv1",
        "kind": "app-tool",
        "run_id": None,
        "sandbox_ms": 1234,
        "payer_kind": "workspace",
        "payer_id": d.workspace_id,
        "workspace_id": d.workspace_id,
        "app_id": "app_x",
        "install_id": "ins_x",
        "version_id": "ver_x",
        "tool": "t, with a comma",
        "user_id": "usr_x",
        "month": "2031-05",
        "created_at": "2031-05-01T00:00:00Z",
    }
    store = d.store()
    try:
        with store.db.write():
            store.db.insert("ledger", row)
    finally:
        store.close()
    cells = f'led_csv1,app-tool,,1234,workspace,{d.workspace_id},{d.workspace_id},app_x,ins_x,ver_x,"t, with a comma",usr_x,2031-05,2031-05-01T00:00:00Z'  # noqa: E501
    exported = admin(d, "ledger", "export", "--month", "2031-05")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout == (
        "id,kind,run_id,sandbox_ms,payer_kind,payer_id,workspace_id,app_id,install_id,"
        f"version_id,tool,user_id,month,created_at\n{cells}\n"
    )
    downloaded = d.call("GET", "/api/v2/ledger", d.admin_key,
                        params={"workspaceId": d.workspace_id, "month": "2031-05",
                                "format": "csv"})  # fmt: skip
    assert downloaded.status_code == 200, downloaded.text
    assert downloaded.text == (
        "id,kind,runId,sandboxMs,payerKind,payerId,workspaceId,appId,installId,versionId,"
        f"tool,userId,month,createdAt\r\n{cells}\r\n"
    )
    as_json = json.loads(admin(d, "ledger", "export", "--month", "2031-05", "--format",
                               "json").stdout)  # fmt: skip
    assert as_json == [row]


def test_bootstrap_takes_the_email_as_the_api_does(tmp_path: Path) -> None:
    data = str(tmp_path)
    made = run_cli("admin", "bootstrap", "--data-dir", data, "--workspace", "W",
                   "--email", " ada@example.com ")  # fmt: skip
    assert made.returncode == 0, made.stderr
    found = json.loads(made.stdout)
    assert set(found) == {"workspaceId", "userId", "apiKey"}
    link = run_cli("admin", "login-link", "--data-dir", data, "--email", "ada@example.com")
    assert link.returncode == 0, link.stderr
    # The daemon the CLI talks to (RUNNERD_URL) is where the link goes.
    elsewhere = run_cli("admin", "login-link", "--data-dir", data, "--email", "ada@example.com",
                        env={"RUNNERD_URL": "http://127.0.0.1:56645"})  # fmt: skip
    assert elsewhere.stdout.startswith("http://127.0.0.1:56645/login#token="), elsewhere.stdout
    key = run_cli("admin", "create-key", "--data-dir", data, "--email", "ada@example.com",
                  "--json")  # fmt: skip
    assert key.returncode == 0, key.stderr


def test_service_install_bootstraps_once(tmp_path: Path) -> None:
    def install() -> subprocess.CompletedProcess[str]:
        return run_cli("service", "install", "--root", str(tmp_path), "--bootstrap-email",
                       " ops@example.com ", "--workspace", "Ops", "--json")  # fmt: skip

    first = install()
    assert first.returncode == 0, first.stderr
    made = json.loads(first.stdout)
    assert made["apiKey"].startswith("rk_p_") and made["workspaceId"].startswith("ws_")
    again = install()
    assert again.returncode == 0, again.stderr
    assert "apiKey" not in json.loads(again.stdout)
    data = tmp_path / "var/lib/runnerd"
    # (After the line saying the unit could not see this runnerd, when the tree is under a
    # folder the unit hides: a --root image is told, not refused.)
    assert again.stderr.endswith(f"runnerd: {data} has a workspace already; not bootstrapping\n")
    link = run_cli("admin", "login-link", "--data-dir", str(data), "--email", "ops@example.com")
    assert link.returncode == 0, link.stderr


def test_a_command_with_another_audit_key_writes_nothing_and_says_so(
    app_daemon: InProcess, tmp_path: Path
) -> None:
    """A CLI run with an audit key other than the one that wrote the trail (a stale
    audit.key in another data dir, another audit_key) would break the chain for good with
    its first entry: it refuses before writing, naming the key; `audit verify` still reads
    (and names the key it checked under). A data dir with no store is not made one."""
    d = app_daemon
    before = run_cli("audit", "verify", "--json", env=d.env)
    assert before.returncode == 0, before.stderr
    other = {**d.env, "RUNNERD_AUDIT_KEY": base64.b64encode(os.urandom(32)).decode()}
    refused = run_cli("admin", "login-link", "--email", "ada@example.com", env=other)
    assert refused.returncode != 0 and refused.stdout == ""
    assert "does not verify under this command's audit key" in refused.stderr, refused.stderr
    after = run_cli("audit", "verify", "--json", env=d.env)
    assert after.returncode == 0, after.stderr  # nothing was written under the other key
    assert json.loads(after.stdout)["entries"] == json.loads(before.stdout)["entries"]
    wrong = run_cli("audit", "verify", env=other)
    assert wrong.returncode == 1 and "checked under the audit key of the audit_key setting" in (
        wrong.stdout
    ), wrong.stdout
    # A node given that key refuses to serve, in one line before any listener opens.
    serve = run_cli("serve", "--port", "1", env=other, timeout=60)
    assert serve.returncode != 0 and "Not serving" in serve.stderr, serve.stderr
    assert "the audit_key setting" in serve.stderr and "Traceback" not in serve.stderr
    empty = tmp_path / "not-a-data-dir"
    for command in (("audit", "verify"), ("admin", "login-link", "--email", "a@example.com")):
        missing = run_cli(*command, "--data-dir", str(empty), env={"RUNNERD_CONFIG": ""})
        assert missing.returncode != 0 and "no runnerd store in" in missing.stderr, missing
        assert not (empty / "runnerd.db").exists()
