"""Checks of inputs and outputs, off the event loop and within a time budget.

A check (JSON decoding, nesting, size, a tool's schema, a search for secrets) is CPU work
whose cost the caller or the tool chooses. Run on the event loop, one slow check would
stall every request; so each runs in one of a few checker threads, and the loop only
waits for its answer. A check that outlives its budget is abandoned with CheckTimedOut,
and its thread is interrupted (an exception raised into it between two bytecodes), so a
hostile value holds a checker for at most its budget. Every step a check takes is linear
in its input (patterns on RE2, uniqueItems hashed, nesting capped), so a check that
returns to Python soon after its budget is the worst case.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import fastjsonschema

from runnerd.checks.explain import input_refusal
from runnerd.checks.schemas import SchemaError, compile_schema, schema_cost
from runnerd.limits import MAX_INLINE_CHECK_WORK, VALIDATOR_CACHE

__all__ = ["CheckTimedOut", "Checker", "Validators"]

T = TypeVar("T")
log = logging.getLogger("runnerd")


def _set_async_exc(thread: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in ``thread`` at its next bytecode; None clears a pending one."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread), None if exc is None else ctypes.py_object(exc)
    )


class CheckTimedOut(Exception):
    """A check took longer than its budget and was abandoned."""


class _Interrupt(BaseException):
    """Raised into a checker thread whose check ran out of time. A BaseException, so no
    ``except Exception`` in a validator can swallow it."""


class _Job:
    """One check: the function, where its answer goes, and who is running it."""

    def __init__(self, fn: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> None:
        self.fn = fn
        self.loop = loop
        self.answer: asyncio.Future[Any] = loop.create_future()
        self.lock = threading.Lock()
        self.thread: int | None = None
        self.abandoned = False

    def run(self) -> None:
        with self.lock:
            if self.abandoned:
                return
            self.thread = threading.get_ident()
        outcome: tuple[bool, Any]
        try:
            outcome = (True, self.fn())
        except _Interrupt:
            return
        except BaseException as exc:
            outcome = (False, exc)
        finally:
            with self.lock:
                self.thread = None
                if self.abandoned:  # an interrupt may still be pending: drop it
                    _set_async_exc(threading.get_ident(), None)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for this
            self.loop.call_soon_threadsafe(self._settle, outcome)

    def _settle(self, outcome: tuple[bool, Any]) -> None:
        if self.answer.done():
            return
        ok, value = outcome
        if ok:
            self.answer.set_result(value)
        else:
            self.answer.set_exception(value)

    def abandon(self) -> None:
        with self.lock:
            self.abandoned = True
            if self.thread is not None:
                _set_async_exc(self.thread, _Interrupt)


class Checker:
    """``workers`` daemon threads that run checks, each within ``budget_s``."""

    def __init__(self, *, budget_s: float, workers: int = 2) -> None:
        self.budget_s = budget_s
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"runnerd-check-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get()
                if job is None:
                    return
                job.run()
            except _Interrupt:
                continue  # delivered after its check ended; that check is answered already
            except Exception as exc:  # a checker thread must never die; its check is lost
                log.error("check thread: unexpected %s", type(exc).__name__)

    async def run(self, fn: Callable[[], T], *, work: int | None = None) -> T:
        """``fn()`` in a checker thread; CheckTimedOut when it outlives the budget (counted
        from now, so a wait for a free checker counts too). Raises what ``fn`` raises.

        ``work``, a known bound on what ``fn`` does, at most MAX_INLINE_CHECK_WORK: ``fn``
        runs right here instead, as a thread's round trip would cost more than the check."""
        if work is not None and work <= MAX_INLINE_CHECK_WORK:
            return fn()
        job = _Job(fn, asyncio.get_running_loop())
        self._jobs.put(job)
        try:
            return await asyncio.wait_for(asyncio.shield(job.answer), self.budget_s)
        except TimeoutError:
            job.abandon()
            raise CheckTimedOut(
                f"took longer than its budget of {self.budget_s * 1000:.0f} ms"
            ) from None
        except asyncio.CancelledError:
            job.abandon()
            raise

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)


class Validators:
    """Compiled schema validators per (tool key, input|output), LRU-bounded, each with
    its schema_cost; safe to use from several checker threads.

    An input validator raises InvalidInput naming every problem of a refused value
    (runnerd.checks.explain), not fastjsonschema's first error: a second validator,
    compiled when an input of that tool first fails, explains it. A valid input only
    meets the fast validator."""

    def __init__(self, capacity: int = VALIDATOR_CACHE) -> None:
        self.capacity = capacity
        self._cache: OrderedDict[tuple[str, str], tuple[Callable[[Any], Any], int | None]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def get(self, key: str, which: str, schema: dict[str, Any]) -> Callable[[Any], Any]:
        slot = (key, which)
        with self._lock:
            found = self._cache.get(slot)
            if found is not None:
                self._cache.move_to_end(slot)
                return found[0]
        compiled = compile_schema(schema)  # outside the lock: compiling takes a while
        if which == "input":
            compiled = self._explaining(compiled, schema)
        with self._lock:
            self._cache[slot] = (compiled, schema_cost(schema))
            if len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return compiled

    @staticmethod
    def _explaining(fast: Callable[[Any], Any], schema: dict[str, Any]) -> Callable[[Any], Any]:
        """``fast``, raising InvalidInput with every problem when it refuses a value."""
        explain: list[Callable[[Any], Any] | None] = []  # compiled on the first refusal

        def check(value: Any) -> Any:
            try:
                return fast(value)
            except fastjsonschema.JsonSchemaValueException as exc:
                if not explain:
                    try:
                        explain.append(compile_schema(schema, every_error=True))
                    except SchemaError:  # cannot happen for a schema ``fast`` compiled
                        explain.append(None)
                raise input_refusal(exc, explain[0], value) from None

        return check

    def work(self, key: str, which: str, size: int) -> int | None:
        """A bound on the work of checking a value of ``size`` bytes against this
        compiled schema (schema bytes x value bytes), or None: not compiled yet, or the
        schema recurses, so no bound is known."""
        with self._lock:
            found = self._cache.get(slot := (key, which))
            if found is None or found[1] is None:
                return None
            self._cache.move_to_end(slot)
            return found[1] * max(size, 1)
