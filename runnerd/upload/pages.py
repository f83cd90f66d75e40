"""An app's pages: the files of the manifest's ``pages`` folder, read from an app folder
and checked in a bundle.

A deploy carries them in its bundle beside the tools (their paths relative to the
manifest, as every bundle file's are). The daemon serves them on its apps origin only
(runnerd/daemon/apps_origin.py), to a browser, so nothing of the tools may be among
them: no tool file, no source, nothing the ``tools`` globs name, not the manifest. The
walk follows a symlink only while it stays inside the pages folder (a link to a tool's
source elsewhere in the app would publish it), reads no more than a limit and a byte of
a file, and stops past the file-count limit.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Iterable, Mapping
from pathlib import Path

from runnerd import limits as L
from runnerd.model import Page, Problem

__all__ = [
    "check_pages",
    "clean_folder",
    "content_type",
    "folder_problem",
    "not_pages_of",
    "read_pages",
]

# The types a browser needs right (scripts, styles, documents, images, fonts); fixed here
# rather than read from the host's mime.types, so every node serves a file the same way.
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".cjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".webmanifest": "application/manifest+json",
    ".txt": "text/plain; charset=utf-8",
    ".md": "text/plain; charset=utf-8",
    ".csv": "text/csv; charset=utf-8",
    ".xml": "application/xml",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".avif": "image/avif",
    ".ico": "image/x-icon",
    ".bmp": "image/bmp",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
    ".ttf": "font/ttf",
    ".otf": "font/otf",
    ".wasm": "application/wasm",
    ".pdf": "application/pdf",
    ".mp3": "audio/mpeg",
    ".wav": "audio/wav",
    ".ogg": "audio/ogg",
    ".mp4": "video/mp4",
    ".webm": "video/webm",
}
_UNKNOWN_TYPE = "application/octet-stream"


def content_type(path: str) -> str:
    """The Content-Type a page file is served with, from its name; a name of no known
    type is served as bytes (nosniff keeps a browser from guessing)."""
    return _TYPES.get(posixpath.splitext(path)[1].lower(), _UNKNOWN_TYPE)


def clean_folder(value: str) -> str | None:
    """The pages folder relative to the manifest ("dist", "web/build"), or None when it
    reaches outside the app folder; "" for the app folder itself."""
    while value.startswith("./"):
        value = value[2:]
    value = value.rstrip("/")
    if value.startswith("/") or "\\" in value or "\0" in value:
        return None
    segments = [s for s in value.split("/") if s not in ("", ".")]
    if ".." in segments:
        return None
    return "/".join(segments)


def folder_problem(value: str) -> str | None:
    """Why ``value`` cannot be the manifest's ``pages`` folder, or None."""
    folder = clean_folder(value)
    if folder is None:
        return f"the folder {value!r} reaches outside the app folder"
    if folder == "":
        return (
            "name a folder inside the app (such as ./dist), not the app folder itself: "
            "its files are served to browsers, and the manifest and tools must not be"
        )
    return None


def _entry_problem(entry: str) -> str | None:
    if entry.startswith("/") or "\\" in entry or "\0" in entry:
        return f"entry: {entry!r} is a path inside the pages folder, relative to it"
    if any(seg in ("", ".", "..") for seg in entry.split("/")):
        return f"entry: {entry!r} has an empty, '.' or '..' segment"
    return None


# --- Reading the folder ---------------------------------------------------------------------


def read_pages(root: Path, value: str) -> tuple[dict[str, bytes], list[Problem]]:
    """The files of the pages folder ``value`` of the app in ``root`` (paths relative to
    ``root``), each read up to its limit and a byte (so an oversized one is reported, not
    loaded), and the problems found: a symlink leaving the pages folder (or broken), a
    missing folder. Stops past MAX_PAGE_FILES (the bundle check names the count)."""
    folder = clean_folder(value)
    if folder is None or folder == "":
        return {}, []  # the manifest's check names it
    base = root / folder
    shown = f"{folder}/"
    if base.is_file():
        return {}, [
            Problem(
                L.MANIFEST_NAME,
                f"pages: {folder} is a file, not a folder: name the folder holding the pages "
                "(such as ./web)",
            )
        ]
    if not base.is_dir():
        return {}, [Problem(shown, "is the manifest's pages folder, and there is no such folder")]
    real_root = root.resolve()
    real_base = base.resolve()
    problems: list[Problem] = []
    if real_base != real_root / folder:
        # Through a link, the folder would serve another folder's files (a tool's source)
        # under its own names: the pages folder is a real folder of the app.
        return {}, [
            Problem(
                shown,
                "is the pages folder, and it (or a folder on its way) is a symlink; name "
                "the real folder in pages:",
            )
        ]
    files: dict[str, bytes] = {}
    stack = [base]
    visited = {real_base}
    seen = 0
    while stack:
        current = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            seen += 1
            path = Path(entry.path)
            rel = path.relative_to(root).as_posix()
            if seen > L.MAX_WALK_ENTRIES or len(files) > L.MAX_PAGE_FILES:
                return files, problems
            if entry.is_symlink():
                try:
                    real = path.resolve(strict=True)
                except (OSError, RuntimeError):
                    problems.append(Problem(rel, "is a broken symlink (or a symlink loop)"))
                    continue
                if real != real_base and real_base not in real.parents:
                    problems.append(
                        Problem(
                            rel,
                            "is a symlink to a place outside the pages folder; pages are "
                            "served to browsers, so runnerd reads nothing outside it: copy "
                            "the file in, or point the link inside",
                        )
                    )
                    continue
            if entry.is_dir():
                real = path.resolve()
                if real not in visited:
                    visited.add(real)
                    stack.append(path)
            elif entry.is_file():
                with path.open("rb") as f:
                    files[rel] = f.read(L.MAX_PAGE_BYTES + 1)
    return files, problems


