"""A real runnerd daemon for tests: `runnerd serve` in a subprocess on a free port, its own
data dir, and helpers to add people and keys to it (``Runnerd``, which the in-process app
of tests/inproc.py shares)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from conftest import RUNNERD
from runnerd.store import Store
from runnerd.upload.walk import read_app_dir


def envelope(response: httpx.Response, status: int, reason: str | None = None) -> dict[str, Any]:
    """Assert ``response`` is the seed 003 error envelope with this status (and the code
    that goes with it) and, when given, this details.code; return the error object."""
    from runnerd.api.errors import CODES

    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"])
    assert body["error"]["code"] == next(c for c, (s, _) in CODES.items() if s == status)
    if reason is not None:
        assert body["error"]["details"]["code"] == reason, body
    return dict(body["error"])


def concurrently(count: int, call: Callable[[], httpx.Response]) -> list[httpx.Response]:
    """``call`` made ``count`` times at once, from as many threads; the responses."""
    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(call())) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Runnerd:
    """What a test holds of one runnerd: its data dir, the workspace and admin key it was
    bootstrapped with, an HTTP client (``http``, and ``client()`` for more), and helpers
    that add people and keys through its store and deploy, ship and run apps over its
    API. A ``Daemon`` is one in a process of its own; ``inproc.InProcess`` is its app in
    this process."""

    def __init__(
        self,
        data_dir: Path,
        url: str,
        workspace_id: str,
        admin_key: str,
        env: dict[str, str],
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.url = url
        self.workspace_id = workspace_id
        self.admin_key = admin_key
        self.env = env  # what a local ``runnerd`` command needs to use its data dir
        self._transport = transport
        self.http = self.client()
        self._bound: dict[tuple[str, str], str] = {}  # (key, surface) -> its bound token

    def client(self, **kw: Any) -> httpx.Client:
        """A new HTTP client of this runnerd with cookies of its own (a second browser,
        another caller); ``kw`` as httpx.Client takes them."""
        return httpx.Client(base_url=self.url, timeout=60, transport=self._transport, **kw)

    def fresh(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request from a new client of its own: no cookie of another request."""
        with self.client() as client:
            return client.request(method, path, **kw)

    def store(self) -> Store:
        url = self.env.get("RUNNERD_DATABASE_URL")
        # The daemon's audit key (in its data dir): what this store appends verifies.
        return Store(url, audit_dir=self.data_dir) if url else Store.in_data_dir(self.data_dir)

    def person(
        self,
        email: str,
        *,
        role: str = "member",
        apps_access: bool = True,
        workspace_id: str | None = None,
    ) -> str:
        """Add a person and return a personal key of theirs."""
        store = self.store()
        try:
            user = store.ensure_user(email)
            store.set_membership(
                workspace_id or self.workspace_id, user.id, role=role, apps_access=apps_access
            )
            return store.create_key(kind="personal", user_id=user.id)[1]
        finally:
            store.close()

    def key(self, **kw: Any) -> str:
        store = self.store()
        try:
            return store.create_key(**kw)[1]
        finally:
            store.close()

    def bound_token(self, key: str, surface: str) -> str:
        """A token of ``key``'s person bound to ``surface`` (relay, workflow, chat; made
        once, through the store): the credential that proves that surface, as a run's body
        no longer can (api/surfaces.py)."""
        if (key, surface) not in self._bound:
            store = self.store()
            try:
                found = store.find_key(key)
                assert found is not None and found.user_id is not None, "a person's key"
                self._bound[key, surface] = store.create_key(
                    kind="token", user_id=found.user_id, scopes=("api:read", "tools:run"),
                    name=f"{surface} token", surface=surface,
                )[1]  # fmt: skip
            finally:
                store.close()
        return self._bound[key, surface]

    def call(
        self,
        method: str,
        path: str,
        key: str | None = None,
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> httpx.Response:
        merged = {**(headers or {}), **({"X-API-Key": key} if key else {})}
        return self.http.request(method, path, headers=merged, **kw)

    def ended_run(self, run_id: str, key: str | None = None, within_s: float = 10) -> Any:
        """GET /api/v2/runs/{id} until the run is no longer running (or ``within_s``
        passes); the last answer."""
        deadline = time.monotonic() + within_s
        while True:
            detail = self.call("GET", f"/api/v2/runs/{run_id}", key or self.admin_key).json()
            if detail["run"]["status"] != "running" or time.monotonic() > deadline:
                return detail
            time.sleep(0.05)

    def deploy(self, app_dir: Path, key: str | None = None) -> httpx.Response:
        files = {p: base64.b64encode(d).decode() for p, d in read_app_dir(app_dir).items()}
        return self.call(
            "POST",
            "/api/v2/apps/deploy",
            key or self.admin_key,
            params={"workspaceId": self.workspace_id},
            json={"files": files},
        )

    def ship(self, app_dir: Path) -> dict[str, Any]:
        """Deploy, publish and install an app; return the install."""
        version = self.deploy(app_dir).json()["version"]
        self.call(
            "POST",
            f"/api/v2/apps/{version['appSlug']}/versions/{version['version']}/publish",
            self.admin_key,
            params={"workspaceId": self.workspace_id},
        )
        response = self.call(
            "POST",
            "/api/v2/apps/installs",
            self.admin_key,
            params={"workspaceId": self.workspace_id},
            json={"appSlug": version["appSlug"], "version": version["version"]},
        )
        assert response.status_code == 201, response.text
        install: dict[str, Any] = response.json()
        return install

    def run(
        self, install_id: str, tool: str, value: Any, key: str | None = None, **body: Any
    ) -> httpx.Response:
        """Run a tool with ``key`` (the admin's by default). A ``surface`` of relay,
        workflow or chat is made with ``key``'s person's token bound to it
        (``bound_token``), the credential that proves it; any other is the body's claim."""
        key = key or self.admin_key
        if body.get("surface") in ("relay", "workflow", "chat"):
            key = self.bound_token(key, body["surface"])
        return self.call(
            "POST",
            f"/api/v2/apps/installs/{install_id}/tools/{tool}/run",
            key,
            json={"input": value, **body},
        )


class Daemon(Runnerd):
    """A ``runnerd serve`` of the tests' own, in its process (``proc``) on a free port."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        proc: subprocess.Popen[bytes],
        workspace_id: str,
        admin_key: str,
        env: dict[str, str],
    ) -> None:
        super().__init__(data_dir, f"http://127.0.0.1:{port}", workspace_id, admin_key, env)
        self.port = port
        self.proc = proc

    def client_env(self, key: str | None = None) -> dict[str, str]:
        """The variables of a ``runnerd`` client command talking to this daemon."""
        return {
            **self.env,
            "RUNNERD_URL": self.url,
            "RUNNERD_API_KEY": key or self.admin_key,
            "RUNNERD_WORKSPACE": self.workspace_id,
        }


def new_data_dir() -> Path:
    """A data dir under /tmp, not pytest's 0700 tmp folder: jails' uids must be able to
    enter it (o+x). The caller removes it."""
    data = Path(tempfile.mkdtemp(prefix="runnerd-daemon-", dir="/tmp"))
    data.chmod(0o711)
    return data


def runnerd_env(data_dir: Path, toolchain_dir: Path, settings: Mapping[str, str]) -> dict[str, str]:
    """The environment of a runnerd on ``data_dir``: this process's, the tests' toolchain
    and sandbox uids, and ``settings`` (setting name -> value) as RUNNERD_* variables."""
    return {
        **os.environ,
        "RUNNERD_DATA_DIR": str(data_dir),
        "RUNNERD_TOOLCHAIN_DIR": str(toolchain_dir),
        "RUNNERD_SANDBOX_UID_BASE": "620000",
        "RUNNERD_SANDBOX_UID_COUNT": "64",
        **{f"RUNNERD_{k.upper()}": v for k, v in settings.items()},
    }


@contextmanager
def running_daemon(
    toolchain_dir: Path,
    wrap: Callable[[list[str]], list[str]] | None = None,
    join: Daemon | None = None,
    **settings: str,
) -> Iterator[Daemon]:
    """``runnerd serve`` with these settings (``wrap``: the command line in a wrapper,
    such as the egress lab's hosts file). ``join``: another node on the same database
    (the same database_url and secrets key), its workspace and admin key; nothing is
    bootstrapped."""
    data = new_data_dir()
    port = free_port()
    # The apps origin's port (daemon/apps_origin.py): a free one, not port + 1 by chance.
    apps_port = next(p for p in iter(free_port, None) if p != port)
    env = runnerd_env(data, toolchain_dir, {"apps_port": str(apps_port), **settings})
    if join is not None:
        env.update({k: v for k, v in join.env.items()
                    if k in ("RUNNERD_DATABASE_URL", "RUNNERD_SECRETS_KEY")})  # fmt: skip
        boot = {"workspaceId": join.workspace_id, "apiKey": join.admin_key}
    else:
        if "RUNNERD_DATABASE_URL" in env:  # a new PostgreSQL database: its schema first
            subprocess.run([RUNNERD, "admin", "migrate"], env=env, check=True,
                           capture_output=True)  # fmt: skip
        boot = json.loads(
            subprocess.run(
                [RUNNERD, "admin", "bootstrap", "--data-dir", str(data),
                 "--workspace", "Acme", "--email", "ada@example.com"],
                capture_output=True, text=True, env=env, check=True,
            ).stdout
        )  # fmt: skip
    log = open(data / "serve.log", "wb")  # noqa: SIM115 - closed below
    argv = [RUNNERD, "serve", "--port", str(port)]
    proc = subprocess.Popen(
        wrap(argv) if wrap else argv, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    daemon = None
    try:
        daemon = Daemon(data, port, proc, boot["workspaceId"], boot["apiKey"], env)
        deadline = time.monotonic() + 30
        while True:
            try:
                if daemon.http.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((data / "serve.log").read_text())
            time.sleep(0.05)
        yield daemon
    finally:
        # A wrapper (faketime) may not pass a signal on: its runnerd is stopped itself.
        served = _descendants(proc.pid) if wrap else []
        for pid in served:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        _reaped(served)
        log.close()
        if daemon is not None:
            daemon.http.close()
        shutil.rmtree(data, ignore_errors=True)


@contextmanager
def running_nodes(
    toolchain_dir: Path, database_url: str, count: int = 2, **settings: str
) -> Iterator[list[Daemon]]:
    """``count`` nodes of one cluster on the PostgreSQL ``database_url``: one secrets key,
    the first migrating and bootstrapping it, the others joining it; all stopped on the
    way out, the last first."""
    key = base64.b64encode(os.urandom(32)).decode()
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(
            running_daemon(toolchain_dir, database_url=database_url, secrets_key=key, **settings)
        )
        others = [
            stack.enter_context(running_daemon(toolchain_dir, join=first, **settings))
            for _ in range(count - 1)
        ]
        yield [first, *others]


def wait_until(check: Callable[[], Any], within_s: float, what: str, every_s: float = 0.02) -> None:
    """Poll ``check`` until it is true; AssertionError naming ``what`` after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s} s: {what}")
        time.sleep(every_s)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, nearest first."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop(0)
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                todo += children
    return found


def _reaped(pids: list[int], within_s: float = 20) -> None:
    """Wait for ``pids`` (not our children: polled) to be gone; SIGKILL what is left."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextmanager
def serving_again(daemon: Daemon) -> Iterator[subprocess.Popen[bytes]]:
    """``runnerd serve`` again on ``daemon``'s data dir, settings and port, once its own
    process has ended; stopped on the way out."""
    proc = subprocess.Popen(
        [RUNNERD, "serve", "--port", str(daemon.port)],
        env=daemon.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if daemon.http.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)


_PROBE = r"""
import http.client, json, sys, threading, time
conn = http.client.HTTPConnection('127.0.0.1', int(sys.argv[1]), timeout=30)
worst, count, stop = 0.0, 0, threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print('ready', flush=True)
while not stop.is_set():
    started = time.perf_counter()
    conn.request('GET', '/healthz')
    conn.getresponse().read()
    worst = max(worst, (time.perf_counter() - started) * 1000)
    count += 1
    time.sleep(0.005)
print(json.dumps({'worstMs': worst, 'probes': count}), flush=True)
"""


class HealthProbe:
    """GET /healthz every 5 ms from a process of its own (the test process is busy
    attacking), over one keep-alive connection; ``worst_ms`` is the slowest answer."""

    def __init__(self, daemon: Daemon) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE, str(daemon.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        self.worst_ms = 0.0
        self.probes = 0

    def __enter__(self) -> HealthProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self.proc.communicate("", timeout=60)
        found = json.loads(out.strip().splitlines()[-1])
        self.worst_ms, self.probes = found["worstMs"], found["probes"]
        WORST_HEALTH_MS.append((self.worst_ms, self.probes))


# Every probe's worst answer in this test session (the closing note reports the worst).
WORST_HEALTH_MS: list[tuple[float, int]] = []
