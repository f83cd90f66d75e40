"""Type definitions from tools' JSON Schemas, for the SDKs: TypeScript interfaces (and a
``RunnerdTools`` map for ``getAppClient<RunnerdTools>``) or Python TypedDicts (and the
``RunnerdClient`` and ``AsyncRunnerdClient`` Protocols, whose ``run_tool`` overloads map
each tool's name, a ``Literal``, to its input and output types).

Tool schemas are small and local (runnerd refuses remote ``$ref``), so the subset here
covers them: types (and type lists), ``enum``, ``const``, objects with ``properties``,
``required`` and ``additionalProperties``, arrays with ``items``, ``anyOf``/``oneOf``
(a union), ``allOf`` (an intersection in TypeScript), local ``$ref`` to ``$defs`` or
``definitions``, and descriptions as doc comments. Anything else becomes ``unknown`` /
``Any``: never a wrong type, at worst a loose one.
"""

from __future__ import annotations

import json
import keyword
import re
from typing import Any

from runnerd.limits import MAX_TYPE_DEPTH

__all__ = ["python_types", "typescript_types"]

_IDENT = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")


def _pascal(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", name) if part)


def _ref_name(ref: str) -> str | None:
    for prefix in ("#/$defs/", "#/definitions/"):
        if ref.startswith(prefix):
            return ref[len(prefix) :]
    return None


class _Gen:
    def __init__(self, prefix: str, root: dict[str, Any], lang: str) -> None:
        self.prefix = prefix
        self.root = root
        self.lang = lang
        self.defs: dict[str, str] = {}  # $defs name -> generated type name
        self.blocks: list[str] = []

    # --- TypeScript ---------------------------------------------------------------------

    def ts(self, schema: Any, depth: int = 0) -> str:
        if schema is True or not isinstance(schema, dict) or depth > MAX_TYPE_DEPTH:
            return "unknown"
        if "$ref" in schema:
            return self._ref(schema["$ref"])
        if "const" in schema:
            return json.dumps(schema["const"])
        if isinstance(schema.get("enum"), list):
            return " | ".join(json.dumps(v) for v in schema["enum"]) or "never"
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                return " | ".join(f"({self.ts(s, depth + 1)})" for s in schema[key]) or "never"
        if isinstance(schema.get("allOf"), list):
            return " & ".join(f"({self.ts(s, depth + 1)})" for s in schema["allOf"]) or "unknown"
        kinds = schema.get("type")
        if isinstance(kinds, list):
            return " | ".join(self.ts({**schema, "type": k}, depth + 1) for k in kinds)
        if kinds == "string":
            return "string"
        if kinds in ("number", "integer"):
            return "number"
        if kinds == "boolean":
            return "boolean"
        if kinds == "null":
            return "null"
        if kinds == "array":
            items = schema.get("items")
            return f"Array<{self.ts(items, depth + 1)}>" if items is not None else "unknown[]"
        if kinds == "object" or "properties" in schema:
            return self._ts_object(schema, depth)
        return "unknown"

    def _ts_object(self, schema: dict[str, Any], depth: int) -> str:
        required = set(schema.get("required") or [])
        pad = "  " * (depth + 1)
        lines = ["{"]
        for name, prop in (schema.get("properties") or {}).items():
            if isinstance(prop, dict) and prop.get("description"):
                lines.append(f"{pad}/** {_comment(prop['description'])} */")
            key = name if _IDENT.match(name) else json.dumps(name)
            optional = "" if name in required else "?"
            lines.append(f"{pad}{key}{optional}: {self.ts(prop, depth + 1)};")
        extra = schema.get("additionalProperties", True)
        if extra is not False and not schema.get("properties"):
            value = "unknown" if extra is True else self.ts(extra, depth + 1)
            lines.append(f"{pad}[key: string]: {value};")
        lines.append("  " * depth + "}")
        return "\n".join(lines)

    # --- Python -------------------------------------------------------------------------

    def py(self, schema: Any, hint: str, depth: int = 0) -> str:
        if schema is True or not isinstance(schema, dict) or depth > MAX_TYPE_DEPTH:
            return "Any"
        if "$ref" in schema:
            return self._ref(schema["$ref"])
        if "const" in schema:
            return f"Literal[{schema['const']!r}]"
        if isinstance(schema.get("enum"), list):
            values = [v for v in schema["enum"] if isinstance(v, str | int | bool) or v is None]
            return f"Literal[{', '.join(repr(v) for v in values)}]" if values else "Any"
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                return " | ".join(
                    self.py(s, f"{hint}{i}", depth + 1) for i, s in enumerate(schema[key])
                )
        kinds = schema.get("type")
        if isinstance(kinds, list):
            return " | ".join(self.py({**schema, "type": k}, hint, depth + 1) for k in kinds)
        simple = {
            "string": "str",
            "number": "float",
            "integer": "int",
            "boolean": "bool",
            "null": "None",
        }
        if kinds in simple:
            return simple[str(kinds)]
        if kinds == "array":
            items = schema.get("items")
            return (
                f"list[{self.py(items, hint + 'Item', depth + 1)}]"
                if items is not None
                else "list[Any]"
            )
        if (kinds == "object" or "properties" in schema) and schema.get("properties"):
            return self._py_class(schema, hint, depth)
        if kinds == "object":
            return "dict[str, Any]"
        return "Any"

    def _py_class(self, schema: dict[str, Any], name: str, depth: int) -> str:
        required = set(schema.get("required") or [])
        fields = []
        for key, prop in (schema.get("properties") or {}).items():
            value = self.py(prop, name + _pascal(key), depth + 1)
            fields.append((key, value if key in required else f"NotRequired[{value}]"))
        lines = []
        if all(k.isidentifier() and not keyword.iskeyword(k) for k, _ in fields):
            lines.append(f"class {name}(TypedDict):")
            if schema.get("description"):
                lines.append(f'    """{_comment(schema["description"])}"""')
            lines += [f"    {k}: {v}" for k, v in fields] or ["    pass"]
        else:  # a key that is no identifier: the functional form
            body = ", ".join(f"{k!r}: {v}" for k, v in fields)
            lines.append(f"{name} = TypedDict({name!r}, {{{body}}})")
        self.blocks.append("\n".join(lines))
        return name

    # --- shared -------------------------------------------------------------------------

    def _ref(self, ref: str) -> str:
        name = _ref_name(ref)
        defs = self.root.get("$defs") or self.root.get("definitions") or {}
        if name is None or name not in defs:
            return "unknown" if self.lang == "ts" else "Any"
        if name not in self.defs:
            type_name = f"{self.prefix}{_pascal(name)}"
            self.defs[name] = type_name
            if self.lang == "ts":
                self.blocks.append(f"export type {type_name} = {self.ts(defs[name])};")
            else:
                found = self.py(defs[name], type_name)
                if found != type_name:
                    self.blocks.append(f"{type_name} = {found}")
        return self.defs[name]


def _comment(text: str) -> str:
    return " ".join(str(text).split()).replace("*/", "* /").replace('"""', "'''")


def typescript_types(tools: list[dict[str, Any]], *, bare_names: bool) -> str:
    """TypeScript for ``tools`` (List App Tools entries); ``bare_names`` adds each tool's
    bare name to the map (one app only), beside its reference."""
    out = ["// Generated by `runnerd tools types --lang ts` from the installed tools' schemas.",
           "// Regenerate after a new version is installed.", ""]  # fmt: skip
    entries = []
    for tool in tools:
        base = (
            _pascal(tool["appSlug"]) + _pascal(tool["name"])
            if not bare_names
            else _pascal(tool["name"])
        )
        names = {}
        for part, schema in (("Input", tool["inputSchema"]), ("Output", tool["outputSchema"])):
            gen = _Gen(base, schema, "ts")
            body = gen.ts(schema)
            out += gen.blocks
            doc = f"/** {_comment(tool['description'])} ({tool['reference']}, {part.lower()}) */"
            out += [doc, f"export type {base}{part} = {body};", ""]
            names[part] = f"{base}{part}"
        entry = f"{{ input: {names['Input']}; output: {names['Output']} }}"
        entries.append(f"  {json.dumps(tool['reference'])}: {entry};")
        if bare_names:
            entries.append(f"  {json.dumps(tool['name'])}: {entry};")
    out += ["/** Every tool by reference (and by name): getAppClient<RunnerdTools>(...). */",
            "export type RunnerdTools = {", *entries, "};", ""]  # fmt: skip
    return "\n".join(out)


def python_types(tools: list[dict[str, Any]], *, bare_names: bool) -> str:
    """Python TypedDicts for ``tools``' inputs and outputs, and the client Protocols whose
    ``run_tool`` overloads take each tool's name (a ``Literal``: its reference, and with
    ``bare_names`` its bare name too) with its input type and return its output's, so
    that ``mypy --strict`` refuses a wrong input and a name no tool has."""
    out = ['"""Generated by `runnerd tools types --lang py` from the installed tools\' schemas.',
           "Regenerate after a new version is installed.", "",
           "    from runnerd_tools import RunnerdClient", "",
           "    client: RunnerdClient = AppClient(url, api_key, workspace_id, app=...)",
           "    run = client.run_tool(\"score_offer\", offer)  # offer: ScoreOfferInput",
           "", "(AsyncRunnerdClient for an AsyncAppClient.)", '"""', "",
           "from __future__ import annotations", "",
           "from types import TracebackType",
           "from typing import Any, Literal, NotRequired, Protocol, TypedDict, overload", "",
           "from runnerd.sdk import RunResult, ToolInfo", ""]  # fmt: skip
    aliases = []
    calls = []
    for tool in tools:
        base = (
            _pascal(tool["appSlug"]) + _pascal(tool["name"])
            if not bare_names
            else _pascal(tool["name"])
        )
        for part, schema in (("Input", tool["inputSchema"]), ("Output", tool["outputSchema"])):
            gen = _Gen(base, schema, "py")
            found = gen.py(schema, f"{base}{part}")
            out += [*(f"\n{b}\n" for b in gen.blocks)]
            if found != f"{base}{part}":
                aliases.append(f"{base}{part} = {found}")
        names = [tool["name"], tool["reference"]] if bare_names else [tool["reference"]]
        calls.append((", ".join(json.dumps(n) for n in names), base))
    out += ["", *aliases, "", *_py_client("RunnerdClient", calls, asynchronous=False)]
    out += ["", *_py_client("AsyncRunnerdClient", calls, asynchronous=True)]
    return "\n".join(line for line in out) + "\n"


def _py_client(name: str, calls: list[tuple[str, str]], *, asynchronous: bool) -> list[str]:
    """A Protocol that ``AppClient`` (or ``AsyncAppClient``) satisfies, with one
    ``run_tool`` overload per tool; a single tool gets a plain method (an overload needs
    two)."""
    kind, prefix = ("AsyncAppClient", "async ") if asynchronous else ("AppClient", "")
    doc = f"An {kind} with the tools' types: `client: {name} = {kind}(...)`."
    lines = [f"\nclass {name}(Protocol):", f'    """{doc}"""']
    for literal, base in calls:
        lines += [""] + (["    @overload"] if len(calls) > 1 else []) + [
            f"    {prefix}def run_tool(",
            f"        self, name: Literal[{literal}], input: {base}Input,",
            "        idempotency_key: str | None = None,",
            f"    ) -> RunResult[{base}Output | None]: ...",
        ]  # fmt: skip
    lines += ["", f"    {prefix}def list_tools(self) -> list[ToolInfo]: ..."]
    if asynchronous:
        lines += [
            "", "    async def aclose(self) -> None: ...",
            "", f"    async def __aenter__(self) -> {name}: ...",
            "", "    async def __aexit__(",
            "        self, exc_type: type[BaseException] | None, exc: BaseException | None,",
            "        traceback: TracebackType | None,",
            "    ) -> None: ...",
        ]  # fmt: skip
    else:
        lines += [
            "", "    def close(self) -> None: ...",
            "", f"    def __enter__(self) -> {name}: ...",
            "", "    def __exit__(",
            "        self, exc_type: type[BaseException] | None, exc: BaseException | None,",
            "        traceback: TracebackType | None,",
            "    ) -> None: ...",
        ]  # fmt: skip
    return lines
