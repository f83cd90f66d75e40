"""JSON Schemas: the two published file schemas, and the tools' own input/output schemas.

The published schemas in ``schemas/`` are the single source of truth for the shape
of ``agentserve.app.yaml`` and ``<name>.tool.yaml``: the loader checks documents
against them field by field, so every broken field is reported, not only the first.

A tool's own schemas are compiled with fastjsonschema. Compiling never touches the
network: only local ``$ref``s (``#/...``) are accepted.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import fastjsonschema
import msgspec

from runnerd.checks.codegen import compile_linear
from runnerd.checks.patterns import PatternError
from runnerd.package_data import resource_dir

__all__ = [
    "FieldError",
    "SchemaError",
    "check_document",
    "compile_schema",
    "published_schema",
    "schema_cost",
    "schemas_dir",
]

Validator = Callable[[Any], Any]


class SchemaError(Exception):
    """A JSON Schema that cannot be compiled (a broken schema, a remote $ref...)."""


class FieldError(msgspec.Struct, frozen=True):
    """One problem in a document: the path of the field (keys and indexes) and what is wrong."""

    path: tuple[str | int, ...]
    message: str
    on_key: bool = False  # True when the key itself is wrong (unknown field), not its value


def schemas_dir() -> Path:
    """Where the published schemas live: inside the installed package, else the source tree."""
    return resource_dir("schemas")


@functools.cache
def _published_text(name: str) -> str:
    return (schemas_dir() / f"{name}.schema.json").read_text()


def published_schema(name: str) -> dict[str, Any]:
    """The published schema ``name`` (``agentserve.tool`` or ``agentserve.app``), parsed:
    a fresh copy each time, since fastjsonschema rewrites what it compiles."""
    data: dict[str, Any] = json.loads(_published_text(name))
    return data


def _no_remote(uri: str) -> Any:
    raise SchemaError(f"remote $ref {uri!r} is not allowed; use local refs such as #/$defs/x")


# Every scheme urllib could fetch is answered by a refusal, so compiling never fetches.
_HANDLERS = {scheme: _no_remote for scheme in ("http", "https", "file", "ftp", "data")}

# Keywords whose subschemas apply to the same value (no step into the data): a cycle
# through these alone and $ref never ends.
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE_ONE = ("not", "if", "then", "else")


def _unescape(token: str) -> str:
    return unquote(token).replace("~1", "/").replace("~0", "~")


def _walk(schema: Any) -> Iterator[tuple[str, Any]]:
    """Every (JSON pointer, node) of ``schema``, iteratively (nesting is capped elsewhere)."""
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        pointer, node = stack.pop()
        yield pointer, node
        if isinstance(node, dict):
            for key, value in node.items():
                token = str(key).replace("~", "~0").replace("/", "~1")
                stack.append((f"{pointer}/{token}", value))
        elif isinstance(node, list):
            stack.extend((f"{pointer}/{i}", value) for i, value in enumerate(node))


def _check_refs(schema: Any) -> None:
    """SchemaError for a $ref that is not a local JSON pointer, points nowhere, or leads
    back to itself without stepping into the data (validation would never end)."""
    nodes = dict(_walk(schema))
    edges: dict[str, list[str]] = {}
    for pointer, node in nodes.items():
        if not isinstance(node, dict):
            continue
        if pointer and isinstance(node.get("$id", node.get("id")), str):
            raise SchemaError(
                f"{pointer or '/'}: $id is allowed only at the top of the schema, where it "
                "does not change what local refs point to"
            )
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref != "#" and not ref.startswith("#/"):
                raise SchemaError(
                    f"$ref {ref!r} at {pointer or '/'} points outside the schema; only local "
                    "refs such as # and #/$defs/name are allowed"
                )
            target = "".join("/" + _unescape(t) for t in ref[2:].split("/")) if ref != "#" else ""
            if target not in nodes:
                raise SchemaError(f"$ref {ref!r} at {pointer or '/'} points to nothing")
            edges[pointer] = [target]  # $ref overrides its siblings
            continue
        found = [f"{pointer}/{key}/{i}" for key in _IN_PLACE_LISTS
                 if isinstance(node.get(key), list) for i in range(len(node[key]))]  # fmt: skip
        found += [f"{pointer}/{key}" for key in _IN_PLACE_ONE if key in node]
        dependencies = node.get("dependencies", node.get("dependentSchemas"))
        if isinstance(dependencies, dict):
            word = "dependencies" if "dependencies" in node else "dependentSchemas"
            found += [
                f"{pointer}/{word}/{str(k).replace('~', '~0').replace('/', '~1')}"
                for k, v in dependencies.items()
                if isinstance(v, dict)
            ]
        edges[pointer] = found
    # Iterative depth-first search: a grey node met again closes a cycle.
    colour: dict[str, int] = {}
    for start in edges:
        if colour.get(start):
            continue
        stack = [(start, iter(edges.get(start, ())))]
        colour[start] = 1
        while stack:
            pointer, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[pointer] = 2
                stack.pop()
            elif colour.get(child) == 1:
                ref_at = next(p for p, _ in stack[[p for p, _ in stack].index(child) :]
                              if "$ref" in nodes[p])  # fmt: skip
                raise SchemaError(
                    f"$ref {nodes[ref_at]['$ref']!r} at {ref_at or '/'} leads back to itself "
                    "without stepping into the value, so checking any value would never end"
                )
            elif not colour.get(child):
                colour[child] = 1
                stack.append((child, iter(edges.get(child, ()))))


def schema_cost(schema: Any) -> int | None:
    """The size of ``schema`` as compact JSON, or None when it has a ``$ref``. Without a
    ``$ref`` nothing recurses, and every keyword's work on one byte of a value is bounded
    by the schema's own size (its objects, pattern lengths, enum lists): schema bytes x
    value bytes bounds a check, which lets the checker run small checks inline."""
    if any(isinstance(node, dict) and "$ref" in node for _, node in _walk(schema)):
        return None
    return len(msgspec.json.encode(schema))


def compile_schema(schema: dict[str, Any], *, every_error: bool = False) -> Validator:
    """Compile ``schema``; raise SchemaError saying why it cannot be.

    With ``every_error``, the validator reports every error it finds (a bounded number)
    in one JsonSchemaValuesException instead of stopping at the first: the slower pass
    that explains a refusal.

    Validation runs in linear time in what the schema's own keywords ask: patterns and
    formats on RE2 (a pattern RE2 cannot run is a SchemaError), uniqueItems by hashing
    values an attacker cannot make collide. $refs are local JSON pointers without a
    cycle that never steps into the value. Defaults in the schema are never filled in: a
    tool receives exactly the input sent.
    """
    _check_refs(schema)
    try:
        return compile_linear(schema, handlers=_HANDLERS, fast_fail=not every_error)
    except SchemaError:
        raise
    except PatternError as exc:
        raise SchemaError(str(exc)) from None
    except fastjsonschema.JsonSchemaDefinitionException as exc:
        raise SchemaError(str(exc)) from None
    except Exception as exc:  # fastjsonschema lets KeyError, TypeError... through
        raise SchemaError(f"{type(exc).__name__}: {exc}") from None


@functools.cache
def _property_validator(schema_name: str, key: str, drop_items: bool) -> Validator:
    schema = published_schema(schema_name)
    prop = dict(schema["properties"][key])
    if drop_items:
        prop.pop("items", None)
    return compile_schema({"$defs": schema.get("$defs", {}), **prop})


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


_PLAIN_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_$.-]*")
_KINDS = {str: "a string", int: "a number", float: "a number", bool: "true or false",
          list: "a list", type(None): "nothing"}  # fmt: skip


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), "a value of another kind")


def _unknown_field(key: Any, allowed: list[str]) -> str:
    """The message for an unknown field: the key only when it is a plain name, and cut
    short, since a file that is no tool file (a secret, a password file) may hold it."""
    if not isinstance(key, str) or not _PLAIN_KEY.fullmatch(key):
        return f"an unknown field (not a plain name); allowed: {', '.join(allowed)}"
    shown = key if len(key) <= 40 else key[:37] + "..."
    hint = difflib.get_close_matches(key, allowed, n=1)
    tail = f"; did you mean {hint[0]!r}?" if hint else f"; allowed: {', '.join(allowed)}"
    return f"unknown field {shown!r}{tail}"


def _pointer_text(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def check_document(
    schema_name: str, doc: Any, *, items_checked_elsewhere: frozenset[str] = frozenset()
) -> list[FieldError]:
    """Check ``doc`` against the published schema ``schema_name``, one error per broken field.

    Fields named in ``items_checked_elsewhere`` are checked here as arrays only (length,
    uniqueness); their items get precise checks from the caller.
    """
    schema = published_schema(schema_name)
    if not isinstance(doc, dict):
        # Never the value itself: a file that is no tool file may hold anything.
        return [FieldError((), f"must be a mapping of fields, got {_kind(doc)}")]
    props: dict[str, Any] = schema["properties"]
    errors: list[FieldError] = []
    for key in schema.get("required", []):
        if key not in doc:
            errors.append(FieldError((key,), f"{key} is required: {props[key]['description']}"))
    for key, value in doc.items():
        if key not in props:
            errors.append(FieldError((key,), _unknown_field(key, list(props)), on_key=True))
            continue
        validate = _property_validator(schema_name, key, key in items_checked_elsewhere)
        try:
            validate(value)
        except fastjsonschema.JsonSchemaValueException as exc:
            inner = [p for p in (exc.path or [])[1:]]
            if not inner:
                errors.append(
                    FieldError((key,), f"{key}: {props[key]['description']}; got {_show(value)}")
                )
            else:
                where = _pointer_text([key, *inner])
                what = exc.message.split(" ", 1)[1] if " " in exc.message else exc.message
                errors.append(FieldError((key, *inner), f"{where} {what}"))
    return errors
