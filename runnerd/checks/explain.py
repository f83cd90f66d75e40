"""Why an input was refused: every field that breaks the tool's input schema.

The input check stops at the first error, so a valid input costs no more than it must.
Only once it has failed does a second, slower validator of the same schema walk the
whole value and collect each error (at most MAX_INPUT_PROBLEMS_COUNTED), which become
the refusal's problems: a JSON pointer and a message each, MAX_INPUT_PROBLEMS of them
shown, then how many more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fastjsonschema

from runnerd.errors import InvalidInput
from runnerd.limits import MAX_INPUT_PROBLEMS, MAX_INPUT_PROBLEMS_COUNTED

__all__ = ["input_refusal", "problems_of"]


def _pointer(path: list[Any]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path[1:])


def problems_of(exc: fastjsonschema.JsonSchemaValueException) -> list[tuple[str, str]]:
    """The (JSON pointer, message) of each field one error names: a ``required`` error
    names each missing key, anything else its own field ("/" for the whole value)."""
    path = list(exc.path or ["data"])
    if exc.rule == "required" and isinstance(exc.value, dict):
        missing = [k for k in (exc.rule_definition or []) if k not in exc.value]
        if missing:
            return [(p, f"{p} is required") for p in (_pointer([*path, k]) for k in missing)]
    pointer = _pointer(path)
    what = exc.message.split(" ", 1)[1] if " " in exc.message else exc.message
    return [(pointer or "/", f"{pointer or 'the value'} {what}")]


def input_refusal(
    first: fastjsonschema.JsonSchemaValueException,
    explain: Callable[[Any], Any] | None,
    value: Any,
) -> InvalidInput:
    """The refusal of ``value``, whose fast check raised ``first``: every problem
    ``explain`` (the collecting validator; None when it cannot be had) finds, the first
    error's leading. ``pointer`` and the message's start are what one error gave before."""
    found = problems_of(first)
    counted_all = True
    if explain is not None:
        try:
            explain(value)
        except fastjsonschema.JsonSchemaValuesException as exc:
            counted_all = len(exc.errors) < MAX_INPUT_PROBLEMS_COUNTED
            for error in exc.errors:
                found += [p for p in problems_of(error) if p not in found[:1]]
        except fastjsonschema.JsonSchemaValueException:
            pass  # raised by a part that always stops at once: the first error stands
    found = list(dict.fromkeys(found))  # one error can be met twice (through two $refs)
    shown, more = found[:MAX_INPUT_PROBLEMS], max(0, len(found) - MAX_INPUT_PROBLEMS)
    tail = f"; and {'' if counted_all else 'at least '}{more} more" if more else ""
    message = "input " + "; ".join(m for _, m in shown) + tail
    return InvalidInput(
        message,
        shown[0][0],
        problems=[{"pointer": p, "message": m} for p, m in shown],
        more=more,
    )
