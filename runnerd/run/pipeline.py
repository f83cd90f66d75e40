"""The run pipeline, the same for every surface: check input, run in a jail, check output.

Refusals before the sandbox starts raise ``InputRejected``: they are not runs. Once the
sandbox starts, the answer is always a ``RunResult`` with status ``succeeded``,
``failed`` or ``timed_out``, whatever the tool did. Inputs, outputs and secrets are
never written to disk or logged here; errors and logs are scrubbed of secrets.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import marshal
import math
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

import fastjsonschema
import msgspec

from runnerd.after_answer import after_answer
from runnerd.checks.nesting import nesting_over
from runnerd.checks.pool import Checker, CheckTimedOut, Validators
from runnerd.checks.schemas import SchemaError
from runnerd.errors import RunnerdError
from runnerd.limits import MAX_ERROR_CHARS, MAX_INPUT_BYTES, MAX_JSON_DEPTH, MAX_OUTPUT_BYTES
from runnerd.run.jail import EGRESS_SOCKET, JailEnd, Job, Outcome, Sandbox
from runnerd.run.package_envs import EnvManager
from runnerd.run.scrub import Scrubber

__all__ = [
    "CheckedInput",
    "InputRejected",
    "Pipeline",
    "RunResult",
    "RunnableTool",
    "ToolUnusable",
]

SUCCEEDED, FAILED, TIMED_OUT = "succeeded", "failed", "timed_out"
COMPILED_CACHE = 1024  # Python tools whose bytecode the daemon keeps


class RunnableTool(Protocol):
    """What a run needs of a tool: a stored ToolRecord and a local Bundle Tool both fit."""

    @property
    def name(self) -> str: ...
    @property
    def language(self) -> str: ...
    @property
    def timeout_ms(self) -> int: ...
    @property
    def input_schema(self) -> dict[str, Any]: ...
    @property
    def output_schema(self) -> dict[str, Any]: ...
    @property
    def packages(self) -> tuple[str, ...]: ...
    @property
    def source_path(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def compiled_js(self) -> str | None: ...
    @property
    def module_format(self) -> str | None: ...


class InputRejected(RunnerdError):
    """The call is refused before any sandbox starts. ``code`` is INVALID_INPUT or
    INPUT_TOO_LARGE; ``pointer`` is the JSON pointer of the failing field."""

    status = 400

    def __init__(self, code: str, message: str, pointer: str | None = None) -> None:
        self.code = self.reason = code
        self.pointer = pointer
        super().__init__(message)

    def wire_details(self) -> dict[str, Any]:
        return {} if self.pointer is None else {"pointer": self.pointer}


class ToolUnusable(RunnerdError):
    """A stored tool this runnerd cannot call (its schema breaks a rule added since)."""

    reason, status = "TOOL_UNUSABLE", 409


class RunResult(msgspec.Struct, omit_defaults=True):
    status: str  # succeeded | failed | timed_out
    output: Any
    error: str | None
    duration_ms: int  # what the caller waited for the run: checks, jail and tool
    logs: str = ""  # stdout+stderr, scrubbed; for builders, never stored
    logs_truncated: bool = False
    # What the run reached through the egress proxy (EgressPass.figures), if it had a grant,
    # scrubbed of secrets; and what its audit entry keeps of it (EgressPass.summary).
    egress: list[dict[str, Any]] | None = None
    egress_audit: dict[str, Any] | None = None


class CheckedInput(msgspec.Struct, frozen=True):
    """An input that passed its checks: the JSON sent to the jail, and how long the
    checks took (part of the run's duration)."""

    encoded: bytes
    check_s: float


def tool_key(tool: RunnableTool, version_id: str | None = None) -> str:
    """A cache key for a tool's compiled schemas and code: the stored version when there
    is one, else a digest of everything that defines the tool."""
    if version_id:
        return f"{version_id}/{tool.name}"
    digest = hashlib.sha256()
    for part in (tool.name, tool.source, tool.compiled_js or "", tool.module_format or ""):
        digest.update(part.encode() + b"\0")
    digest.update(msgspec.json.encode([tool.input_schema, tool.output_schema]))
    return f"local-{digest.hexdigest()[:24]}"


def _code_file(tool: RunnableTool) -> tuple[str, str]:
    """The file name a tool's code has in the jail, and its content."""
    if tool.language == "python":
        return f"{tool.name}.py", tool.source
    if tool.language == "typescript":
        assert tool.compiled_js is not None, "TypeScript is compiled at upload"
    ext = ".cjs" if tool.module_format == "cjs" else ".mjs"
    return f"{tool.name}{ext}", tool.compiled_js or tool.source


def metered_ms(seconds: float) -> int:
    """A run's duration in whole milliseconds, rounded up: a run that started is metered
    (a warm run takes under a millisecond, which rounding to the nearest made free)."""
    return max(1, math.ceil(seconds * 1000))


def _marshalled(source: str, path: str) -> bytes | None:
    try:
        code = compile(source, path, "exec", dont_inherit=True, optimize=0)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return marshal.dumps(code).hex().encode()


def _too_large(size: int | None) -> str:
    limit = f"output is larger than {MAX_OUTPUT_BYTES // (1024 * 1024)} MB, the limit of one run"
    return f"{limit} ({size:,} bytes)" if size else limit


def _pointer(path: list[Any]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path[1:])


def _schema_failure(exc: fastjsonschema.JsonSchemaValueException) -> tuple[str, str]:
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


def _too_deep(what: str) -> str:
    return f"{what} is nested deeper than {MAX_JSON_DEPTH} levels, the limit"


class Pipeline:
    """Runs tools: the same checks and the same jail for the daemon and ``tool test``."""

    def __init__(
        self,
        *,
        sandbox: Sandbox,
        envs: EnvManager | None = None,
        checker: Checker,
        validators: Validators | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.envs = envs
        self.checker = checker
        self.validators = validators or Validators()
        self._compiled: OrderedDict[str, bytes | None] = OrderedDict()

    async def _bytecode(self, tool: RunnableTool, key: str) -> bytes | None:
        """A Python tool's code compiled once (in a thread) and marshalled, as hex: the
        jail then never compiles, which costs it about 1 ms of CPU the first time in a
        process. None if it does not compile (the jail then reports the error)."""
        if key in self._compiled:
            self._compiled.move_to_end(key)
            return self._compiled[key]
        found = await asyncio.to_thread(_marshalled, tool.source, tool.source_path)
        self._compiled[key] = found
        while len(self._compiled) > COMPILED_CACHE:
            self._compiled.popitem(last=False)
        return found

    async def check_input(self, tool: RunnableTool, value: Any, *, key: str) -> CheckedInput:
        """The input as compact JSON, or InputRejected: size, nesting, then schema, in a
        checker thread within its time budget. Both schemas must compile (a version stored
        by an older runnerd may hold one that this one refuses: ToolUnusable)."""
        started = time.monotonic()
        try:
            encoded = msgspec.json.encode(value)
        except RecursionError:
            raise InputRejected("INVALID_INPUT", _too_deep("input")) from None

        def check() -> bytes:
            if len(encoded) > MAX_INPUT_BYTES:
                raise InputRejected(
                    "INPUT_TOO_LARGE",
                    f"input is {len(encoded):,} bytes; a call's input is at most "
                    f"{MAX_INPUT_BYTES // 1024} KB",
                )
            if nesting_over(encoded, MAX_JSON_DEPTH) is not None:
                raise InputRejected("INVALID_INPUT", _too_deep("input"))
            try:
                validate = self.validators.get(key, "input", tool.input_schema)
                self.validators.get(key, "output", tool.output_schema)
            except SchemaError as exc:
                raise ToolUnusable(
                    f"the tool {tool.name!r} cannot be called: its stored schema is refused "
                    f"by this runnerd ({exc}); deploy a version with a schema that passes"
                ) from None
            try:
                validate(value)
            except fastjsonschema.JsonSchemaValueException as exc:
                pointer, message = _schema_failure(exc)
                raise InputRejected("INVALID_INPUT", f"input {message}", pointer) from None
            return encoded

        # Inline only when both validators are compiled and the input's is cheap.
        work = self.validators.work(key, "input", len(encoded))
        if self.validators.work(key, "output", 0) is None:
            work = None
        try:
            encoded = await self.checker.run(check, work=work)
        except CheckTimedOut as exc:
            raise InputRejected(
                "INVALID_INPUT", f"checking the input against the input schema {exc}"
            ) from None
        return CheckedInput(encoded, time.monotonic() - started)

    async def run(
        self,
        tool: RunnableTool,
        value: Any,
        *,
        checked: CheckedInput | None = None,
        secrets: Mapping[str, str] | None = None,
        version_id: str | None = None,
        egress: tuple[str, ...] = (),
        install_id: str | None = None,
        logs: bool = True,
        on_end: JailEnd | None = None,
    ) -> RunResult:
        """Check ``value`` (unless ``checked`` is the result of check_input), run the tool
        once in a fresh jail, check what it returned.

        Raises InputRejected before the sandbox starts; after that, always a RunResult.
        Without ``logs`` (callers that do not show them) the answer comes as soon as the
        tool has replied. ``egress``: the destinations the run may reach through the proxy
        (an install's grant, ``install_id``'s); none, no network. ``on_end``: called
        once the run's jail is gone (Sandbox.run); not taken if the run fails before it.
        """
        started = time.monotonic()
        key = tool_key(tool, version_id)
        # The checks are part of what the caller waits for: counted from here when they
        # run now, added below when they ran before (check_input's own measure).
        checked_before = 0.0 if checked is None else checked.check_s
        if checked is None:
            checked = await self.check_input(tool, value, key=key)
        secrets = dict(secrets or {})
        scrub = Scrubber(secrets)
        env_dir = None
        if tool.packages and self.envs is not None:
            env_dir = await self.envs.ensure(tool.language, tuple(tool.packages))
        module, code = _code_file(tool)
        bytecode = None
        if tool.language == "python" and self.sandbox.python_bytecode:
            bytecode = await self._bytecode(tool, key)
        proxy = self.sandbox.proxy
        grant = None
        if egress and proxy is not None:
            await proxy.ensure_started()
            grant = proxy.open_run(egress, install_id)
        request = (
            b'{"input":' + checked.encoded
            + b',"env":' + msgspec.json.encode(secrets)
            + b',"code":' + msgspec.json.encode(code)
            + b',"file":' + msgspec.json.encode(tool.source_path)
            + b',"module":' + msgspec.json.encode(module)
            + (b',"bytecode":"' + bytecode + b'"' if bytecode else b"")
            + (b',"egress":' + msgspec.json.encode({"socket": EGRESS_SOCKET, "token": grant.token})
               if grant is not None else b"")
            + b"}"
        )  # fmt: skip
        job = Job(
            language=tool.language,
            timeout_ms=tool.timeout_ms,
            request=request,
            env_dir=env_dir,
            egress=grant,
            log_slack=scrub.longest,
        )
        try:
            outcome = await self.sandbox.run(job, logs=logs, refill=False, on_end=on_end)
            size = len(outcome.result or b"") + len(outcome.logs)
            result = await self.checker.run(
                lambda: self._judge(tool, key, outcome, scrub),
                work=self.validators.work(key, "output", size),
            )
        except CheckTimedOut as exc:
            result = RunResult(
                status=FAILED,
                output=None,
                error=f"checking the output against the output schema {exc}",
                duration_ms=0,
                logs="",
                logs_truncated=outcome.logs_truncated,
            )
        finally:
            # The run is over for the network too: its credential dies, its tunnels close.
            if proxy is not None and grant is not None:
                proxy.end_run(grant)
            # After the answer is sent: the next jail's fork would delay it.
            after_answer(functools.partial(self.sandbox.refill, job.kind))
        if grant is not None and proxy is not None:
            result.egress = grant.figures(scrub.scrub)  # the tool's names, scrubbed
            result.egress_audit = grant.summary()
        result.duration_ms = metered_ms(time.monotonic() - started + checked_before)
        return result

    def _judge(self, tool: RunnableTool, key: str, out: Outcome, scrub: Scrubber) -> RunResult:
        """What the jail's outcome means (in a checker thread): a status, the checked
        output, errors and logs scrubbed of secrets before they are cut to size."""
        log_limit = self.sandbox.limits.log_bytes
        logs = scrub.scrub(out.logs.decode("utf-8", "replace"))
        encoded_logs = logs.encode()
        logs_truncated = out.logs_truncated or len(encoded_logs) > log_limit
        logs = encoded_logs[:log_limit].decode("utf-8", "ignore")

        def result(status: str, error: str | None, output: Any = None) -> RunResult:
            return RunResult(
                status=status,
                output=output,
                error=_capped(scrub.scrub(error), MAX_ERROR_CHARS) if error else None,
                duration_ms=0,  # set by run(), which knows when the run began
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
            return result(FAILED, self._no_result(out))
        # {"ok": true, "output": ...} wraps the output in one more level.
        if nesting_over(out.result, MAX_JSON_DEPTH + 1) is not None:
            return result(FAILED, _too_deep("output"))
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
            self.validators.get(key, "output", tool.output_schema)(output)
        except fastjsonschema.JsonSchemaValueException as exc:
            _, message = _schema_failure(exc)
            return result(FAILED, f"output does not match the output schema: {message}")
        except RecursionError:
            return result(FAILED, _too_deep("output"))
        leaked = scrub.found_in(raw.decode())
        if leaked:
            return result(
                FAILED, f"output withheld: it contains the value of the secret {', '.join(leaked)}"
            )
        return result(SUCCEEDED, None, output)

    def _no_result(self, out: Outcome) -> str:
        code = out.exit_code
        jail = out.jail_log.strip()
        if (code is not None and code in (137, -9)) or "SIGKILL" in jail:
            lim = self.sandbox.limits
            return (
                f"the tool was killed before it returned: it reached a limit "
                f"(memory {lim.memory_mb} MB, {lim.pids} processes, or CPU time)"
            )
        if code == 255 and jail:
            return f"the sandbox could not start the tool: {jail.splitlines()[-1]}"
        if code is not None and code > 128:
            return f"the tool was killed by signal {code - 128} before it returned"
        return f"the tool exited with code {code} without returning a result"
