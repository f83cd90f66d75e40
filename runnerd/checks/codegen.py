"""fastjsonschema's code generators, with every keyword that could take more than linear
time rewritten, so no schema and no value can freeze the daemon.

- ``pattern``, ``patternProperties`` and ``format: regex`` run on RE2 (runnerd.checks.patterns);
  a pattern RE2 cannot run is refused at compile time, and compiling never runs Python's
  backtracking ``re`` on a schema's pattern (fastjsonschema's ``required`` check did).
- every ``format`` is checked by runnerd.patterns.FORMATS, in linear time.
- ``uniqueItems`` hashes a canonical form of each item: strings (whose hash is keyed per
  process), never raw numbers, whose hashes anyone can make collide.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import msgspec
from fastjsonschema import JsonSchemaDefinitionException
from fastjsonschema import _get_code_generator_class as _generator_class
from fastjsonschema.draft04 import CodeGeneratorDraft04
from fastjsonschema.draft06 import CodeGeneratorDraft06
from fastjsonschema.draft07 import CodeGeneratorDraft07
from fastjsonschema.draft2019 import CodeGeneratorDraft2019
from fastjsonschema.ref_resolver import RefResolver

from runnerd.checks.patterns import FORMATS, compile_pattern
from runnerd.limits import MAX_INPUT_PROBLEMS_COUNTED

__all__ = ["compile_linear", "unique_items"]


def _canonical(value: Any) -> Any:
    """A hashable form of a JSON value with JSON's equality (1 == 1.0, true != 1, key
    order ignored) whose hash derives only from str hashes, which are keyed per process."""
    if isinstance(value, str):
        return "s" + value
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        try:
            return "n" + str(value)
        except ValueError:  # past Python's digit limit for str()
            return "x" + hex(value)
    if isinstance(value, float):
        return _canonical(int(value)) if value.is_integer() else "r" + repr(value)
    if value is None:
        return "z"
    if isinstance(value, list):
        return tuple(_canonical(v) for v in value)
    if isinstance(value, dict):
        return frozenset((str(k), _canonical(v)) for k, v in value.items())
    return "o" + repr(value)


def unique_items(items: list[Any]) -> bool:
    """True when no two items of ``items`` are equal JSON values."""
    return len({_canonical(item) for item in items}) == len(items)


class _Linear:
    """Mixed into each of fastjsonschema's draft generators (see the module docstring)."""

    _definition: dict[str, Any]
    _compile_regexps: dict[str, Any]

    # These methods are fastjsonschema's own, with RE2 in place of ``re``.
    def generate_pattern(self: Any) -> None:
        with self.l("if isinstance({variable}, str):"):
            pattern = self._definition["pattern"]
            self._compile_regexps[pattern] = compile_pattern(pattern)
            with self.l("if not REGEX_PATTERNS[{}].search({variable}):", repr(pattern)):
                self.exc("{name} must match pattern {}", self.e(pattern), rule="pattern")

    def generate_pattern_properties(self: Any) -> None:
        self.create_variable_is_dict()
        with self.l("if {variable}_is_dict:"):
            self.create_variable_keys()
            definitions = self._definition["patternProperties"]
            if definitions == {}:
                return
            for pattern in definitions:
                self._compile_regexps[pattern] = compile_pattern(pattern)
            with self.l("for {variable}_key, {variable}_val in {variable}.items():"):
                for pattern, definition in definitions.items():
                    with self.l("if REGEX_PATTERNS[{}].search({variable}_key):", repr(pattern)):
                        with self.l("if {variable}_key in {variable}_keys:"):
                            self.l("{variable}_keys.remove({variable}_key)")
                        self.generate_func_code_block(
                            definition,
                            f"{self._variable}_val",
                            f"{self._variable_name}.{{{self._variable}_key}}",
                            clear_variables=True,
                        )

    def generate_required(self: Any) -> None:
        self.create_variable_is_dict()
        with self.l("if {variable}_is_dict:"):
            required = self._definition["required"]
            if not isinstance(required, (list, tuple)):
                raise JsonSchemaDefinitionException("required must be an array")
            if len(required) != len(set(required)):
                raise JsonSchemaDefinitionException("required must contain unique elements")
            if not self._definition.get("additionalProperties", True):
                patterns = [
                    compile_pattern(p) for p in self._definition.get("patternProperties", {})
                ]
                impossible = [
                    prop
                    for prop in required
                    if prop not in self._definition.get("properties", {})
                    and not any(p.search(prop) for p in patterns)
                ]
                if impossible:
                    raise JsonSchemaDefinitionException(
                        f"{self._variable}: items {impossible} are required but not allowed"
                    )
            self.l("{variable}__missing_keys = set({required}) - {variable}.keys()")
            with self.l("if {variable}__missing_keys:"):
                dynamic = 'str(sorted({variable}__missing_keys)) + " properties"'
                self.exc(
                    "{name} must contain ",
                    self.e(required),
                    rule="required",
                    append_to_msg=dynamic,
                )

    def exc(self: Any, msg: str, *args: Any, **kwargs: Any) -> None:
        super().exc(msg, *args, **kwargs)  # type: ignore[misc]
        if not self._fast_fail:  # collecting every error: stop counting past a bound
            with self.l("if len(errors) >= {}:", MAX_INPUT_PROBLEMS_COUNTED):
                self.l("raise JsonSchemaValuesException(errors)")

    def generate_unique_items(self: Any) -> None:
        if not self._definition["uniqueItems"]:
            return
        self.create_variable_is_list()
        with self.l("if {variable}_is_list and not UNIQUE_ITEMS({variable}):"):
            self.exc("{name} must contain unique items", rule="uniqueItems")

    @property
    def global_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().global_state  # type: ignore[misc]
        state["UNIQUE_ITEMS"] = unique_items
        return state


_BASES = (CodeGeneratorDraft04, CodeGeneratorDraft06, CodeGeneratorDraft07, CodeGeneratorDraft2019)
_LINEAR: dict[type, type] = {
    base: type(f"Linear{base.__name__}", (_Linear, base), {}) for base in _BASES
}
# The formats each draft asserts, each checked by runnerd's linear-time version.
_FORMATS: dict[type, dict[str, Callable[[str], bool]]] = {
    base: {n: check for n, check in FORMATS.items() if n in {*base.FORMAT_REGEXS, "regex"}}
    for base in _BASES
}


def compile_linear(
    schema: Any, *, handlers: dict[str, Any], fast_fail: bool = True
) -> Callable[[Any], Any]:
    """``fastjsonschema.compile(schema, handlers=..., use_default=False)``, with the
    linear-time generators. Raises what fastjsonschema raises, and PatternError.

    Without ``fast_fail`` the validator goes on past the first error and raises
    JsonSchemaValuesException with every error found (at most
    MAX_INPUT_PROBLEMS_COUNTED): slower, for explaining a value already refused."""
    # fastjsonschema rewrites the $refs of what it compiles in place: give it a copy.
    schema = msgspec.json.decode(msgspec.json.encode(schema))
    base = _generator_class(schema)
    formats = _FORMATS[base]
    resolver = RefResolver.from_schema(schema, handlers=handlers, store={})
    generator = _LINEAR[base](
        schema,
        resolver=resolver,
        formats=formats,
        use_default=False,
        use_formats=True,
        fast_fail=fast_fail,
    )
    state = generator.global_state
    exec(generator.func_code, state)  # fastjsonschema's own generated code
    function = state[resolver.get_scope_name()]
    return functools.partial(function, custom_formats=formats)