# --- Checking them in a bundle --------------------------------------------------------------


def not_pages_of(named: Iterable[str], tool_files: Iterable[str]) -> dict[str, str]:
    """The paths of a bundle that may never be pages, each with what it is: what the
    ``tools`` globs name (``named``), the tool files and their sources, the manifest."""
    tool_files = list(tool_files)
    stems = {p[: -len(L.TOOL_SUFFIX)] for p in tool_files}
    not_pages = {p: "named by the manifest's tools globs" for p in named}
    not_pages.update({p: "a tool file" for p in tool_files})
    not_pages.update({s + ext: "a tool's source" for s in stems for ext in L.SOURCE_LANGUAGES})
    not_pages[L.MANIFEST_NAME] = "the manifest"
    return not_pages


def check_pages(
    folder_value: str,
    entry: str | None,
    files: Mapping[str, bytes],
    not_pages: Mapping[str, str],
    problems: list[Problem],
) -> tuple[Page, ...]:
    """The pages of a bundle: its files under the pages folder ``folder_value``.
    ``not_pages``: paths that may not be pages, each with what it is (the manifest, tool
    files, sources, what the ``tools`` globs name). Every problem is added to
    ``problems``, naming the file: one of ``not_pages``, a file over MAX_PAGE_BYTES, too
    many files or bytes (naming the folder), an entry that is not among them."""
    folder = clean_folder(folder_value)
    if folder is None or folder == "":
        return ()  # the manifest's check names it
    prefix = folder + "/"
    shown = prefix
    paths = sorted(p for p in files if p.startswith(prefix))
    if not paths:
        problems.append(
            Problem(L.MANIFEST_NAME, f"pages: the folder {shown} holds no file (build it first)")
        )
        return ()
    found = []
    total = 0
    for path in paths:
        what = not_pages.get(path)
        if what is None and path.lower().endswith(L.TOOL_SUFFIX):  # X.TOOL.YAML too
            what = "a tool file"
        if what is None and posixpath.basename(path).lower() == L.MANIFEST_NAME:
            what = "a manifest (a copy of one is not a page either)"
        if what is not None:
            problems.append(
                Problem(
                    path,
                    f"is {what}, and it is in the pages folder {shown}; pages are served "
                    "to browsers, so no tool file or source may be among them: move it "
                    "out of the folder",
                )
            )
            continue
        data = files[path]
        total += len(data)
        if len(data) > L.MAX_PAGE_BYTES:
            problems.append(
                Problem(path, f"is larger than {L.MAX_PAGE_BYTES // L.MB} MB, a page file's limit")
            )
            continue
        found.append((path[len(prefix) :], data))
    if len(paths) > L.MAX_PAGE_FILES:
        problems.append(
            Problem(
                shown,
                f"the pages folder holds {len(paths):,} files or more; at most "
                f"{L.MAX_PAGE_FILES:,}",
            )
        )
    if total > L.MAX_PAGES_BYTES:
        problems.append(
            Problem(
                shown,
                f"the pages folder's files come to more than {L.MAX_PAGES_BYTES // L.MB} MB "
                "together, the limit of an app's pages",
            )
        )
    page_entry = entry if entry is not None else L.DEFAULT_PAGE_ENTRY
    why = _entry_problem(page_entry)
    if why is not None:
        problems.append(Problem(L.MANIFEST_NAME, why))
    elif prefix + page_entry not in files:
        problems.append(
            Problem(
                L.MANIFEST_NAME,
                f"entry: the pages folder {shown} has no {page_entry}"
                + ("" if entry is not None else " (the entry when none is named)"),
            )
        )
    return tuple(
        Page(
            path=rel,
            content=data,
            content_type=content_type(rel),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        for rel, data in found
    )
