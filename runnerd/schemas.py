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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fastjsonschema
import msgspec

from runnerd.resources import resource_dir

__all__ = [
    "FieldError",
    "SchemaError",
    "check_document",
    "compile_schema",
    "published_schema",
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
def published_schema(name: str) -> dict[str, Any]:
    """The published schema ``name`` (``agentserve.tool`` or ``agentserve.app``), parsed."""
    data: dict[str, Any] = json.loads((schemas_dir() / f"{name}.schema.json").read_text())
    return data


def _no_remote(uri: str) -> Any:
    raise SchemaError(f"remote $ref {uri!r} is not allowed; use local refs such as #/$defs/x")


# Every scheme urllib could fetch is answered by a refusal, so compiling never fetches.
_HANDLERS = {scheme: _no_remote for scheme in ("http", "https", "file", "ftp", "data")}


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def compile_schema(schema: dict[str, Any]) -> Validator:
    """Compile ``schema`` with fastjsonschema; raise SchemaError saying why it cannot be.

    Defaults in the schema are never filled in: a tool receives exactly the input sent.
    """
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise SchemaError(
                f"$ref {ref!r} points outside the schema; only local refs such as "
                "#/$defs/name are allowed"
            )
    try:
        validator: Validator = fastjsonschema.compile(schema, handlers=_HANDLERS, use_default=False)
    except SchemaError:
        raise
    except fastjsonschema.JsonSchemaDefinitionException as exc:
        raise SchemaError(str(exc)) from None
    except Exception as exc:  # fastjsonschema lets re.error, KeyError... through
        raise SchemaError(f"{type(exc).__name__}: {exc}") from None
    return validator


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
        return [FieldError((), f"must be a mapping of fields, got {_show(doc)}")]
    props: dict[str, Any] = schema["properties"]
    errors: list[FieldError] = []
    for key in schema.get("required", []):
        if key not in doc:
            errors.append(FieldError((key,), f"{key} is required: {props[key]['description']}"))
    for key, value in doc.items():
        if key not in props:
            hint = difflib.get_close_matches(str(key), list(props), n=1)
            tail = f"; did you mean {hint[0]!r}?" if hint else f"; allowed: {', '.join(props)}"
            errors.append(FieldError((key,), f"unknown field {key!r}{tail}", on_key=True))
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
