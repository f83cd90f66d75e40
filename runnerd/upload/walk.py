"""Reading an app folder: the manifest, the files its ``tools`` globs name, and the
source beside each tool file, as the bundle (path -> bytes) that a deploy uploads.

The walk follows a symlink only while it stays inside the folder, reads no more than a
limit and a byte of any file, and visits only the folders where a glob can still match.
The globs are matched one path segment at a time on RE2, so no pattern can backtrack.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import re2
from ruamel.yaml.error import YAMLError

from runnerd import limits as L
from runnerd.checks.patterns import PatternError, compile_pattern
from runnerd.errors import BundleRejected
from runnerd.model import Problem
from runnerd.upload.pages import read_pages
from runnerd.upload.yamlfile import load_yaml

__all__ = [
    "glob_problem",
    "match_globs",
    "path_problems",
    "read_app_dir",
    "read_manifest",
    "read_tool_files",
]


class _Glob:
    """A glob matched one path segment at a time, each segment on RE2: ``*`` and ``?``
    stay in one folder, ``[...]`` is a class (``[!...]`` negated), a ``**`` segment spans
    any number of folders. Linear in the path: nothing can make it backtrack."""

    def __init__(self, pattern: str) -> None:
        self.segments = [None if seg == "**" else _segment(seg) for seg in pattern.split("/")]

    def closure(self, states: set[int]) -> set[int]:
        """``states`` plus the positions reached by letting ``**`` match no folder."""
        out, todo = set(states), list(states)
        while todo:
            i = todo.pop()
            if i < len(self.segments) and self.segments[i] is None and i + 1 not in out:
                out.add(i + 1)
                todo.append(i + 1)
        return out

    def step(self, states: set[int], name: str) -> set[int]:
        """The positions after one more path segment, ``name``."""
        out = set()
        for i in self.closure(states):
            if i < len(self.segments):
                segment = self.segments[i]
                if segment is None:
                    out.add(i)
                elif segment.fullmatch(name):
                    out.add(i + 1)
        return out

    def done(self, states: set[int]) -> bool:
        return len(self.segments) in self.closure(states)


def _segment(text: str) -> Any:
    """One path segment of a glob as an RE2 pattern; GlobError when it is not a glob."""
    out, i = "", 0
    while i < len(text):
        char = text[i]
        if char == "*":
            out, i = out + ".*", i + 1
        elif char == "?":
            out, i = out + ".", i + 1
        elif char == "[" and (end := text.find("]", i + 2)) != -1:
            body = text[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            escaped = "".join(c if c == "-" else re2.escape(c) for c in body)
            out, i = out + f"[{'^' if negate else ''}{escaped}]", end + 1
        else:
            out, i = out + re2.escape(char), i + 1
    try:
        return compile_pattern(f"(?s){out}")
    except PatternError:
        raise GlobError(f"{text!r} is not a usable glob (a character class is malformed)") from None


class GlobError(ValueError):
    """A glob that cannot be matched (a malformed character class)."""


def _clean_glob(pattern: str) -> str | None:
    """The glob relative to the manifest folder, or None if it reaches outside it."""
    while pattern.startswith("./"):
        pattern = pattern[2:]
    if pattern.startswith("/") or ".." in pattern.split("/"):
        return None
    if pattern.endswith("/"):
        pattern += "*"
    return pattern


def glob_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a glob of the manifest's ``tools``, or None: it reaches
    outside the app folder, or it is malformed."""
    clean = _clean_glob(pattern)
    if clean is None:
        return f"the glob {pattern!r} reaches outside the app folder"
    try:
        _Glob(clean)
    except GlobError as exc:
        return str(exc)
    return None


def _globs(patterns: tuple[str, ...]) -> list[_Glob]:
    found = []
    for pattern in patterns:
        clean = _clean_glob(pattern)
        if clean:
            with contextlib.suppress(GlobError):  # reported by the manifest's checks
                found.append(_Glob(clean))
    return found


def match_globs(globs: tuple[str, ...], paths: list[str]) -> list[str]:
    """The paths (POSIX, relative to the manifest) that any of ``globs`` names, sorted."""
    compiled = _globs(globs)
    named = []
    for path in paths:
        for glob in compiled:
            states = {0}
            for name in path.split("/"):
                states = glob.step(states, name)
                if not states:
                    break
            if glob.done(states):
                named.append(path)
                break
    return sorted(named)


def path_problems(paths: Iterable[str]) -> list[Problem]:
    """A problem for each of ``paths`` that cannot be a file of a bundle (see _path_problem),
    naming the path as printable text."""
    return [Problem(_shown_path(path), why) for path in paths if (why := _path_problem(path))]


def _shown_path(path: str) -> str:
    shown = repr(path)[1:-1]
    return shown if len(shown) <= 120 else shown[:117] + "..."


