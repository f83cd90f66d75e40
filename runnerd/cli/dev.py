"""``runnerd app dev DIR``: the app's pages from the local folder, shown in the Manage
page's frame, while its tools run as installed in the workspace (issue 26).

The command reads the manifest's ``pages`` folder with the checks of a deploy (no tool
file, source or manifest among the pages; a page file's and the folder's limits; the
entry present), finds the app's install in the workspace (a clear message when there is
none: dev pages call the installed version's tools), and PUTs the files to
``/api/v2/apps/installs/{id}/dev-pages`` of the node it talks to, which holds them in
memory for this person only (api/dev_pages.py). It prints the Manage page's address of
the dev frame, then watches the folder: on a change it PUTs the files again, and the
open frame reloads. Ctrl-C (or SIGTERM) drops them from the node and ends.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ruamel.yaml.error import YAMLError

from runnerd import limits as L
from runnerd.cli.http import ApiClient
from runnerd.cli.output import printable
from runnerd.errors import ApiFailure, BundleRejected
from runnerd.model import Problem
from runnerd.upload.pages import check_pages, clean_folder, folder_problem, not_pages_of
from runnerd.upload.walk import match_globs, read_app_dir, read_manifest
from runnerd.upload.yamlfile import load_yaml

__all__ = ["cmd_dev", "register_dev"]

POLL_S = L.DEV_POLL_S
REFRESH_S = L.DEV_REFRESH_S


class _Stop(Exception):
    pass


def _say(text: str) -> None:
    print(printable(text), file=sys.stderr, flush=True)


def _manifest(root: Path) -> dict[str, Any]:
    try:
        raw = read_manifest(root)
    except BundleRejected as exc:
        raise SystemExit(f"runnerd: {exc}") from None
    if raw is None:
        raise SystemExit(f"runnerd: {root / L.MANIFEST_NAME}: no manifest: DIR is an app folder")
    try:
        doc = load_yaml(raw.decode())
    except (YAMLError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("slug"), str):
        raise SystemExit(
            f"runnerd: {root / L.MANIFEST_NAME} names no slug (check it with runnerd app validate)"
        )
    pages = doc.get("pages")
    if not isinstance(pages, str):
        raise SystemExit(
            f"runnerd: {root / L.MANIFEST_NAME} names no pages folder: add pages: ./web "
            "(a folder of HTML, scripts and styles) to show pages"
        )
    why = folder_problem(pages)
    if why is not None:
        raise SystemExit(f"runnerd: {L.MANIFEST_NAME}: pages: {why}")
    return doc


def read_dev_pages(root: Path, doc: dict[str, Any]) -> tuple[dict[str, bytes], list[Problem]]:
    """The pages folder's files (paths relative to it) with a deploy's checks of them,
    and the problems found (no files are sent while there are any)."""
    try:
        files = read_app_dir(root)
    except BundleRejected as exc:  # a symlink leaving the folder, a folder too large
        return {}, list(exc.problems)
    globs = doc.get("tools")
    tools = (
        (globs,) if isinstance(globs, str) else tuple(g for g in globs or () if isinstance(g, str))
    )
    named = match_globs(tools, [p for p in files if p != L.MANIFEST_NAME])
    not_pages = not_pages_of(named, [p for p in named if p.endswith(L.TOOL_SUFFIX)])
    problems: list[Problem] = []
    entry = doc.get("entry")
    pages = check_pages(
        doc["pages"], entry if isinstance(entry, str) else None, files, not_pages, problems
    )
    return {p.path: p.content for p in pages}, problems


def _signature(folder: Path) -> tuple[tuple[str, int, int], ...]:
    found = []
    count = 0
    for path in folder.rglob("*"):
        count += 1
        if count > L.MAX_WALK_ENTRIES:
            break
        try:
            st = path.stat()
        except OSError:
            continue
        found.append((path.as_posix(), st.st_mtime_ns, st.st_size))
    return tuple(sorted(found))


def _install(client: ApiClient, workspace: str, slug: str) -> dict[str, Any]:
    installs = client.call("GET", "/api/v2/apps/installs", query={"workspaceId": workspace})
    for install in installs["data"]:
        if install["appSlug"] == slug:
            return dict(install)
    raise SystemExit(
        f"runnerd: {slug} is not installed in the workspace {workspace}: in dev, the pages "
        "come from your folder but the tools run as installed, so deploy and install it "
        f"first (runnerd app deploy, then runnerd app install --app {slug} --version V)"
    )


def cmd_dev(args: argparse.Namespace, client: ApiClient, workspace: str) -> int:
    root = Path(args.dir)
    doc = _manifest(root)
    slug = str(doc["slug"])
    install = _install(client, workspace, slug)
    install_id = str(install["installId"])
    path = f"/api/v2/apps/installs/{install_id}/dev-pages"
    folder = root / (clean_folder(doc["pages"]) or "")
    shown = f"{clean_folder(doc['pages'])}/"

    def put() -> dict[str, Any] | None:
        pages, problems = read_dev_pages(root, doc)
        if problems:
            _say("runnerd: the pages are not sent (fix these, the folder is watched):")
            for p in problems:
                _say(f"  {p.file}{f':{p.line}' if p.line else ''}: {p.message}")
            return None
        body = {
            "entry": doc.get("entry") if isinstance(doc.get("entry"), str) else None,
            "files": {p: base64.b64encode(c).decode() for p, c in pages.items()},
        }
        if body["entry"] is None:
            del body["entry"]
        answer: dict[str, Any] = client.call("PUT", path, body=body)
        return answer

    def stop(*_: Any) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        answer = put()
        if answer is None:
            return 1
        if args.json:
            _event("ready", answer, install)
        else:
            _say(
                f"runnerd: dev pages of {slug} from {shown} ({answer['files']} files) on "
                f"{client.base_url}\n"
                f"  open {answer['manageUrl']}\n"
                "  (in the Manage page, signed in as you: nobody else sees these pages)\n"
                f"  tools run {slug} {install['version']}, installed in {workspace}: "
                "deploy to change them\n"
                f"  watching {shown} for changes; Ctrl-C stops"
            )
        seen = _signature(folder)
        sent_at = time.monotonic()
        while True:
            time.sleep(POLL_S)
            now_seen = _signature(folder)
            if now_seen == seen and time.monotonic() - sent_at < REFRESH_S:
                continue
            changed = now_seen != seen
            seen = now_seen
            sent_at = time.monotonic()
            try:
                answer = put()
            except ApiFailure as exc:
                _say(f"runnerd: {exc.code}: {exc} (the folder is still watched)")
                continue
            if answer is None:
                continue
            if args.json:
                _event("reloaded" if changed else "refreshed", answer, install)
            elif changed:
                _say(f"runnerd: sent {answer['files']} files (revision {answer['revision']})")
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    with contextlib.suppress(ApiFailure):  # the node drops them an hour after the last PUT
        client.call("DELETE", path)
    if not args.json:
        _say("runnerd: dev pages dropped")
    return 0


def _event(kind: str, answer: dict[str, Any], install: dict[str, Any]) -> None:
    shown = {
        "event": kind,
        "installId": install["installId"],
        "version": install["version"],
        "manageUrl": answer["manageUrl"],
        "revision": answer["revision"],
        "files": answer["files"],
    }
    sys.stdout.write(json.dumps(shown) + "\n")
    sys.stdout.flush()


def register_dev(app: Any, common: argparse.ArgumentParser) -> None:
    """``runnerd app dev``."""
    from runnerd.cli.client import _failure  # the other client commands' error lines

    p = app.add_parser(
        "dev",
        parents=[common],
        help="show the app's pages from DIR in the Manage page, its tools as installed",
    )
    p.add_argument("dir", nargs="?", default=".", help="the app folder (default .)")
    p.add_argument("--url", help="the daemon ($RUNNERD_URL, default http://127.0.0.1:8686)")
    p.add_argument("--api-key", help="a personal API key ($RUNNERD_API_KEY)")
    p.add_argument("--workspace", help="workspace id ($RUNNERD_WORKSPACE)")

    def run(args: argparse.Namespace) -> int:
        url = args.url or os.environ.get("RUNNERD_URL") or "http://127.0.0.1:8686"
        client = ApiClient(url, args.api_key or os.environ.get("RUNNERD_API_KEY"))
        workspace = args.workspace or os.environ.get("RUNNERD_WORKSPACE")
        if not workspace:
            raise SystemExit("runnerd: no workspace: pass --workspace or set RUNNERD_WORKSPACE")
        try:
            return cmd_dev(args, client, workspace)
        except ApiFailure as exc:
            return _failure(args, exc)

    p.set_defaults(func=run)
