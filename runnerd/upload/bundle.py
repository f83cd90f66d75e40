"""Read an app: its manifest, the tool files its globs name, and each tool's one source.

``read_app_dir`` gathers the files of an app folder into a bundle (path -> bytes), the
same mapping a deploy uploads. ``load_bundle`` checks a bundle against every rule of the
manifest, the tool files and the sources, and returns the checked ``Bundle``, or raises
``BundleRejected`` listing every problem found, each with its file and, where there is
one, its line.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import re2
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from runnerd import egress
from runnerd import limits as C
from runnerd.checks.patterns import PatternError, compile_pattern
from runnerd.checks.schemas import FieldError, SchemaError, check_document, compile_schema
from runnerd.errors import BundleRejected, Problem
from runnerd.run.proxy import never_refusal
from runnerd.run.toolchain import Toolchain
from runnerd.upload.code import SourceFile, check_code
from runnerd.upload.pins import PinError, normalize_pin, pin_name
from runnerd.upload.yamlfile import load_yaml

__all__ = [
    "Bundle",
    "Manifest",
    "Tool",
    "load_bundle",
    "match_globs",
    "read_app_dir",
    "read_manifest",
    "read_tool_files",
]


class Manifest(msgspec.Struct, frozen=True):
    slug: str
    name: str
    version: str | None
    tools: tuple[str, ...]  # the globs
    text: str  # the manifest file as uploaded
    egress: tuple[str, ...] = ()  # the destinations asked for, in normal form


class Tool(msgspec.Struct, frozen=True):
    """One checked tool, everything a run needs and nothing of the rest of the app."""

    name: str
    description: str
    effect: str
    timeout_ms: int
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    packages: tuple[str, ...]  # normalized exact pins, sorted
    language: str  # python | javascript | typescript
    yaml_path: str
    yaml_text: str
    source_path: str
    source: str
    compiled_js: str | None  # what the jail runs when not the source (runnerd/upload/code.py)
    module_format: str | None  # esm | cjs for JavaScript/TypeScript, None for Python


class Bundle(msgspec.Struct, frozen=True):
    manifest: Manifest
    tools: tuple[Tool, ...]  # sorted by name
    warnings: tuple[Problem, ...]
    content_hash: str  # sha256 of the manifest and every tool file, source and build


# --- Files ----------------------------------------------------------------------------------

# runnerd: a bundle is the manifest plus what the globs name; far more files is a mistake.
MAX_BUNDLE_FILES = 2_000
MAX_PATH_CHARS = 1_024
# runnerd: entries a folder walk looks at before it gives up (node_modules and such).
MAX_WALK_ENTRIES = 100_000


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


def _shown_path(path: str) -> str:
    shown = repr(path)[1:-1]
    return shown if len(shown) <= 120 else shown[:117] + "..."


def _path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a file of a bundle, or None. Bundles hold plain relative
    POSIX paths: no absolute path, no empty, ``.`` or ``..`` segment, no NUL."""
    if not path or len(path) > MAX_PATH_CHARS:
        return f"a path is 1 to {MAX_PATH_CHARS:,} characters"
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
                if self.seen > MAX_WALK_ENTRIES:
                    raise BundleRejected(
                        [
                            Problem(
                                C.MANIFEST_NAME,
                                f"tools: the globs lead through more than {MAX_WALK_ENTRIES:,} "
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
        if rel == C.MANIFEST_NAME:
            limit = C.MAX_MANIFEST_BYTES
        else:
            limit = C.MAX_TOOL_YAML_BYTES if rel.endswith(C.TOOL_SUFFIX) else C.MAX_SOURCE_BYTES
        with real.open("rb") as f:
            return f.read(limit + 1)


def read_manifest(root: Path) -> bytes | None:
    """The manifest of the app in ``root`` (capped), None when there is none; raises
    BundleRejected when it is a symlink that leaves ``root``."""
    if not (root / C.MANIFEST_NAME).is_file():
        return None
    walk = _Walk(root)
    data = walk.read(C.MANIFEST_NAME)
    if data is None:
        raise BundleRejected(walk.problems)
    return data


def read_app_dir(root: Path) -> dict[str, bytes]:
    """The bundle of the app in ``root``: the manifest, the files its ``tools`` globs name,
    and the source beside each tool file. Reads no more than a limit-and-a-byte of any file,
    so an oversized file is reported, not loaded; never reads through a symlink that leaves
    ``root``. Raises BundleRejected naming every such link (and a folder too large to walk).
    """
    files: dict[str, bytes] = {}
    data = read_manifest(root)
    if data is None:
        return files
    walk = _Walk(root)
    files[C.MANIFEST_NAME] = data
    raw: Any = None
    if len(data) <= C.MAX_MANIFEST_BYTES:
        with contextlib.suppress(YAMLError, UnicodeDecodeError):
            doc = load_yaml(data.decode("utf-8"))
            raw = doc.get("tools") if isinstance(doc, dict) else None
    patterns = [raw] if isinstance(raw, str) else [g for g in raw or [] if isinstance(g, str)]
    named = set(walk.files(_globs(tuple(patterns))))
    for rel in list(named):
        if rel.endswith(C.TOOL_SUFFIX):
            stem = rel[: -len(C.TOOL_SUFFIX)]
            named.update(
                stem + ext for ext in C.SOURCE_LANGUAGES if (root / (stem + ext)).is_file()
            )
    for rel in sorted(named):
        content = walk.read(rel)
        if content is not None:
            files[rel] = content
    if walk.problems:
        raise BundleRejected(sorted(walk.problems, key=lambda p: p.file))
    return files


def read_tool_files(folder: Path, stem: str) -> dict[str, bytes]:
    """The one-tool bundle of ``<stem>.tool.yaml`` in ``folder`` and its source, read as
    read_app_dir reads (capped, never through a symlink leaving ``folder``), with a
    manifest that names just it. Raises BundleRejected naming a link that leaves."""
    walk = _Walk(folder)
    files = {C.MANIFEST_NAME: f"slug: local\nname: local\ntools: {stem}{C.TOOL_SUFFIX}\n".encode()}
    for name in [f"{stem}{C.TOOL_SUFFIX}", *(stem + ext for ext in C.SOURCE_LANGUAGES)]:
        if (folder / name).is_file() or (folder / name).is_symlink():
            content = walk.read(name)
            if content is not None:
                files[name] = content
    if walk.problems:
        raise BundleRejected(walk.problems)
    return files


# --- YAML with positions --------------------------------------------------------------------


def _yaml_problem(file: str, exc: YAMLError) -> Problem:
    if isinstance(exc, MarkedYAMLError) and exc.problem_mark is not None:
        what = " ".join(x for x in (exc.context, exc.problem) if x)
        return Problem(file, f"invalid YAML: {what}", exc.problem_mark.line + 1)
    return Problem(file, f"invalid YAML: {exc}")


def _line_of(node: Any, path: tuple[str | int, ...], on_key: bool = False) -> int:
    """1-based line of ``path`` in a ruamel round-trip tree (or of the closest parent)."""
    line = (node.lc.line + 1) if hasattr(node, "lc") else 1
    for depth, step in enumerate(path):
        last = depth == len(path) - 1
        if isinstance(node, CommentedMap) and step in node:
            pos = node.lc.key(step) if (last and on_key) else node.lc.value(step)
            line = pos[0] + 1
            node = node[step]
        elif isinstance(node, CommentedSeq) and isinstance(step, int) and step < len(node):
            line = node.lc.item(step)[0] + 1
            node = node[step]
        else:
            break
    return line


def _plain(node: Any) -> Any:
    """ruamel's round-trip objects as plain JSON-compatible Python values."""
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return str(node)  # dates and other YAML scalars JSON has no type for


def _field_problems(file: str, tree: Any, errors: list[FieldError]) -> list[Problem]:
    return [Problem(file, e.message, _line_of(tree, e.path, e.on_key)) for e in errors]


def _decode(file: str, data: bytes, problems: list[Problem]) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.append(Problem(file, f"is not UTF-8 text (byte {exc.start})"))
        return None


# --- The manifest ---------------------------------------------------------------------------


def _load_manifest(files: Mapping[str, bytes], problems: list[Problem]) -> Manifest | None:
    name = C.MANIFEST_NAME
    if name not in files:
        problems.append(Problem(name, f"no {name} at the root of the app"))
        return None
    data = files[name]
    if len(data) > C.MAX_MANIFEST_BYTES:
        problems.append(Problem(name, f"is larger than {C.MAX_MANIFEST_BYTES // C.KB} KB"))
        return None
    text = _decode(name, data, problems)
    if text is None:
        return None
    try:
        tree = load_yaml(text)
    except YAMLError as exc:
        problems.append(_yaml_problem(name, exc))
        return None
    errors = check_document("agentserve.app", _plain(tree))
    problems.extend(_field_problems(name, tree, errors))
    if errors:
        return None
    globs = (tree["tools"],) if isinstance(tree["tools"], str) else tuple(tree["tools"])
    for i, pattern in enumerate(globs):
        path: tuple[str | int, ...] = ("tools",) if isinstance(tree["tools"], str) else ("tools", i)
        clean = _clean_glob(pattern)
        if clean is None:
            problems.append(
                Problem(
                    name,
                    f"tools: the glob {pattern!r} reaches outside the app folder",
                    _line_of(tree, path),
                )
            )
            continue
        try:
            _Glob(clean)
        except GlobError as exc:
            problems.append(Problem(name, f"tools: {exc}", _line_of(tree, path)))
    version = tree.get("version")
    return Manifest(
        slug=str(tree["slug"]),
        name=str(tree["name"]),
        version=str(version) if version is not None else None,
        tools=tuple(str(g) for g in globs),
        text=text,
        egress=_egress(tree, problems),
    )


def _egress(tree: Any, problems: list[Problem]) -> tuple[str, ...]:
    """The manifest's egress entries in normal form; each bad or repeated entry is a
    problem with its line."""
    found: dict[str, int] = {}
    for i, entry in enumerate(tree.get("egress") or []):
        line = _line_of(tree, ("egress", i))
        try:
            destination = egress.parse(str(entry))
        except egress.EgressError as exc:
            problems.append(Problem(C.MANIFEST_NAME, f"egress[{i}]: {exc}", line))
            continue
        normal = str(destination)
        # Only what no daemon may reach is refused here: a private literal may be opened by
        # the daemon's egress_allow_networks, and the proxy judges it at each connection.
        why = never_refusal(ipaddress.ip_address(destination.host)) if destination.ip else None
        if why is not None:
            problems.append(
                Problem(
                    C.MANIFEST_NAME,
                    f"egress[{i}]: egress never reaches {normal} ({why})",
                    line,
                )
            )
            continue
        if normal in found:
            problems.append(
                Problem(
                    C.MANIFEST_NAME,
                    f"egress[{i}]: {normal} is listed twice (first as egress[{found[normal]}])",
                    line,
                )
            )
        found.setdefault(normal, i)
    return tuple(found)


# --- Tools ----------------------------------------------------------------------------------


class _Draft(msgspec.Struct):
    """A tool whose files passed their own checks, waiting for the code checks."""

    doc: dict[str, Any]
    yaml_path: str
    yaml_text: str
    source_path: str
    source: str
    language: str
    packages: tuple[str, ...]
    ok: bool  # False when the tool file itself had problems


def _load_tool(
    yaml_path: str, files: Mapping[str, bytes], problems: list[Problem]
) -> _Draft | None:
    before = len(problems)
    folder, filename = posixpath.split(yaml_path)
    stem = filename[: -len(C.TOOL_SUFFIX)]
    sources = [
        (posixpath.join(folder, stem + ext), lang)
        for ext, lang in C.SOURCE_LANGUAGES.items()
        if posixpath.join(folder, stem + ext) in files
    ]
    data = files[yaml_path]
    if len(data) > C.MAX_TOOL_YAML_BYTES:
        problems.append(Problem(yaml_path, f"is larger than {C.MAX_TOOL_YAML_BYTES // C.KB} KB"))
        return None
    text = _decode(yaml_path, data, problems)
    tree: Any = None
    if text is not None:
        try:
            tree = load_yaml(text)
        except YAMLError as exc:
            problems.append(_yaml_problem(yaml_path, exc))
    doc: Any = _plain(tree) if tree is not None else None
    if text is not None and doc is None and not problems[before:]:
        problems.append(
            Problem(yaml_path, "is empty; a tool file needs name, description, input and output")
        )
    if doc is not None:
        errors = check_document(
            "agentserve.tool", doc, items_checked_elsewhere=frozenset({"packages"})
        )
        problems.extend(_field_problems(yaml_path, tree, errors))
    if isinstance(doc, dict):
        name = doc.get("name")
        if isinstance(name, str) and name != stem:
            problems.append(
                Problem(
                    yaml_path,
                    f"name {name!r} does not match the file name {filename}: name the file "
                    f"{name}{C.TOOL_SUFFIX}",
                    _line_of(tree, ("name",)),
                )
            )
        for key in ("input", "output"):
            schema = doc.get(key)
            if isinstance(schema, dict):
                problems.extend(_schema_problems(yaml_path, tree, key, schema))

    if not sources:
        exts = ", ".join(C.SOURCE_LANGUAGES)
        problems.append(
            Problem(
                yaml_path,
                f"no source file beside it: add {stem}.ts, or {stem} with another of {exts}",
            )
        )
    elif len(sources) > 1:
        both = ", ".join(p for p, _ in sources)
        problems.append(
            Problem(yaml_path, f"has {len(sources)} source files ({both}); a tool has exactly one")
        )
    source_path, language = sources[0] if len(sources) == 1 else ("", "")
    source = None
    if source_path:
        raw = files[source_path]
        if len(raw) > C.MAX_SOURCE_BYTES:
            problems.append(
                Problem(
                    source_path,
                    f"is {len(raw) // C.KB}+ KB; a source file is at "
                    f"most {C.MAX_SOURCE_BYTES // C.KB} KB",
                )
            )
        else:
            source = _decode(source_path, raw, problems)

    packages: list[str] = []
    raw_packages = doc.get("packages") if isinstance(doc, dict) else None
    if isinstance(raw_packages, list) and language:
        seen: dict[str, int] = {}
        for i, entry in enumerate(raw_packages):
            if not isinstance(entry, str):
                continue  # reported by the schema check
            try:
                pin = normalize_pin(entry, language)
            except PinError as exc:
                problems.append(
                    Problem(yaml_path, f"packages[{i}]: {exc}", _line_of(tree, ("packages", i)))
                )
                continue
            key = pin_name(pin)
            if key in seen:
                problems.append(
                    Problem(
                        yaml_path,
                        f"packages[{i}]: {key!r} is listed twice",
                        _line_of(tree, ("packages", i)),
                    )
                )
            seen[key] = i
            packages.append(pin)

    if source is None:
        return None
    # The code is checked even when the tool file has problems, so one upload reports both.
    return _Draft(
        doc if isinstance(doc, dict) else {},
        yaml_path,
        text or "",
        source_path,
        source,
        language,
        tuple(sorted(packages)),
        ok=len(problems) == before,
    )


def _schema_problems(file: str, tree: Any, key: str, schema: dict[str, Any]) -> list[Problem]:
    line = _line_of(tree, (key,))
    size = len(json.dumps(schema, separators=(",", ":")).encode())
    if size > C.MAX_SCHEMA_BYTES:
        return [
            Problem(
                file,
                f"{key}: the schema is {size:,} bytes serialized; the limit is "
                f"{C.MAX_SCHEMA_BYTES // C.KB} KB",
                line,
            )
        ]
    try:
        compile_schema(schema)
    except SchemaError as exc:
        return [Problem(file, f"{key}: not a usable JSON Schema: {exc}", line)]
    return []


# --- The whole bundle -----------------------------------------------------------------------


def load_bundle(files: Mapping[str, bytes], *, toolchain: Toolchain | None) -> Bundle:
    """Check ``files`` (path relative to the app root -> content) against every rule.

    Returns the checked Bundle; raises BundleRejected with every problem found. Never
    runs the tools' code. ``toolchain`` is needed for JavaScript and TypeScript tools.
    """
    problems: list[Problem] = []
    warnings: list[Problem] = []
    if len(files) > MAX_BUNDLE_FILES:
        raise BundleRejected(
            [
                Problem(
                    C.MANIFEST_NAME,
                    f"the upload holds {len(files):,} files; at most {MAX_BUNDLE_FILES:,}",
                )
            ]
        )
    bad_paths = [Problem(_shown_path(path), why) for path in files if (why := _path_problem(path))]
    if bad_paths:
        raise BundleRejected(bad_paths)
    manifest = _load_manifest(files, problems)
    if manifest is None:
        raise BundleRejected(problems)

    named = match_globs(manifest.tools, [p for p in files if p != C.MANIFEST_NAME])
    tool_files = [p for p in named if p.endswith(C.TOOL_SUFFIX)]
    if not tool_files:
        problems.append(Problem(C.MANIFEST_NAME, "tools: the globs name no <name>.tool.yaml file"))
    if len(tool_files) > C.MAX_TOOLS_PER_APP:
        problems.append(
            Problem(
                C.MANIFEST_NAME,
                f"the globs name {len(tool_files)} tools; an "
                f"app ships at most {C.MAX_TOOLS_PER_APP}",
            )
        )
    stems = {p[: -len(C.TOOL_SUFFIX)] for p in tool_files}
    for path in named:
        root, ext = posixpath.splitext(path)
        if ext in C.SOURCE_LANGUAGES and root not in stems:
            warnings.append(
                Problem(
                    path,
                    f"has no {posixpath.basename(root)}{C.TOOL_SUFFIX} "
                    "beside it, so it is not a tool and is not uploaded",
                )
            )

    drafts = [d for p in tool_files if (d := _load_tool(p, files, problems)) is not None]
    by_name: dict[str, str] = {}
    for path in tool_files:
        stem = posixpath.basename(path)[: -len(C.TOOL_SUFFIX)]
        if stem in by_name:
            problems.append(
                Problem(
                    path,
                    f"a second tool named {stem!r} (the first is "
                    f"{by_name[stem]}); tool names are unique in an app",
                )
            )
        by_name.setdefault(stem, path)

    checks = check_code(
        [SourceFile(d.source_path, d.language, d.source, d.packages) for d in drafts], toolchain
    )
    tools: list[Tool] = []
    for draft in drafts:
        check = checks[draft.source_path]
        problems.extend(Problem(draft.source_path, msg, line) for line, msg in check.problems)
        if check.problems or not draft.ok:
            continue
        doc = draft.doc
        tools.append(
            Tool(
                name=doc["name"],
                description=doc["description"],
                effect=doc.get("effect", C.DEFAULT_EFFECT),
                timeout_ms=doc.get("timeoutMs", C.DEFAULT_TIMEOUT_MS),
                input_schema=doc["input"],
                output_schema=doc["output"],
                packages=draft.packages,
                language=draft.language,
                yaml_path=draft.yaml_path,
                yaml_text=draft.yaml_text,
                source_path=draft.source_path,
                source=draft.source,
                compiled_js=check.compiled_js,
                module_format=check.module_format,
            )
        )
    if problems:
        raise BundleRejected(sorted(problems, key=lambda p: (p.file, p.line or 0)))
    tools.sort(key=lambda t: t.name)
    return Bundle(manifest, tuple(tools), tuple(warnings), _content_hash(manifest, tools))


def _content_hash(manifest: Manifest, tools: list[Tool]) -> str:
    digest = hashlib.sha256()
    parts = [manifest.text]
    for tool in tools:
        parts += [tool.yaml_path, tool.yaml_text, tool.source_path, tool.source]
    for part in parts:
        data = part.encode()
        digest.update(len(data).to_bytes(8, "big") + data)
    return f"sha256:{digest.hexdigest()}"
