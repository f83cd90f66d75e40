"""Read an app: its manifest, the tool files its globs name, and each tool's one source.

``read_app_dir`` gathers the files of an app folder into a bundle (path -> bytes), the
same mapping a deploy uploads. ``load_bundle`` checks a bundle against every rule of
seed 000 and returns the checked ``Bundle``, or raises ``BundleRejected`` listing every
problem found, each with its file and, where there is one, its line.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from runnerd import constants as C
from runnerd.compile import SourceFile, check_code
from runnerd.errors import BundleRejected, Problem
from runnerd.pins import PinError, normalize_pin, pin_name
from runnerd.schemas import FieldError, SchemaError, check_document, compile_schema
from runnerd.toolchain import Toolchain

__all__ = ["Bundle", "Manifest", "Tool", "load_bundle", "match_globs", "read_app_dir"]


class Manifest(msgspec.Struct, frozen=True):
    slug: str
    name: str
    version: str | None
    tools: tuple[str, ...]  # the globs
    text: str  # the manifest file as uploaded


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
    compiled_js: str | None  # TypeScript compiled to ES module JavaScript
    module_format: str | None  # esm | cjs for JavaScript/TypeScript, None for Python


class Bundle(msgspec.Struct, frozen=True):
    manifest: Manifest
    tools: tuple[Tool, ...]  # sorted by name
    warnings: tuple[Problem, ...]
    content_hash: str  # sha256 of the manifest and every tool file, source and build


# --- Files ----------------------------------------------------------------------------------


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """POSIX-path glob to regex: ``*`` and ``?`` stay in one folder, ``**/`` spans folders."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:[^/]+/)*", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out, i = out + f"[{body}]", end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _clean_glob(pattern: str) -> str | None:
    """The glob relative to the manifest folder, or None if it reaches outside it."""
    while pattern.startswith("./"):
        pattern = pattern[2:]
    if pattern.startswith("/") or ".." in pattern.split("/"):
        return None
    if pattern.endswith("/"):
        pattern += "*"
    return pattern


def match_globs(globs: tuple[str, ...], paths: list[str]) -> list[str]:
    """The paths (POSIX, relative to the manifest) that any of ``globs`` names, sorted."""
    regexes = [_glob_regex(g) for g in (_clean_glob(p) for p in globs) if g]
    return sorted(p for p in paths if any(r.fullmatch(p) for r in regexes))


def read_app_dir(root: Path) -> dict[str, bytes]:
    """The bundle of the app in ``root``: the manifest, the files its ``tools`` globs name,
    and the source beside each tool file. Reads no more than a limit-and-a-byte of any file,
    so an oversized file is reported, not loaded."""
    files: dict[str, bytes] = {}
    manifest = root / C.MANIFEST_NAME
    if not manifest.is_file():
        return files
    files[C.MANIFEST_NAME] = _read_capped(manifest, C.MAX_MANIFEST_BYTES)
    try:
        doc = YAML(typ="safe").load(files[C.MANIFEST_NAME])
        raw = doc.get("tools") if isinstance(doc, dict) else None
    except YAMLError:
        raw = None
    globs = [raw] if isinstance(raw, str) else [g for g in raw or [] if isinstance(g, str)]
    named: set[Path] = set()
    for pattern in globs:
        clean = _clean_glob(pattern)
        if clean:
            # Path.glob's trailing ** names folders only; match_globs below is the rule.
            walk = clean + "/*" if clean.endswith("**") else clean
            named.update(p for p in root.glob(walk) if p.is_file())
    named = {
        root / p for p in match_globs(tuple(globs), [p.relative_to(root).as_posix() for p in named])
    }
    for path in list(named):
        if path.name.endswith(C.TOOL_SUFFIX):
            stem = path.name[: -len(C.TOOL_SUFFIX)]
            named.update(
                sibling
                for ext in C.SOURCE_LANGUAGES
                if (sibling := path.with_name(stem + ext)).is_file()
            )
    for path in sorted(named):
        rel = path.relative_to(root).as_posix()
        limit = C.MAX_TOOL_YAML_BYTES if rel.endswith(C.TOOL_SUFFIX) else C.MAX_SOURCE_BYTES
        files[rel] = _read_capped(path, limit)
    return files


def _read_capped(path: Path, limit: int) -> bytes:
    with path.open("rb") as f:
        return f.read(limit + 1)


# --- YAML with positions --------------------------------------------------------------------


def _parse_yaml(text: str) -> Any:
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    return yaml.load(io.StringIO(text))


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
        tree = _parse_yaml(text)
    except YAMLError as exc:
        problems.append(_yaml_problem(name, exc))
        return None
    errors = check_document("agentserve.app", _plain(tree))
    problems.extend(_field_problems(name, tree, errors))
    if errors:
        return None
    globs = (tree["tools"],) if isinstance(tree["tools"], str) else tuple(tree["tools"])
    for i, pattern in enumerate(globs):
        if _clean_glob(pattern) is None:
            path: tuple[str | int, ...] = (
                ("tools",) if isinstance(tree["tools"], str) else ("tools", i)
            )
            problems.append(
                Problem(
                    name,
                    f"tools: the glob {pattern!r} reaches outside the app folder",
                    _line_of(tree, path),
                )
            )
    version = tree.get("version")
    return Manifest(
        slug=str(tree["slug"]),
        name=str(tree["name"]),
        version=str(version) if version is not None else None,
        tools=tuple(str(g) for g in globs),
        text=text,
    )


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
            tree = _parse_yaml(text)
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
