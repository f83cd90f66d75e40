"""``runnerd app dev DIR`` as a builder meets it on the command line: a problem an edit
of the folder fixes is watched, never an exit, at the start as later; what no edit
fixes (the app not installed) exits, saying the commands that fix it."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import AppDir, tool_doc
from daemon import Daemon

pytestmark = pytest.mark.jail

INPUT = {"type": "object", "properties": {"text": {"type": "string"}}}
ECHO = "def run(i):\n    return i\n"


def _app(root: Path, slug: str) -> AppDir:
    app = AppDir(root)
    app.write(
        "agentserve.app.yaml", f"slug: {slug}\nname: {slug}\ntools: ./tools/*\npages: ./web\n"
    )
    app.tool("echo", yaml=tool_doc("echo", input=INPUT), source=ECHO)
    app.write("web/index.html", "<!doctype html><h1>Dev CLI</h1>")
    return app


class _Dev:
    """``runnerd app dev`` in its own process; its stdout and stderr lines as they come
    (read by threads: a buffered pipe holds lines a select() would not see)."""

    def __init__(self, daemon: Daemon, folder: Path, *flags: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runnerd", "app", "dev", str(folder), *flags],
            env=daemon.client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.out: queue.Queue[str] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, lines), daemon=True).start()

    @staticmethod
    def _read(stream: Any, lines: queue.Queue[str]) -> None:
        for line in stream:
            lines.put(line)

    def line(self, lines: queue.Queue[str], within_s: float = 20) -> str:
        try:
            return lines.get(timeout=within_s)
        except queue.Empty:
            raise AssertionError(
                f"runnerd app dev said nothing (exit {self.proc.poll()})"
            ) from None


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _dev_pages(daemon: Daemon, install_id: str) -> httpx.Response:
    return daemon.call("GET", f"/api/v2/apps/installs/{install_id}/dev-pages", daemon.admin_key)


def test_a_problem_present_at_the_start_is_watched_and_the_pages_go_once_it_is_fixed(
    daemon: Daemon, tmp_path: Path
) -> None:
    app = _app(tmp_path, "dev-cli-start")
    install = daemon.ship(tmp_path)
    app.write("web/echo.tool.yaml", tool_doc("echo", input=INPUT))  # a tool file among pages
    dev = _Dev(daemon, tmp_path, "--json")
    try:
        problems = json.loads(dev.line(dev.out))
        assert problems["event"] == "problems"
        [problem] = problems["problems"]
        assert problem["file"] == "web/echo.tool.yaml"
        assert "is a tool file" in problem["message"]
        time.sleep(1.5)  # several looks at the folder later, still watching, nothing sent
        assert dev.proc.poll() is None
        assert _dev_pages(daemon, install["installId"]).status_code == 404
        (tmp_path / "web" / "echo.tool.yaml").unlink()
        ready = json.loads(dev.line(dev.out))
        assert ready["event"] == "ready" and ready["files"] == 1
        assert _dev_pages(daemon, install["installId"]).status_code == 200
    finally:
        assert _stop(dev.proc) == 0
    assert _dev_pages(daemon, install["installId"]).status_code == 404


def test_the_text_form_names_the_problem_relative_to_the_folder_and_keeps_watching(
    daemon: Daemon, tmp_path: Path
) -> None:
    app = _app(tmp_path, "dev-cli-text")
    install = daemon.ship(tmp_path)
    (tmp_path / "web" / "index.html").unlink()
    app.write("web/main.html", "<p>not the entry</p>")
    dev = _Dev(daemon, tmp_path)
    try:
        assert "the pages are not sent (fix these, the folder is watched)" in dev.line(dev.err)
        assert dev.line(dev.err).startswith(
            "  agentserve.app.yaml: entry: the pages folder web/ has no index.html"
        )
        time.sleep(1)
        assert dev.proc.poll() is None
        app.write("web/index.html", "<!doctype html><h1>Back</h1>")
        assert "runnerd: dev pages of dev-cli-text from web/ (2 files)" in dev.line(dev.err)
        assert _dev_pages(daemon, install["installId"]).status_code == 200
    finally:
        assert _stop(dev.proc) == 0


def test_an_app_not_installed_exits_with_the_deploy_publish_and_install_commands(
    daemon: Daemon, tmp_path: Path
) -> None:
    _app(tmp_path, "dev-cli-nowhere")
    done = subprocess.run(
        [sys.executable, "-m", "runnerd", "app", "dev", str(tmp_path)],
        env=daemon.client_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "dev-cli-nowhere is not installed in the workspace" in done.stderr
    assert f"runnerd app deploy {tmp_path}" in done.stderr
    assert "runnerd app publish --app dev-cli-nowhere --version V" in done.stderr
    assert "runnerd app install --app dev-cli-nowhere --version V" in done.stderr