def _path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a file of a bundle, or None. Bundles hold plain relative
    POSIX paths: no absolute path, no empty, ``.`` or ``..`` segment, no NUL."""
    if not path or len(path) > L.MAX_PATH_CHARS:
        return f"a path is 1 to {L.MAX_PATH_CHARS:,} characters"
    if "\0" in path:
        return "a path holds no NUL character"
    if path.startswith("/"):
        return "a path is relative to the app folder, not absolute"
    if any(seg in ("", ".", "..") for seg in path.split("/")):
        return "a path has no empty, '.' or '..' segment"
    return None


class _Walk:
    """A walk of an app folder that follows a symlink only while it stays inside the
    folder; a link out of it, or a broken one, is a problem naming the link."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.real_root = root.resolve()
        self.problems: list[Problem] = []
        self.seen = 0

    def inside(self, path: Path) -> Path | None:
        """The real path of ``path`` if it is inside the app folder (through whatever
        links), else None and a problem naming it."""
        rel = path.relative_to(self.root).as_posix()
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            self.problems.append(Problem(rel, "is a broken symlink (or a symlink loop)"))
            return None
        if real != self.real_root and self.real_root not in real.parents:
            self.problems.append(
                Problem(
                    rel,
                    "is a symlink to a place outside the app folder; runnerd reads nothing "
                    "outside it: copy the file in, or point the link inside",
                )
            )
            return None
        return real

    def files(self, globs: list[_Glob]) -> list[str]:
        """The files (relative POSIX paths) under the root that ``globs`` may name,
        visiting only the folders where a glob can still match."""
        found: list[str] = []
        stack: list[tuple[Path, list[set[int]]]] = [(self.root, [{0} for _ in globs])]
        visited = {self.real_root}
        while stack:
            folder, states = stack.pop()
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                self.seen += 1
                if self.seen > L.MAX_WALK_ENTRIES:
                    raise BundleRejected(
                        [
                            Problem(
                                L.MANIFEST_NAME,
                                f"tools: the globs lead through more than {L.MAX_WALK_ENTRIES:,} "
                                "files and folders; name the tool files more precisely",
                            )
                        ]
                    )
                after = [g.step(st, entry.name) for g, st in zip(globs, states, strict=True)]
                if not any(after):
                    continue
                path = Path(entry.path)
                if entry.is_symlink() and self.inside(path) is None:
                    continue
                if entry.is_dir():  # follows a link, which is inside by now
                    real = path.resolve()
                    if real not in visited:  # a link back up would loop
                        visited.add(real)
                        stack.append((path, after))
                elif any(g.done(st) for g, st in zip(globs, after, strict=True)):
                    found.append(path.relative_to(self.root).as_posix())
        return found

    def read(self, rel: str) -> bytes | None:
        """The file ``rel``, up to its limit and a byte (so an oversized file is reported,
        not loaded), or None when it, or a folder on its way, is a link out of the app
        folder (a problem)."""
        real = self.inside(self.root / rel)
        if real is None:
            return None
        if rel == L.MANIFEST_NAME:
            limit = L.MAX_MANIFEST_BYTES
        else:
            limit = L.MAX_TOOL_YAML_BYTES if rel.endswith(L.TOOL_SUFFIX) else L.MAX_SOURCE_BYTES
        with real.open("rb") as f:
            return f.read(limit + 1)


def read_manifest(root: Path) -> bytes | None:
    """The manifest of the app in ``root`` (capped), None when there is none; raises
    BundleRejected when it is a symlink that leaves ``root``."""
    if not (root / L.MANIFEST_NAME).is_file():
        return None
    walk = _Walk(root)
    data = walk.read(L.MANIFEST_NAME)
    if data is None:
        raise BundleRejected(walk.problems)
    return data


def read_app_dir(root: Path) -> dict[str, bytes]:
    """The bundle of the app in ``root``: the manifest, the files its ``tools`` globs name,
    the source beside each tool file, and the files of its ``pages`` folder. Reads no
    more than a limit-and-a-byte of any file, so an oversized file is reported, not
    loaded; never reads through a symlink that leaves ``root`` (a page's: its folder).
    Raises BundleRejected naming every such link (and a folder too large to walk).
    """
    files: dict[str, bytes] = {}
    data = read_manifest(root)
    if data is None:
        return files
    walk = _Walk(root)
    files[L.MANIFEST_NAME] = data
    raw: Any = None
    pages: Any = None
    if len(data) <= L.MAX_MANIFEST_BYTES:
        with contextlib.suppress(YAMLError, UnicodeDecodeError):
            doc = load_yaml(data.decode("utf-8"))
            raw = doc.get("tools") if isinstance(doc, dict) else None
            pages = doc.get("pages") if isinstance(doc, dict) else None
    patterns = [raw] if isinstance(raw, str) else [g for g in raw or [] if isinstance(g, str)]
    named = set(walk.files(_globs(tuple(patterns))))
    for rel in list(named):
        if rel.endswith(L.TOOL_SUFFIX):
            stem = rel[: -len(L.TOOL_SUFFIX)]
            named.update(
                stem + ext for ext in L.SOURCE_LANGUAGES if (root / (stem + ext)).is_file()
            )
    for rel in sorted(named):
        content = walk.read(rel)
        if content is not None:
            files[rel] = content
    problems = walk.problems
    if isinstance(pages, str):  # the manifest's pages folder (upload/pages.py)
        page_files, page_problems = read_pages(root, pages)
        problems += page_problems
        for rel, content in page_files.items():
            files.setdefault(rel, content)  # a file the globs name too: refused as a page
    if problems:
        raise BundleRejected(sorted(problems, key=lambda p: p.file))
    return files


def read_tool_files(folder: Path, stem: str) -> dict[str, bytes]:
    """The one-tool bundle of ``<stem>.tool.yaml`` in ``folder`` and its source, read as
    read_app_dir reads (capped, never through a symlink leaving ``folder``), with a
    manifest that names just it. Raises BundleRejected naming a link that leaves."""
    walk = _Walk(folder)
    files = {L.MANIFEST_NAME: f"slug: local\nname: local\ntools: {stem}{L.TOOL_SUFFIX}\n".encode()}
    for name in [f"{stem}{L.TOOL_SUFFIX}", *(stem + ext for ext in L.SOURCE_LANGUAGES)]:
        if (folder / name).is_file() or (folder / name).is_symlink():
            content = walk.read(name)
            if content is not None:
                files[name] = content
    if walk.problems:
        raise BundleRejected(walk.problems)
    return files
