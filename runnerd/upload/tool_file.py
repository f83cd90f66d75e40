"""One tool file: ``<name>.tool.yaml`` and the one source beside it, checked on their own.

Each part is checked where it has a line to name: the tool schema, the name against the
file name, the input and output JSON Schemas, the one source, the package pins. The code
checks (which take every source of the upload at once) and the Tool itself are the
bundle's (bundle.py).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

import msgspec
from ruamel.yaml.error import YAMLError

from runnerd import limits as L
from runnerd.checks.schemas import SchemaError, check_document, compile_schema
from runnerd.model import Language, Problem
from runnerd.upload.pins import PinError, normalize_pin, pin_name
from runnerd.upload.yamlfile import (
    decode_text,
    field_problems,
    line_of,
    load_yaml,
    plain,
    yaml_problem,
)

__all__ = ["Draft", "load_tool"]


class Draft(msgspec.Struct):
    """A tool whose files passed their own checks, waiting for the code checks."""

    doc: dict[str, Any]
    yaml_path: str
    yaml_text: str
    source_path: str
    source: str
    language: Language
    packages: tuple[str, ...]
    ok: bool  # False when the tool file itself had problems


def load_tool(yaml_path: str, files: Mapping[str, bytes], problems: list[Problem]) -> Draft | None:
    """The tool file ``yaml_path`` of ``files`` and its one source, each checked on its own;
    every problem found is appended to ``problems``, in the order a reader meets them.

    None when there is no source to check the code of. Else a Draft, with ``ok`` False when
    the tool file had problems: its code is still checked, so one upload reports both."""
    before = len(problems)
    data = files[yaml_path]
    if len(data) > L.MAX_TOOL_YAML_BYTES:
        problems.append(Problem(yaml_path, f"is larger than {L.MAX_TOOL_YAML_BYTES // L.KB} KB"))
        return None
    text = decode_text(yaml_path, data, problems)
    tree: Any = None
    if text is not None:
        try:
            tree = load_yaml(text)
        except YAMLError as exc:
            problems.append(yaml_problem(yaml_path, exc))
    doc: Any = plain(tree) if tree is not None else None
    if text is not None and doc is None and not problems[before:]:
        problems.append(
            Problem(yaml_path, "is empty; a tool file needs name, description, input and output")
        )
    if doc is not None:
        problems.extend(_document_problems(yaml_path, tree, doc))
    found = _one_source(yaml_path, files, problems)
    if found is None:
        return None
    source_path, language = found
    source = _read_source(source_path, files, problems)
    packages = _packages(yaml_path, tree, doc, language, problems)
    if source is None:
        return None
    return Draft(
        doc if isinstance(doc, dict) else {},
        yaml_path,
        text or "",
        source_path,
        source,
        language,
        packages,
        ok=len(problems) == before,
    )


def _document_problems(yaml_path: str, tree: Any, doc: Any) -> list[Problem]:
    """What is wrong with the parsed tool file: its fields against the tool schema, its
    name against the file name, its input and output schemas."""
    errors = check_document("agentserve.tool", doc, items_checked_elsewhere=frozenset({"packages"}))
    problems = field_problems(yaml_path, tree, errors)
    if not isinstance(doc, dict):
        return problems
    filename = posixpath.basename(yaml_path)
    name = doc.get("name")
    if isinstance(name, str) and name != filename[: -len(L.TOOL_SUFFIX)]:
        problems.append(
            Problem(
                yaml_path,
                f"name {name!r} does not match the file name {filename}: name the file "
                f"{name}{L.TOOL_SUFFIX}",
                line_of(tree, ("name",)),
            )
        )
    for key in ("input", "output"):
        schema = doc.get(key)
        if isinstance(schema, dict):
            problems.extend(_schema_problems(yaml_path, tree, key, schema))
    return problems


def _schema_problems(file: str, tree: Any, key: str, schema: dict[str, Any]) -> list[Problem]:
    line = line_of(tree, (key,))
    size = len(json.dumps(schema, separators=(",", ":")).encode())
    if size > L.MAX_SCHEMA_BYTES:
        return [
            Problem(
                file,
                f"{key}: the schema is {size:,} bytes serialized; the limit is "
                f"{L.MAX_SCHEMA_BYTES // L.KB} KB",
                line,
            )
        ]
    try:
        compile_schema(schema)
    except SchemaError as exc:
        named = [  # the word at fault and where, rather than the validator's "Unknown type"
            Problem(file, f"{key}: not a usable JSON Schema: Unknown type {word!r} at "
                    f"{'.'.join(map(str, at))} (a type is one of {', '.join(_TYPES)})",
                    line_of(tree, (key, *at)))
            for at, word in _unknown_types(schema, ())
        ]  # fmt: skip
        return named or [Problem(file, f"{key}: not a usable JSON Schema: {exc}", line)]
    return []


_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")


def _unknown_types(node: Any, at: tuple[str | int, ...]) -> list[tuple[tuple[str | int, ...], Any]]:
    """Each ``type`` in a schema whose word is none of _TYPES: (its path, the word). Values
    that are data, not schemas (const, default, enum, examples), are not looked into."""
    found: list[tuple[tuple[str | int, ...], Any]] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "type":
                words = v if isinstance(v, list) else [v]
                found += [((*at, k), w) for w in words if isinstance(w, str) and w not in _TYPES]
            elif k not in ("const", "default", "enum", "examples"):
                found += _unknown_types(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _unknown_types(v, (*at, i))
    return found


def _one_source(
    yaml_path: str, files: Mapping[str, bytes], problems: list[Problem]
) -> tuple[str, Language] | None:
    """The path and language of the one source beside ``yaml_path``; None and a problem
    when there is none, or more than one."""
    folder, filename = posixpath.split(yaml_path)
    stem = filename[: -len(L.TOOL_SUFFIX)]
    sources = [
        (posixpath.join(folder, stem + ext), language)
        for ext, language in L.SOURCE_LANGUAGES.items()
        if posixpath.join(folder, stem + ext) in files
    ]
    if len(sources) == 1:
        return sources[0]
    if not sources:
        exts = ", ".join(L.SOURCE_LANGUAGES)
        problems.append(
            Problem(
                yaml_path,
                f"no source file beside it: add {stem}.ts, or {stem} with another of {exts}",
            )
        )
    else:
        both = ", ".join(p for p, _ in sources)
        problems.append(
            Problem(yaml_path, f"has {len(sources)} source files ({both}); a tool has exactly one")
        )
    return None


def _read_source(
    source_path: str, files: Mapping[str, bytes], problems: list[Problem]
) -> str | None:
    """The source as text; None and a problem when it is too large or not UTF-8."""
    raw = files[source_path]
    if len(raw) > L.MAX_SOURCE_BYTES:
        problems.append(
            Problem(
                source_path,
                f"is {len(raw) // L.KB}+ KB; a source file is at "
                f"most {L.MAX_SOURCE_BYTES // L.KB} KB",
            )
        )
        return None
    return decode_text(source_path, raw, problems)


def _packages(
    yaml_path: str, tree: Any, doc: Any, language: Language, problems: list[Problem]
) -> tuple[str, ...]:
    """The tool's package pins, normalized for ``language`` and sorted; a problem (at its
    line) for each entry that is no exact pin or names a package twice."""
    raw_packages = doc.get("packages") if isinstance(doc, dict) else None
    if not isinstance(raw_packages, list):
        return ()
    packages: list[str] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(raw_packages):
        if not isinstance(entry, str):
            continue  # reported by the schema check
        try:
            pin = normalize_pin(entry, language)
        except PinError as exc:
            problems.append(
                Problem(yaml_path, f"packages[{i}]: {exc}", line_of(tree, ("packages", i)))
            )
            continue
        key = pin_name(pin)
        if key in seen:
            problems.append(
                Problem(
                    yaml_path,
                    f"packages[{i}]: {key!r} is listed twice",
                    line_of(tree, ("packages", i)),
                )
            )
        seen[key] = i
        packages.append(pin)
    return tuple(sorted(packages))
