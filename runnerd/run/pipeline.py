"""The run pipeline, the same for every surface: check input, run in a jail, check output.

Refusals before the sandbox starts raise ``InputRejected``: they are not runs. Once the
sandbox starts, the answer is always a ``RunResult`` with status ``succeeded``,
``failed`` or ``timed_out``, whatever the tool did (run/verdict.py judges the jail's
outcome). Inputs, outputs and secrets are never written to disk or logged here; errors
and logs are scrubbed of secrets.
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
from typing import Any

import fastjsonschema
import msgspec

from runnerd.after_answer import after_answer
from runnerd.checks.nesting import nesting_over
from runnerd.checks.pool import Checker, CheckTimedOut, Validators
from runnerd.checks.schemas import SchemaError
from runnerd.errors import InputTooLarge, InvalidInput, ToolUnusable
from runnerd.limits import COMPILED_CACHE_TOOLS, MAX_INPUT_BYTES, MAX_JSON_DEPTH
from runnerd.model import Tool
from runnerd.run.jail import EGRESS_SOCKET, JailEnd, Job, Sandbox
from runnerd.run.package_envs import EnvManager
from runnerd.run.scrub import Scrubber
from runnerd.run.verdict import RunResult, judge, schema_failure, too_deep, unchecked

__all__ = ["CheckedInput", "Pipeline", "metered_ms", "tool_key"]


class CheckedInput(msgspec.Struct, frozen=True):
    """An input that passed its checks: the JSON sent to the jail, and how long the
    checks took (part of the run's duration)."""

    encoded: bytes
    check_s: float


def tool_key(tool: Tool, version_id: str | None = None) -> str:
    """A cache key for a tool's compiled schemas and code: the stored version when there
    is one, else a digest of everything that defines the tool."""
    if version_id:
        return f"{version_id}/{tool.name}"
    digest = hashlib.sha256()
    for part in (tool.name, tool.source, tool.compiled_js or "", tool.module_format or ""):
        digest.update(part.encode() + b"\0")
    digest.update(msgspec.json.encode([tool.input_schema, tool.output_schema]))
    return f"local-{digest.hexdigest()[:24]}"


def _code_file(tool: Tool) -> tuple[str, str]:
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

    async def _bytecode(self, tool: Tool, key: str) -> bytes | None:
        """A Python tool's code compiled once (in a thread) and marshalled, as hex: the
        jail then never compiles, which costs it about 1 ms of CPU the first time in a
        process. None if it does not compile (the jail then reports the error)."""
        if key in self._compiled:
            self._compiled.move_to_end(key)
            return self._compiled[key]
        found = await asyncio.to_thread(_marshalled, tool.source, tool.source_path)
        self._compiled[key] = found
        while len(self._compiled) > COMPILED_CACHE_TOOLS:
            self._compiled.popitem(last=False)
        return found

    async def check_input(self, tool: Tool, value: Any, *, key: str) -> CheckedInput:
        """The input as compact JSON, or InputRejected: size, nesting, then schema, in a
        checker thread within its time budget. Both schemas must compile (a version stored
        by an older runnerd may hold one that this one refuses: ToolUnusable)."""
        started = time.monotonic()
        try:
            encoded = msgspec.json.encode(value)
        except RecursionError:
            raise InvalidInput(too_deep("input")) from None

        def check() -> bytes:
            if len(encoded) > MAX_INPUT_BYTES:
                raise InputTooLarge(
                    f"input is {len(encoded):,} bytes; a call's input is at most "
                    f"{MAX_INPUT_BYTES // 1024} KB",
                )
            if nesting_over(encoded, MAX_JSON_DEPTH) is not None:
                raise InvalidInput(too_deep("input"))
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
                pointer, message = schema_failure(exc)
                raise InvalidInput(f"input {message}", pointer) from None
            return encoded

        # Inline only when both validators are compiled and the input's is cheap.
        work = self.validators.work(key, "input", len(encoded))
        if self.validators.work(key, "output", 0) is None:
            work = None
        try:
            encoded = await self.checker.run(check, work=work)
        except CheckTimedOut as exc:
            raise InvalidInput(f"checking the input against the input schema {exc}") from None
        return CheckedInput(encoded, time.monotonic() - started)

    async def run(
        self,
        tool: Tool,
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
            building = time.monotonic()
            env_dir = await self.envs.ensure(tool.language, tuple(tool.packages))
            started += time.monotonic() - building  # a build is never metered
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
        prepared = time.monotonic() - started
        try:
            outcome = await self.sandbox.run(job, logs=logs, refill=False, on_end=on_end)
            judged_from = time.monotonic()
            size = len(outcome.result or b"") + len(outcome.logs)
            result = await self.checker.run(
                lambda: judge(
                    tool,
                    key,
                    outcome,
                    scrub=scrub,
                    validators=self.validators,
                    limits=self.sandbox.limits,
                ),
                work=self.validators.work(key, "output", size),
            )
        except CheckTimedOut as exc:
            result = unchecked(outcome, exc)
        finally:
            # The run is over for the network too: its credential dies, its tunnels close.
            if proxy is not None and grant is not None:
                proxy.end_run(grant)
            # After the answer is sent: the next jail's fork would delay it.
            after_answer(functools.partial(self.sandbox.warm_pool.refill, job.kind))
        if grant is not None and proxy is not None:
            result.egress = grant.figures(scrub.scrub)  # the tool's names, scrubbed
            result.egress_audit = grant.summary()
        # The checks' time and the jail's (at most the tool's timeout, however late this
        # daemon came back to a reply waiting in its pipe: a stall is not the tool's).
        judged = time.monotonic() - judged_from
        jailed = outcome.duration_ms / 1000
        result.duration_ms = metered_ms(checked_before + prepared + jailed + judged)
        return result
