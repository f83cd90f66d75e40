"""runnerd.checks.pool: checks off the event loop, within a budget, and inline only when a
bound on their work is known and small."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from runnerd.checks.pool import Checker, CheckTimedOut, Validators
from runnerd.checks.schemas import compile_schema, schema_cost
from runnerd.limits import MAX_INLINE_CHECK_WORK

# anyOf of two equal branches recursing into each item: 2**depth checks of a value that
# fails at the bottom.
EXPONENTIAL = {
    "$defs": {
        "n": {
            "anyOf": [
                {"type": "array", "items": {"$ref": "#/$defs/n"}},
                {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 0},
            ]
        }
    },
    "$ref": "#/$defs/n",
}


def deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_a_check_past_its_budget_is_abandoned_and_its_thread_freed() -> None:
    checker = Checker(budget_s=0.3, workers=1)
    validate = compile_schema(EXPONENTIAL)

    async def scenario() -> list[Any]:
        outcomes: list[Any] = []
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(CheckTimedOut, match="300 ms"):
                await checker.run(lambda: validate(deep(60)))
            outcomes.append(0.3 <= time.monotonic() - started < 10)  # abandoned, not done
            # The one checker thread was interrupted: it answers the next check at once.
            outcomes.append(await checker.run(lambda: threading.current_thread().name))
        return outcomes

    assert asyncio.run(scenario()) == [True, "runnerd-check-0"] * 3
    checker.close()


def test_a_check_that_raises_hands_its_exception_to_the_caller() -> None:
    checker = Checker(budget_s=2.0, workers=1)

    def fail() -> None:
        raise ValueError("bad value")

    async def scenario() -> None:
        with pytest.raises(ValueError, match="bad value"):
            await checker.run(fail)
        assert await checker.run(lambda: 42) == 42

    asyncio.run(scenario())
    checker.close()


def test_small_bounded_checks_run_inline_and_the_rest_in_a_thread() -> None:
    checker = Checker(budget_s=2.0, workers=1)

    async def where(work: int | None) -> str:
        return await checker.run(lambda: threading.current_thread().name, work=work)

    async def scenario() -> list[str]:
        return [await where(10), await where(MAX_INLINE_CHECK_WORK),
                await where(MAX_INLINE_CHECK_WORK + 1), await where(None)]  # fmt: skip

    assert asyncio.run(scenario()) == ["MainThread", "MainThread", "runnerd-check-0",
                                       "runnerd-check-0"]  # fmt: skip
    checker.close()


def test_work_is_known_only_for_compiled_schemas_without_refs() -> None:
    validators = Validators()
    flat = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$"}}}
    assert validators.work("t", "input", 100) is None  # not compiled yet
    validators.get("t", "input", flat)
    assert validators.work("t", "input", 100) == schema_cost(flat) * 100
    validators.get("t", "output", EXPONENTIAL)
    assert schema_cost(EXPONENTIAL) is None and validators.work("t", "output", 1) is None
