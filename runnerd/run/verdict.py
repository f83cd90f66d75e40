"""A run's verdict: what a jail's Outcome means, as a RunResult.

``judge`` runs in a checker thread (Pipeline.run): the status (succeeded, failed,
timed_out), the output checked against the output schema and kept from the caller when it
holds a secret, the error text a caller reads, and the logs, scrubbed of secrets before
anything is cut to size. The messages for a value that fails its schema or nests too deep
are the ones the input checks give too (Pipeline.check_input).
"""

from __future__ import annotations

from typing import Any, Final

import fastjsonschema
import msgspec

from runnerd.checks.nesting import nesting_over
from runnerd.checks.pool import CheckTimedOut, Validators
from runnerd.limits import MAX_ERROR_CHARS, MAX_JSON_DEPTH, MAX_OUTPUT_BYTES
from runnerd.model import RunEnd, Tool
from runnerd.run.jail import Limits, Outcome
from runnerd.run.scrub import Scrubber

__all__ = [
    "FAILED",
    "SUCCEEDED",
    "TIMED_OUT",
    "RunResult",
    "judge",
    "schema_failure",
    "too_deep",
    "unchecked",
]

SUCCEEDED: Final[RunEnd] = "succeeded"
FAILED: Final[RunEnd] = "failed"
TIMED_OUT: Final[RunEnd] = "timed_out"


class RunResult(msgspec.Struct, omit_defaults=True):
    """What a run came to, as every surface answers it (and the store records it)."""

    status: RunEnd
    output: Any
    error: str | None
    duration_ms: int  # what the caller waited for the run: checks, jail and tool
    logs: str = ""  # stdout+stderr, scrubbed; for builders, never stored
    logs_truncated: bool = False
    # What the run reached through the egress proxy (EgressPass.figures), if it had a grant,
    # scrubbed of secrets; and what its audit entry keeps of it (EgressPass.summary).
    egress: list[dict[str, Any]] | None = None
    egress_audit: dict[str, Any] | None = None


def judge(
    tool: Tool,
    key: str,
    out: Outcome,
    *,
    scrub: Scrubber,
    validators: Validators,
    limits: Limits,
) -> RunResult:
    """What the jail's outcome means (in a checker thread): a status, the output checked
    against the tool's output schema (``validators``' under ``key``), errors and logs
    scrubbed of secrets before they are cut to size. ``duration_ms`` is left 0: the
    caller knows when the run began."""
    log_limit = limits.log_bytes
    logs = scrub.scrub(out.logs.decode("utf-8", "replace"))
    encoded_logs = logs.encode()
    logs_truncated = out.logs_truncated or len(encoded_logs) > log_limit
    logs = encoded_logs[:log_limit].decode("utf-8", "ignore")

    def result(status: RunEnd, error: str | None, output: Any = None) -> RunResult:
        return RunResult(
            status=status,
            output=output,
            error=_capped(scrub.scrub(error), MAX_ERROR_CHARS) if error else None,
            duration_ms=0,  # set by Pipeline.run, which knows when the run began
            logs=logs,
            logs_truncated=logs_truncated,
        )

    if out.timed_out:
        return result(
            TIMED_OUT,
            f"timed out after {tool.timeout_ms} ms (the tool's "
            "timeoutMs, counted from the start of the sandbox)",
        )
    if out.result_too_large:
        return result(FAILED, _too_large(None))
    if out.result is None:
        return result(FAILED, _no_result(out, limits))
    # {"ok": true, "output": ...} wraps the output in one more level.
    if nesting_over(out.result, MAX_JSON_DEPTH + 1) is not None:
        return result(FAILED, too_deep("output"))
    try:
        reply = msgspec.json.decode(out.result)
        ok = reply["ok"]
    except (msgspec.DecodeError, KeyError, TypeError, RecursionError):
        return result(
            FAILED,
            "the tool's result channel held something that is not a "
            "result (did the tool write to it?)",
        )
    if not ok:
        if reply.get("kind") == "output":
            return result(FAILED, f"output is not JSON: {reply.get('message')}")
        stack = reply.get("stack") or ""
        error = f"{reply.get('type')}: {reply.get('message')}"
        return result(FAILED, f"{error}\n{stack}" if stack else error)
    output = reply.get("output")
    raw = msgspec.json.encode(output)
    if len(raw) > MAX_OUTPUT_BYTES:
        return result(FAILED, _too_large(len(raw)))
    try:
        validators.get(key, "output", tool.output_schema)(output)
    except fastjsonschema.JsonSchemaValueException as exc:
        _, message = schema_failure(exc)
        return result(FAILED, f"output does not match the output schema: {message}")
    except RecursionError:
        return result(FAILED, too_deep("output"))
    leaked = scrub.found_in(raw.decode())
    if leaked:
        return result(
            FAILED, f"output withheld: it contains the value of the secret {', '.join(leaked)}"
        )
    return result(SUCCEEDED, None, output)


def unchecked(out: Outcome, exc: CheckTimedOut) -> RunResult:
    """The verdict on a run whose output could not be checked within the check budget."""
    return RunResult(
        status=FAILED,
        output=None,
        error=f"checking the output against the output schema {exc}",
        duration_ms=0,
        logs="",
        logs_truncated=out.logs_truncated,
    )


def _no_result(out: Outcome, limits: Limits) -> str:
    """Why a tool that started wrote no result: a limit, the sandbox, a signal, its exit."""
    code = out.exit_code
    jail = out.jail_log.strip()
    if (code is not None and code in (137, -9)) or "SIGKILL" in jail:
        return (
            f"the tool was killed before it returned: it reached a limit "
            f"(memory {limits.memory_mb} MB, {limits.pids} processes, or CPU time)"
        )
    if code == 255 and jail:
        return f"the sandbox could not start the tool: {jail.splitlines()[-1]}"
    if code is not None and code > 128:
        return f"the tool was killed by signal {code - 128} before it returned"
    return f"the tool exited with code {code} without returning a result"


def _too_large(size: int | None) -> str:
    limit = f"output is larger than {MAX_OUTPUT_BYTES // (1024 * 1024)} MB, the limit of one run"
    return f"{limit} ({size:,} bytes)" if size else limit


def _pointer(path: list[Any]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path[1:])


def schema_failure(exc: fastjsonschema.JsonSchemaValueException) -> tuple[str, str]:
    """The JSON pointer of the failing field and a message naming it."""
    path = list(exc.path or ["data"])
    if exc.rule == "required" and isinstance(exc.value, dict):
        missing = [k for k in (exc.rule_definition or []) if k not in exc.value]
        if missing:
            pointer = _pointer([*path, missing[0]])
            return pointer, f"{pointer} is required"
    pointer = _pointer(path)
    what = exc.message.split(" ", 1)[1] if " " in exc.message else exc.message
    return pointer or "/", f"{pointer or 'the value'} {what}"


def _capped(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit:,} more characters cut]"


def too_deep(what: str) -> str:
    """The message for ``what`` (input, output) nested past the limit."""
    return f"{what} is nested deeper than {MAX_JSON_DEPTH} levels, the limit"
