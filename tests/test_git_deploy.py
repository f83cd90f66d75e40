"""Deploy from Git (issue 26, part 6): ``runnerd app deploy --git`` deploys the app folder
of a commit, never a working tree's uncommitted files, from a local repository or a git
server on loopback (``git daemon``), by branch, tag or commit; the version records the
commit and ref. A Git deploy's push webhook, signed with X-Hub-Signature-256, deploys the
pushed commit of the configured repository; a bad or missing signature is 401 and
changes nothing. Errors name the flag or field, and store nothing.

A real daemon (``runnerd serve``), real git, real HTTP; no tool runs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import run_cli, write_app
from daemon import Daemon, envelope, free_port
from runnerd import limits
from runnerd.errors import GitSourceInvalid
from runnerd.upload.git import read_git_app, ref_matches
from runnerd.upload.walk import read_app_dir

DAEMON_SETTINGS = {"git_deploy_allow_local": "true", "rate_limit_burst": "1000"}
GIT = shutil.which("git") or "/usr/bin/git"
pytestmark = pytest.mark.skipif(not Path(GIT).exists(), reason="needs git")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        [GIT, "-C", str(repo), *args], capture_output=True, text=True, check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1",
             "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
             "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"},
    )  # fmt: skip
    return done.stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def new_repo(root: Path, slug: str) -> Path:
    """A repository whose ``app`` folder is an app with the tool ``echo``."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    write_app(root / "app", slug, {"echo": "def run(i):\n    return {'v': 1}\n"})
    (root / "README.md").write_text("not part of the app\n")
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A git server on loopback (``git daemon``) exporting the folder it returns: its
    git:// base URL."""
    base = tmp_path_factory.mktemp("served")
    port = free_port()
    proc = subprocess.Popen(
        [GIT, "daemon", "--export-all", f"--base-path={base}", "--listen=127.0.0.1",
         f"--port={port}", "--reuseaddr", str(base)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "git daemon did not start"
                time.sleep(0.05)
        yield base, f"git://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def versions(d: Daemon, slug: str) -> list[dict[str, Any]]:
    apps = d.call("GET", "/api/v2/apps", d.admin_key, params={"workspaceId": d.workspace_id})
    assert apps.status_code == 200, apps.text
    return next((a["versions"] for a in apps.json()["data"] if a["appSlug"] == slug), [])


def deploy(d: Daemon, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("app", "deploy", "--json", *args, env=d.client_env(), cwd=cwd)


# --- the reading of a commit, on its own ------------------------------------------------------


def test_the_bundle_is_the_commits_folder_as_a_checkout_gives_it(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "repo", "reader")
    (repo / "app" / "link").symlink_to("tools/echo.py")
    first = commit_all(repo, "one")
    clone = tmp_path / "clone"
    subprocess.run([GIT, "clone", "-q", str(repo), str(clone)], check=True)
    # The working tree changes after the commit; none of it is in the commit's bundle.
    (repo / "app" / "tools" / "echo.py").write_text("def run(i):\n    return {'v': 'dirty'}\n")
    (repo / "app" / "tools" / "extra.py").write_text("def run(i):\n    return {}\n")
    got = read_git_app(str(repo), path="app")
    assert got.commit == first and got.ref == "refs/heads/main"
    assert got.files == read_app_dir(clone / "app")
    assert b"dirty" not in got.files["tools/echo.py"]
    assert "tools/extra.py" not in got.files
    # By a short commit name: no ref; by file://, the same.
    assert read_git_app(f"file://{repo}", ref=first[:10], path="app/").ref is None


def test_each_bad_source_names_its_field(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "repo", "bad")
    commit_all(repo, "one")
    cases = [
        ({"source": str(repo), "ref": "no-such-branch", "path": "app"}, "ref"),
        ({"source": str(repo), "ref": "--upload-pack=x", "path": "app"}, "ref"),
        ({"source": str(repo), "path": "nowhere"}, "path"),
        ({"source": str(repo)}, "path"),  # the root holds no manifest
        ({"source": str(repo), "path": "../etc"}, "path"),
        ({"source": str(tmp_path / "missing")}, "repository"),
        ({"source": str(tmp_path)}, "repository"),  # a folder, not a repository
    ]
    for kw, field in cases:
        with pytest.raises(GitSourceInvalid) as caught:
            read_git_app(**kw)  # type: ignore[arg-type]
        assert caught.value.field == field, (kw, caught.value)
    with pytest.raises(GitSourceInvalid, match="git_deploy_allow_local"):
        read_git_app(str(repo), path="app", daemon=True, allow_local=False)
    with pytest.raises(GitSourceInvalid, match="http"):
        read_git_app("ssh://git@example.com/x.git", daemon=True, allow_local=False)


def test_ref_patterns() -> None:
    assert ref_matches("refs/heads/main", "refs/heads/main")
    assert ref_matches("main", "refs/heads/main")
    assert ref_matches("refs/tags/v*", "refs/tags/v1.2")
    assert not ref_matches("refs/tags/v*", "refs/tags/x/v1")
    assert not ref_matches("refs/heads/main", "refs/heads/main2")
    assert not ref_matches("main", "refs/tags/main")


# --- the CLI ------------------------------------------------------------------------------------


def test_cli_deploys_the_commit_never_the_working_tree(daemon: Daemon, tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "repo", "git-cli")
    first = commit_all(repo, "one")
    (repo / "app" / "tools" / "echo.py").write_text("def run(i):\n    return {'v': 2}\n")
    write_app(tmp_path / "dirty", "git-cli", {"extra": "def run(i):\n    return {}\n"})
    shutil.copytree(tmp_path / "dirty" / "tools", repo / "app" / "tools", dirs_exist_ok=True)
    done = deploy(daemon, "--git", str(repo), "--path", "app")
    assert done.returncode == 0, done.stderr
    version = json.loads(done.stdout)["version"]
    assert (version["commit"], version["ref"]) == (first, "refs/heads/main")
    assert version["tools"] == ["echo"]  # not the uncommitted extra
    # The same bundle as `app deploy DIR` of a checkout of that commit.
    clone = tmp_path / "clone"
    subprocess.run([GIT, "clone", "-q", str(repo), str(clone)], check=True)
    folder = deploy(daemon, str(clone / "app"))
    assert folder.returncode == 0, folder.stderr
    plain = json.loads(folder.stdout)["version"]
    assert plain["contentHash"] == version["contentHash"]
    assert plain["commit"] is None and plain["ref"] is None
    listed = {v["versionId"]: v for v in versions(daemon, "git-cli")}
    assert listed[version["versionId"]]["commit"] == first
    assert listed[version["versionId"]]["ref"] == "refs/heads/main"
    human = run_cli("app", "deploy", "--git", str(repo), "--path", "app", env=daemon.client_env())
    assert human.returncode == 0 and f"from commit {first} (refs/heads/main)" in human.stdout


def test_cli_deploys_by_url_branch_tag_and_commit(daemon: Daemon, served: tuple[Path, str]) -> None:
    base, url = served
    repo = new_repo(base / "by-url", "git-url")
    one = commit_all(repo, "one")
    git(repo, "tag", "v1")
    (repo / "app" / "tools" / "echo.py").write_text("def run(i):\n    return {'v': 2}\n")
    two = commit_all(repo, "two")
    git(repo, "checkout", "-q", "-b", "next")
    (repo / "app" / "tools" / "echo.py").write_text("def run(i):\n    return {'v': 3}\n")
    three = commit_all(repo, "three")
    git(repo, "checkout", "-q", "main")
    remote = f"{url}/by-url"
    for ref, commit, full in (
        (None, two, "refs/heads/main"),  # the server's HEAD
        ("v1", one, "refs/tags/v1"),
        ("next", three, "refs/heads/next"),
        (one, one, None),  # a commit that is no branch's tip
    ):
        done = deploy(daemon, "--git", remote, "--path", "app", *(("--ref", ref) if ref else ()))
        assert done.returncode == 0, (ref, done.stderr)
        version = json.loads(done.stdout)["version"]
        assert (version["commit"], version["ref"]) == (commit, full), ref
    hashes = {v["commit"]: v["contentHash"] for v in versions(daemon, "git-url")}
    assert len(set(hashes.values())) == 3  # three commits, three bundles


def test_cli_errors_name_the_flag_and_store_nothing(
    daemon: Daemon, tmp_path: Path, served: tuple[Path, str]
) -> None:
    repo = new_repo(tmp_path / "repo", "git-bad")
    commit_all(repo, "one")
    _, url = served
    for args, flag in (
        (("--git", str(repo), "--path", "app", "--ref", "nope"), "--ref"),
        (("--git", str(repo), "--path", "tools"), "--path"),
        (("--git", str(repo)), "--path"),
        (("--git", f"{url}/no-such-repo", "--path", "app"), "--git"),
        (("--git", str(tmp_path / "nothing-here")), "--git"),
    ):
        done = deploy(daemon, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.startswith(f"runnerd: {flag}: "), (args, done.stderr)
    both = deploy(daemon, str(repo / "app"), "--git", str(repo))
    assert both.returncode == 2 and "not both" in both.stderr
    alone = deploy(daemon, str(repo / "app"), "--ref", "main")
    assert alone.returncode == 2 and "--git" in alone.stderr
    assert versions(daemon, "git-bad") == []


# --- the push webhook ---------------------------------------------------------------------------


def post(d: Daemon, path: str, *, content: bytes, headers: dict[str, str]) -> Any:
    """A Git server's POST of a push event (JSON, as GitHub and Gitea send it)."""
    return d.http.post(
        path, content=content, headers={"Content-Type": "application/json", **headers}
    )


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def push_body(ref: str, after: str) -> bytes:
    # The body's repository is never fetched: only the configured one is.
    elsewhere = {"clone_url": "http://attacker.invalid/x.git"}
    return json.dumps(
        {"ref": ref, "before": "0" * 40, "after": after, "repository": elsewhere}
    ).encode()


def test_a_signed_push_deploys_the_pushed_commit(daemon: Daemon, served: tuple[Path, str]) -> None:
    base, url = served
    repo = new_repo(base / "hooked", "git-hook")
    first = commit_all(repo, "one")
    ws = daemon.workspace_id
    path = f"/api/v2/workspaces/{ws}/git-deploys/git-hook"
    made = daemon.call("PUT", path, daemon.admin_key, json={
        "repository": f"{url}/hooked", "ref": "refs/heads/main", "path": "app"})  # fmt: skip
    assert made.status_code == 200, made.text
    info = made.json()
    secret = info["secret"]
    assert info["webhookUrl"] == f"{daemon.url}/api/v2/apps/git-hook/git-webhook?workspaceId={ws}"
    hook = f"/api/v2/apps/git-hook/git-webhook?workspaceId={ws}"

    # Bad, missing or another body's signature: 401, and nothing deployed.
    body = push_body("refs/heads/main", first)
    for headers in (
        {},
        {"X-Hub-Signature-256": sign("whsec_wrong", body)},
        {"X-Hub-Signature-256": sign(secret, body + b" ")},
        {"X-Hub-Signature-256": sign(secret, body)[7:]},  # no sha256= prefix
    ):
        refused = post(daemon, hook, content=body, headers=headers)
        envelope(refused, 401)
    assert versions(daemon, "git-hook") == []

    # A good one deploys the pushed commit, from the configured repository.
    good = post(daemon, hook, content=body, headers={"X-Hub-Signature-256": sign(secret, body)})
    assert good.status_code == 201, good.text
    version = good.json()["version"]
    assert good.json()["deployed"] is True
    assert (version["commit"], version["ref"]) == (first, "refs/heads/main")
    [listed] = versions(daemon, "git-hook")
    assert listed["commit"] == first
    trail = daemon.call("GET", "/api/v2/audit", daemon.admin_key,
                        params={"workspaceId": ws, "limit": "1000"}).json()["data"]  # fmt: skip
    [entry] = [e for e in trail if e["action"] == "app.deploy" and e.get("versionId")
               == version["versionId"]]  # fmt: skip
    assert entry["detail"]["commit"] == first and entry.get("actorUserId") is None

    # A second commit pushed: its version; a branch the Git deploy does not follow, a
    # deletion and a ping deploy nothing.
    (repo / "app" / "tools" / "echo.py").write_text("def run(i):\n    return {'v': 2}\n")
    second = commit_all(repo, "two")
    body = push_body("refs/heads/main", second)
    again = post(daemon, hook, content=body, headers={"X-Hub-Signature-256": sign(secret, body)})
    assert again.status_code == 201, again.text
    assert again.json()["version"]["commit"] == second
    # The same delivery again (a Git server's redelivery, or a replay of a captured one):
    # the version it made, and no new one.
    replay = post(daemon, hook, content=body, headers={"X-Hub-Signature-256": sign(secret, body)})
    assert replay.status_code == 200 and replay.json()["deployed"] is False, replay.text
    assert replay.json()["version"]["versionId"] == again.json()["version"]["versionId"]
    assert "deployed already" in replay.json()["ignored"]
    for body, event in (
        (push_body("refs/heads/feature", second), "push"),
        (push_body("refs/heads/main", "0" * 40), "push"),
        (b'{"zen": "hi"}', "ping"),
    ):
        headers = {"X-Hub-Signature-256": sign(secret, body), "X-GitHub-Event": event}
        ignored = post(daemon, hook, content=body, headers=headers)
        assert ignored.status_code == 200 and ignored.json()["deployed"] is False, ignored.text
    assert [v["commit"] for v in versions(daemon, "git-hook")] == [first, second]

    # A pushed commit the repository does not have: an error naming the ref, nothing stored.
    body = push_body("refs/heads/main", "ab" * 20)
    missing = post(daemon, hook, content=body, headers={"X-Hub-Signature-256": sign(secret, body)})
    assert envelope(missing, 400, "GIT_SOURCE_INVALID")["details"]["field"] == "after"
    assert len(versions(daemon, "git-hook")) == 2

    # The list never shows the secret; a new secret retires the old one.
    listed_deploys = daemon.call("GET", f"/api/v2/workspaces/{ws}/git-deploys", daemon.admin_key)
    assert secret not in listed_deploys.text
    assert [g["appSlug"] for g in listed_deploys.json()["data"]] == ["git-hook"]
    renewed = daemon.call("PUT", path, daemon.admin_key, json={
        "repository": f"{url}/hooked", "path": "app", "newSecret": True}).json()  # fmt: skip
    body = push_body("refs/heads/main", second)
    old = post(daemon, hook, content=body, headers={"X-Hub-Signature-256": sign(secret, body)})
    envelope(old, 401)
    assert renewed["secret"] != secret
    gone = daemon.call("DELETE", path, daemon.admin_key)
    assert gone.status_code == 200, gone.text
    after = post(
        daemon, hook, content=body, headers={"X-Hub-Signature-256": sign(renewed["secret"], body)}
    )
    envelope(after, 401)
    envelope(daemon.call("DELETE", path, daemon.admin_key), 404, "GIT_DEPLOY_NOT_FOUND")


def test_a_git_deploy_names_the_bad_field(daemon: Daemon) -> None:
    path = f"/api/v2/workspaces/{daemon.workspace_id}/git-deploys/git-fields"
    for body, field in (
        ({"repository": "ftp://example.com/x.git"}, "repository"),
        ({"repository": "https://user:token@example.com/x.git"}, "repository"),
        ({"repository": "https://example.com/x.git", "ref": "--upload-pack=x"}, "ref"),
        ({"repository": "https://example.com/x.git", "path": "../up"}, "path"),
    ):
        answer = daemon.call("PUT", path, daemon.admin_key, json=body)
        assert envelope(answer, 400, "GIT_SOURCE_INVALID")["details"]["field"] == field, body
    listed = daemon.call("GET", f"/api/v2/workspaces/{daemon.workspace_id}/git-deploys",
                         daemon.admin_key).json()["data"]  # fmt: skip
    assert all(g["appSlug"] != "git-fields" for g in listed)
    # A slug no app can have (the manifest's rule): no Git deploy for it.
    upper_slug = f"/api/v2/workspaces/{daemon.workspace_id}/git-deploys/EVIL"
    envelope(
        daemon.call(
            "PUT", upper_slug, daemon.admin_key, json={"repository": "https://example.com/x.git"}
        ),
        400,
    )
    # A scheme in capitals is the scheme: kept as the daemon fetches it.
    upper = daemon.call(
        "PUT", path, daemon.admin_key, json={"repository": "HTTPS://example.com/x.git"}
    )
    assert upper.status_code == 200 and upper.json()["repository"] == "https://example.com/x.git"


def test_a_push_whose_manifest_is_another_app_is_refused(
    daemon: Daemon, served: tuple[Path, str]
) -> None:
    base, url = served
    repo = new_repo(base / "other", "not-this-app")
    commit = commit_all(repo, "one")
    ws = daemon.workspace_id
    made = daemon.call("PUT", f"/api/v2/workspaces/{ws}/git-deploys/git-this", daemon.admin_key,
                       json={"repository": f"{url}/other", "path": "app"}).json()  # fmt: skip
    body = push_body("refs/heads/main", commit)
    answer = post(
        daemon,
        f"/api/v2/apps/git-this/git-webhook?workspaceId={ws}",
        content=body,
        headers={"X-Hub-Signature-256": sign(made["secret"], body)},
    )
    problems = envelope(answer, 400, "BUNDLE_REJECTED")["details"]["problems"]
    assert "git-this" in problems[0]["message"]
    assert versions(daemon, "not-this-app") == [] and versions(daemon, "git-this") == []


def test_a_git_deploys_secret_outlives_a_secrets_key_rotation(
    daemon: Daemon, served: tuple[Path, str]
) -> None:
    """Its secret is sealed like the secrets: a rotation seals it again, under the new
    key, and pushes signed with the same secret go on deploying."""
    base, url = served
    repo = new_repo(base / "rotated", "git-rotated")
    commit = commit_all(repo, "one")
    ws = daemon.workspace_id
    secret = daemon.call("PUT", f"/api/v2/workspaces/{ws}/git-deploys/git-rotated",
                         daemon.admin_key, json={"repository": f"{url}/rotated",
                                                 "path": "app"}).json()["secret"]  # fmt: skip

    def sealed_kid() -> str:
        store = daemon.store()
        try:
            row = store.git_deploy(ws, "git-rotated")
        finally:
            store.close()
        assert row is not None and secret.encode() not in row.secret_sealed
        return row.secret_kid

    before = sealed_kid()
    rotated = run_cli("admin", "rotate-secrets-key", "--json", env=daemon.env)
    assert rotated.returncode == 0, rotated.stderr
    assert sealed_kid() != before
    body = push_body("refs/heads/main", commit)
    answer = post(daemon, f"/api/v2/apps/git-rotated/git-webhook?workspaceId={ws}",
                  content=body, headers={"X-Hub-Signature-256": sign(secret, body)})  # fmt: skip
    assert answer.status_code == 201, answer.text
    assert answer.json()["version"]["commit"] == commit


def _raw_push(d: Daemon, path: str, head: dict[str, str], first: bytes) -> tuple[bytes, float]:
    """A push whose head says 1,000 bytes of body and whose body stops after ``first``:
    what the daemon answers, and after how long."""
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{d.port}", "Content-Length: 1000",
             "Content-Type: application/json", *(f"{k}: {v}" for k, v in head.items())]  # fmt: skip
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", d.port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + first)
        answer = sock.recv(65536)
        took = time.monotonic() - started
        head, _, body = answer.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:"))  # fmt: skip
        while len(body) < length and (more := sock.recv(65536)):
            body += more
    return head + b"\r\n\r\n" + body, took


def test_a_push_is_refused_before_its_body_and_cut_when_it_drips(daemon: Daemon) -> None:
    ws = daemon.workspace_id
    made = daemon.call("PUT", f"/api/v2/workspaces/{ws}/git-deploys/drip", daemon.admin_key,
                       json={"repository": "http://127.0.0.1:9/none.git"})  # fmt: skip
    assert made.status_code == 200, made.text
    hook = f"/api/v2/apps/drip/git-webhook?workspaceId={ws}"
    # No signature, or no Git deploy: 401 at once, the body never read.
    for path, head in (
        (hook, {}),
        (hook.replace("/drip/", "/nodeploy/"), {"X-Hub-Signature-256": "sha256=00"}),
    ):
        answer, took = _raw_push(daemon, path, head, b"{")
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert took < 5, took
    # Signed, but the body drips (one byte, then nothing): cut at PUSH_BODY_TIMEOUT_S.
    answer, took = _raw_push(daemon, hook, {"X-Hub-Signature-256": "sha256=00"}, b"{")
    assert answer.startswith(b"HTTP/1.1 400") and b'"REQUEST_TIMEOUT"' in answer, answer
    assert limits.PUSH_BODY_TIMEOUT_S - 1 < took < limits.PUSH_BODY_TIMEOUT_S + 10, took


def test_no_git_deploy_of_another_workspaces_app(daemon: Daemon, tmp_path: Path) -> None:
    """An admin of another workspace cannot set a Git deploy for an app this workspace
    owns (its webhook would answer that app's versions by commit)."""
    daemon.ship(write_app(tmp_path / "owned", "owned-app", {"echo": "def run(i):\n    return i\n"}))
    store = daemon.store()
    try:
        rival = store.create_workspace("Rival").id
    finally:
        store.close()
    eve = daemon.person("eve-rival@example.com", role="admin", workspace_id=rival)
    refused = daemon.call("PUT", f"/api/v2/workspaces/{rival}/git-deploys/owned-app", eve,
                          json={"repository": "http://127.0.0.1:9/owned.git"})  # fmt: skip
    envelope(refused, 403, "APP_OWNED_BY_ANOTHER_WORKSPACE")
    listed = daemon.call("GET", f"/api/v2/workspaces/{rival}/git-deploys", eve)
    assert listed.json()["data"] == []
