"""The run pipeline, the same for every surface: check input, run in a jail, check output.

Refusals before the sandbox starts raise ``InputRejected``: they are not runs. Once the
sandbox starts, the answer is always a ``RunResult`` with status ``succeeded``,
``failed`` or ``timed_out``, whatever the tool did. Inputs, outputs and secrets are
never written to disk or logged here; errors and logs are scrubbed of secrets.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import fastjsonschema
import msgspec

from runnerd.constants import MAX_INPUT_BYTES, MAX_OUTPUT_BYTES
from runnerd.envs import EnvManager
from runnerd.errors import RunnerdError
from runnerd.sandbox import Job, Outcome, Sandbox
from runnerd.schemas import compile_schema
from runnerd.secrets import Scrubber

__all__ = [
    "InputRejected",
    "RunResult",
    "RunnableTool",
    "Runner",
    "Validators",
]

SUCCEEDED, FAILED, TIMED_OUT = "succeeded", "failed", "timed_out"


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

    def __init__(self, code: str, message: str, pointer: str | None = None) -> None:
        self.code = code
        self.pointer = pointer
        super().__init__(message)


class RunResult(msgspec.Struct, omit_defaults=True):
    status: str  # succeeded | failed | timed_out
    output: Any
    error: str | None
    duration_ms: int
    logs: str = ""  # stdout+stderr, scrubbed; for builders, never stored
    logs_truncated: bool = False


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


class Validators:
    """fastjsonschema validators, compiled once per (tool key, input|output), LRU-bounded."""

    def __init__(self, capacity: int = 2048) -> None:
        self.capacity = capacity
        self._cache: OrderedDict[tuple[str, str], Callable[[Any], Any]] = OrderedDict()

    def get(self, key: str, which: str, schema: dict[str, Any]) -> Callable[[Any], Any]:
        slot = (key, which)
        found = self._cache.get(slot)
        if found is None:
            found = self._cache[slot] = compile_schema(schema)
            if len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(slot)
        return found


def _code_file(tool: RunnableTool) -> tuple[str, str]:
    """The file name a tool's code has in the jail, and its content."""
    if tool.language == "python":
        return f"{tool.name}.py", tool.source
    if tool.language == "typescript":
        assert tool.compiled_js is not None, "TypeScript is compiled at upload"
        return f"{tool.name}.mjs", tool.compiled_js
    ext = ".cjs" if tool.module_format == "cjs" else ".mjs"
    return f"{tool.name}{ext}", tool.source


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


class Runner:
    """Runs tools: the same checks and the same jail for the daemon and ``tool test``."""

    def __init__(
        self,
        *,
        sandbox: Sandbox,
        envs: EnvManager | None = None,
        validators: Validators | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.envs = envs
        self.validators = validators or Validators()

    def check_input(self, tool: RunnableTool, value: Any, *, key: str) -> bytes:
        """The input as compact JSON, or InputRejected (size first, then schema)."""
        encoded = msgspec.json.encode(value)
        if len(encoded) > MAX_INPUT_BYTES:
            raise InputRejected(
                "INPUT_TOO_LARGE",
                f"input is {len(encoded):,} bytes; a call's input is at most "
                f"{MAX_INPUT_BYTES // 1024} KB",
            )
        try:
            self.validators.get(key, "input", tool.input_schema)(value)
        except fastjsonschema.JsonSchemaValueException as exc:
            pointer, message = _schema_failure(exc)
            raise InputRejected("INVALID_INPUT", f"input {message}", pointer) from None
        return encoded

    async def run(
        self,
        tool: RunnableTool,
        value: Any,
        *,
        secrets: Mapping[str, str] | None = None,
        version_id: str | None = None,
        network: bool = False,
        logs: bool = True,
    ) -> RunResult:
        """Check ``value``, run the tool once in a fresh jail, check what it returned.

        Raises InputRejected before the sandbox starts; after that, always a RunResult.
        Without ``logs`` (callers that do not show them) the answer comes as soon as the
        tool has replied.
        """
        key = tool_key(tool, version_id)
        encoded = self.check_input(tool, value, key=key)
        secrets = dict(secrets or {})
        env_dir = None
        if tool.packages and self.envs is not None:
            env_dir = await self.envs.ensure(tool.language, tuple(tool.packages))
        module, code = _code_file(tool)
        request = (
            b'{"input":' + encoded
            + b',"env":' + msgspec.json.encode(secrets)
            + b',"code":' + msgspec.json.encode(code)
            + b',"file":' + msgspec.json.encode(tool.source_path)
            + b',"module":' + msgspec.json.encode(module)
            + b"}"
        )  # fmt: skip
        job = Job(
            language=tool.language,
            timeout_ms=tool.timeout_ms,
            request=request,
            env_dir=env_dir,
            network=network,
        )
        outcome = await self.sandbox.run(job, logs=logs)
        return self._judge(tool, key, outcome, Scrubber(secrets))

    def _judge(self, tool: RunnableTool, key: str, out: Outcome, scrub: Scrubber) -> RunResult:
        logs = scrub.scrub(out.logs.decode("utf-8", "replace"))

        def result(status: str, error: str | None, output: Any = None) -> RunResult:
            return RunResult(
                status=status,
                output=output,
                error=scrub.scrub(error) if error else None,
                duration_ms=out.duration_ms,
                logs=logs,
                logs_truncated=out.logs_truncated,
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
        try:
            reply = msgspec.json.decode(out.result)
            ok = reply["ok"]
        except (msgspec.DecodeError, KeyError, TypeError):
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
