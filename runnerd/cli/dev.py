"""``runnerd app dev DIR``: the app's pages from the local folder, shown in the Manage
page's frame, while its tools run as installed in the workspace (issue 26).

The command reads the manifest's ``pages`` folder with the checks of a deploy (no tool
file, source or manifest among the pages; a page file's and the folder's limits; the
entry present), finds the app's install in the workspace (a clear message when there is
none: dev pages call the installed version's tools), and PUTs the files to
``/api/v2/apps/installs/{id}/dev-pages`` of the node it talks to, which holds them in
memory for this person only (api/dev_pages.py). It prints the Manage page's address of
the dev frame, then watches the folder and the manifest: on a change it PUTs the files
again, and the open frame reloads. A problem an edit fixes (at the start as later) is
printed and watched, and the files are sent once it is gone. Ctrl-C (or SIGTERM) drops
them from the node and ends.
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
from runnerd.cli.output import printable, problem_line
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


def _read_doc(root: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest as a mapping, or why it cannot be used for dev pages (a line to
    print, the file named relative to the app folder)."""
    name = L.MANIFEST_NAME
    try:
        raw = read_manifest(root)
    except BundleRejected as exc:
        return None, f"{name}: {exc}"
    if raw is None:
        return None, f"{root / name}: no manifest: DIR is an app folder"
    try:
        doc = load_yaml(raw.decode())
    except (YAMLError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("slug"), str):
        return None, f"{name} names no slug (check it with runnerd app validate)"
    pages = doc.get("pages")
    if not isinstance(pages, str):
        return None, (
            f"{name} names no pages folder: add pages: ./web (a folder of HTML, scripts "
            "and styles) to show pages"
        )
    why = folder_problem(pages)
    if why is not None:
        return None, f"{name}: pages: {why}"
    return doc, None


def _manifest(root: Path) -> dict[str, Any]:
    """The manifest at the start: exits when it has no slug or no pages folder (the
    command has nothing to watch yet)."""
    doc, why = _read_doc(root)
    if doc is None:
        raise SystemExit(f"runnerd: {why}")
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


def _signature(root: Path, folder: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a file of the pages folder, or the manifest, does."""
    found = []
    count = 0
    for path in (root / L.MANIFEST_NAME, *folder.rglob("*")):
        count += 1
        if count > L.MAX_WALK_ENTRIES:
            break
        try:
            st = path.stat()
        except OSError:
            continue
        found.append((path.as_posix(), st.st_mtime_ns, st.st_size))
    return tuple(sorted(found))


def _install(client: ApiClient, workspace: str, slug: str, folder: str) -> dict[str, Any]:
    installs = client.call("GET", "/api/v2/apps/installs", query={"workspaceId": workspace})
    for install in installs["data"]:
        if install["appSlug"] == slug:
            return dict(install)
    raise SystemExit(
        f"runnerd: {slug} is not installed in the workspace {workspace}: in dev, the pages "
        "come from your folder but the tools run as installed, so deploy, publish and "
        f"install it first:\n"
        f"  runnerd app deploy {folder}   (it prints the version V)\n"
        f"  runnerd app publish --app {slug} --version V\n"
        f"  runnerd app install --app {slug} --version V"
    )


def _problem_line(p: Problem) -> str:
    return f"  {problem_line(p.file, p.line, p.message)}"


def cmd_dev(args: argparse.Namespace, client: ApiClient, workspace: str) -> int:
    """Send the pages, then watch the folder and the manifest until Ctrl-C or SIGTERM.
    Problems a file's edit can fix (a tool file among the pages, no entry page, a
    manifest that stops reading) are printed and watched, never an exit: the pages are
    sent once they are gone. It exits 1 only on what no edit of the folder fixes: no
    manifest, slug or pages folder at the start, the app not installed, a refusal of
    the key."""
    root = Path(args.dir)
    doc = _manifest(root)
    slug = str(doc["slug"])
    install = _install(client, workspace, slug, args.dir)
    install_id = str(install["installId"])
    path = f"/api/v2/apps/installs/{install_id}/dev-pages"
    shown = f"{clean_folder(doc['pages'])}/"
    said: list[str] = []  # the problems printed last, printed again only when they change

    def refused(lines: list[str], problems: list[Problem]) -> None:
        if lines == said:
            return
        said[:] = lines
        if args.json:
            found = [{"file": p.file, "line": p.line, "message": p.message} for p in problems]
            sys.stdout.write(json.dumps({"event": "problems", "problems": found}) + "\n")
            sys.stdout.flush()
            return
        _say("runnerd: the pages are not sent (fix these, the folder is watched):")
        for line in lines:
            _say(line)

    def put() -> dict[str, Any] | None:
        nonlocal doc
        now, why = _read_doc(root)
        if now is not None and now["slug"] != slug:
            why = f"{L.MANIFEST_NAME}: slug: {now['slug']} is not {slug}: restart runnerd app dev"
        if now is None or why is not None:
            problem = Problem(L.MANIFEST_NAME, str(why).removeprefix(f"{L.MANIFEST_NAME}: "))
            refused([f"  {why}"], [problem])
            return None
        doc = now
        pages, problems = read_dev_pages(root, doc)
        if problems:
            refused([_problem_line(p) for p in problems], problems)
            return None
        said.clear()
        body = {
            "entry": doc.get("entry") if isinstance(doc.get("entry"), str) else None,
            "files": {p: base64.b64encode(c).decode() for p, c in pages.items()},
        }
        if body["entry"] is None:
            del body["entry"]
        answer: dict[str, Any] = client.call("PUT", path, body=body)
        return answer

    def ready(answer: dict[str, Any]) -> None:
        if args.json:
            _event("ready", answer, install)
            return
        _say(
            f"runnerd: dev pages of {slug} from {shown} ({answer['files']} files) on "
            f"{client.base_url}\n"
            f"  open {answer['manageUrl']}\n"
            "  (in the Manage page, signed in as you: nobody else sees these pages)\n"
            f"  tools run {slug} {install['version']}, installed in {workspace}: "
            "deploy to change them\n"
            f"  watching {shown} for changes; Ctrl-C stops"
        )

    def folder() -> Path:
        return root / (clean_folder(doc["pages"]) or "")

    def stop(*_: Any) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        answer = put()  # an ApiFailure here (a refused key, a node that is gone) exits
        sent = answer is not None
        if answer is not None:
            ready(answer)
        seen = _signature(root, folder())
        sent_at = time.monotonic()
        while True:
            time.sleep(POLL_S)
            now_seen = _signature(root, folder())
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
            if not sent:
                sent = True
                ready(answer)
            elif args.json:
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
