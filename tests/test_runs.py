"""Runs through the real jail: every status, every check around the sandbox, every
language and module kind, packages, and the secret rules."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import json
import os
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from conftest import make_tool, run_tool
from runnerd.errors import InputRejected
from runnerd.run.machine import Machine
from runnerd.run.pipeline import metered_ms
from runnerd.run.spawn import spawn
from runnerd.run.verdict import RunResult

OBJ = {"type": "object"}
ADD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["n"],
    "properties": {"n": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}}},
}


# --- languages and module kinds -------------------------------------------------------------

KINDS = [
    (".py", "def run(input):\n    return {'n': input['n'] + 1}\n"),
    (
        ".py",
        "import asyncio\nasync def run(input):\n    await asyncio.sleep(0)\n"
        "    return {'n': input['n'] + 1}\n",
    ),
    (
        ".ts",
        "interface In { n: number }\nexport function run(i: In): { n: number } {\n"
        "  return { n: i.n + 1 }\n}\n",
    ),
    (".mts", "export default async (i: { n: number }) => ({ n: i.n + 1 })\n"),
    (".mjs", "export default function (input) { return { n: input.n + 1 } }\n"),
    (".js", "module.exports = { run: (input) => ({ n: input.n + 1 }) }\n"),
    (".js", "module.exports = async function (input) { return { n: input.n + 1 } }\n"),
    (".js", "export async function run(input) { return { n: input.n + 1 } }\n"),
]


@pytest.mark.jail
@pytest.mark.smoke
@pytest.mark.parametrize(("ext", "source"), KINDS)
def test_every_language_and_module_kind_succeeds(machine: Machine, ext: str, source: str) -> None:
    tool = make_tool(machine, source, ext=ext, input_schema=ADD_SCHEMA)
    result = run_tool(machine, tool, {"n": 41})
    assert (result.status, result.output, result.error) == ("succeeded", {"n": 42}, None)
    assert result.duration_ms > 0


@pytest.mark.jail
@pytest.mark.network
def test_pinned_pypi_package(machine: Machine) -> None:
    source = "import attrs\n\ndef run(input):\n    return {'v': attrs.__version__}\n"
    tool = make_tool(machine, source, packages=("attrs==24.2.0",))
    assert run_tool(machine, tool).output == {"v": "24.2.0"}


@pytest.mark.jail
@pytest.mark.network
def test_pinned_npm_package(machine: Machine) -> None:
    source = (
        "import { z } from 'zod'\n"
        "const Offer = z.object({ n: z.number().int() })\n"
        "export function run(input: unknown) {\n"
        "  const r = Offer.safeParse(input)\n"
        "  return { ok: r.success }\n}\n"
    )
    tool = make_tool(machine, source, ext=".ts", packages=("zod@3.25.76",))
    assert run_tool(machine, tool, {"n": 1}).output == {"ok": True}
    assert run_tool(machine, tool, {"n": 1.5}).output == {"ok": False}


@pytest.mark.jail
@pytest.mark.network
def test_tools_with_the_same_packages_share_one_env(machine: Machine) -> None:
    one = make_tool(
        machine,
        "import attrs\ndef run(i):\n    return {}\n",
        name="one",
        packages=("attrs==24.2.0",),
    )
    two = make_tool(
        machine, "def run(i):\n    return {}\n", name="two", packages=("attrs==24.2.0",)
    )
    assert machine.envs.key(one.language, one.packages) == machine.envs.key(
        two.language, two.packages
    )
    keys = [e.key for e in machine.envs.list() if "attrs==24.2.0" in e.packages]
    assert len(keys) == 1


# --- refusals before the sandbox --------------------------------------------------------------


def test_invalid_input_is_refused_with_the_json_pointer(machine: Machine) -> None:
    tool = make_tool(machine, "def run(i):\n    return i\n", input_schema=ADD_SCHEMA)
    with pytest.raises(InputRejected) as caught:
        run_tool(machine, tool, {"n": 1, "tags": ["a", 2]})
    assert (caught.value.code, caught.value.pointer) == ("INVALID_INPUT", "/tags/1")
    with pytest.raises(InputRejected) as missing:
        run_tool(machine, tool, {"tags": []})
    assert (missing.value.pointer, str(missing.value)) == ("/n", "input /n is required")


@pytest.mark.jail
def test_input_over_256_kb_is_refused(machine: Machine) -> None:
    tool = make_tool(machine, "def run(i):\n    return {}\n")
    with pytest.raises(InputRejected) as caught:
        run_tool(machine, tool, {"s": "x" * (256 * 1024)})
    assert caught.value.code == "INPUT_TOO_LARGE"
    assert run_tool(machine, tool, {"s": "x" * (256 * 1024 - 20)}).status == "succeeded"


# --- failures after the start -----------------------------------------------------------------


@pytest.mark.jail
@pytest.mark.smoke
def test_thrown_exception_is_failed_with_type_message_and_tool_lines(machine: Machine) -> None:
    source = (
        "def helper(x):\n    raise ValueError(f'bad tier {x}')\n\ndef run(i):\n"
        "    return helper(i['tier'])\n"
    )
    result = run_tool(machine, make_tool(machine, source), {"tier": "gold"})
    assert result.status == "failed" and result.output is None
    assert result.error is not None
    lines = result.error.splitlines()
    assert lines[0] == "ValueError: bad tier gold"
    assert lines[1:] == [
        "  at run (t.py:5): return helper(i['tier'])",
        "  at helper (t.py:2): raise ValueError(f'bad tier {x}')",
    ]


@pytest.mark.jail
@pytest.mark.parametrize("bytecode", [True, False])
def test_python_tools_run_alike_from_bytecode_or_from_source(
    machine: Machine, monkeypatch: pytest.MonkeyPatch, bytecode: bool
) -> None:
    """Where the jails' interpreter reads the daemon's bytecode (the same magic number,
    as here), a Python tool comes compiled and its jail never compiles; elsewhere the
    jail compiles the source. The same answers, errors and tool lines either way."""
    assert machine.sandbox.python_bytecode  # this machine's jails read it
    monkeypatch.setattr(machine.sandbox, "python_bytecode", bytecode)
    mode = make_tool(machine, "import sys\ndef run(i):\n    return {'mode': sys.argv[2]}\n")
    assert run_tool(machine, mode).output == {"mode": "bytecode" if bytecode else "source"}
    source = (
        "def helper(x):\n    raise ValueError(f'bad {x}')\n\ndef run(i):\n    return helper(i)\n"
    )
    result = run_tool(machine, make_tool(machine, source), {"n": 1})
    assert result.error is not None
    assert result.error.splitlines() == [
        "ValueError: bad {'n': 1}",
        "  at run (t.py:5): return helper(i)",
        "  at helper (t.py:2): raise ValueError(f'bad {x}')",
    ]


@pytest.mark.jail
def test_typescript_error_stack_names_the_ts_lines(machine: Machine) -> None:
    source = (
        "type T = { a: number }\n\nexport function run(i: T): T {\n"
        "  throw new RangeError('too big: ' + i.a)\n}\n"
    )
    result = run_tool(machine, make_tool(machine, source, ext=".ts"), {"a": 7})
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith("RangeError: too big: 7\n")
    assert "t.ts:4:" in result.error


@pytest.mark.jail
def test_an_es_module_without_packages_runs_as_commonjs_keeping_its_meaning(
    machine: Machine,
) -> None:
    """An ES module that imports only Node's builtins is compiled to CommonJS at upload,
    so its jail needs no ES module loader; it stays strict code, its top-level `this`
    is undefined, its imports and exports work, and its stack names its own lines."""
    source = (
        "import { join } from 'node:path'\n"
        "export function run(input) {\n"
        "  if (input.fail) throw new RangeError('at line 4')\n"
        "  const strict = (function () { return this === undefined })()\n"
        "  return { strict, top: String(topThis), path: join('/a', 'b'),\n"
        "           commonjs: typeof module === 'object' }\n"
        "}\n"
        "const topThis = this\n"
    )
    tool = make_tool(machine, source, ext=".mjs")
    assert tool.module_format == "cjs"
    result = run_tool(machine, tool)
    assert (result.status, result.output) == (
        "succeeded",
        {"strict": True, "top": "undefined", "path": "/a/b", "commonjs": True},
    )
    failed = run_tool(machine, tool, {"fail": True})
    assert failed.error is not None and failed.error.startswith("RangeError: at line 4\n")
    assert "t.mjs:3:" in failed.error


@pytest.mark.jail
@pytest.mark.parametrize(
    ("source", "output"),
    [
        ("const n = await Promise.resolve(5)\nexport const run = () => ({ n })\n", {"n": 5}),
        (
            "export const run = () => ({ url: import.meta.url })\n",
            {"url": "file:///tmp/.tool/t.mjs"},
        ),
    ],
)
def test_an_es_module_that_needs_the_loader_runs_as_one(
    machine: Machine, source: str, output: dict[str, Any]
) -> None:
    tool = make_tool(machine, source, ext=".mjs")
    assert tool.module_format == "esm"
    result = run_tool(machine, tool)
    assert (result.status, result.output) == ("succeeded", output)


@pytest.mark.jail
@pytest.mark.parametrize("exported", ["null", "undefined", "42", "{ helper: 1 }"])
def test_a_commonjs_tool_exporting_no_function_is_told_so(machine: Machine, exported: str) -> None:
    """Required, not imported: what `module.exports` holds comes back as it is, null too."""
    result = run_tool(machine, make_tool(machine, f"module.exports = {exported}\n", ext=".js"))
    assert (result.status, result.error) == (
        "failed",
        "TypeError: the tool exports no run function and no default-exported function",
    )


@pytest.mark.jail
def test_javascript_rejected_promise_is_failed(machine: Machine) -> None:
    source = "export async function run() { throw new TypeError('nope') }\n"
    result = run_tool(machine, make_tool(machine, source, ext=".mjs"))
    assert (result.status, result.error is not None) == ("failed", True)
    assert result.error is not None and result.error.startswith("TypeError: nope")


@pytest.mark.jail
@pytest.mark.parametrize(
    ("ext", "source", "why"),
    [
        (".py", "def run(i):\n    return {'s': {1, 2}}\n", "output is not JSON"),
        (".py", "def run(i):\n    return {'x': float('nan')}\n", "output is not JSON"),
        (".mjs", "export const run = () => ({ n: 10n })\n", "output is not JSON"),
        (
            ".py",
            "def run(i):\n    return {'n': 'seven'}\n",
            "output does not match the output schema: /n must be number",
        ),
        (
            ".py",
            "def run(i):\n    return {}\n",
            "output does not match the output schema: /n is required",
        ),
        (".py", "def run(i):\n    return None\n", "output does not match the output schema"),
        (
            ".py",
            "def run(i):\n    return {'n': 1, 'pad': 'x' * (1024 * 1024)}\n",
            "output is larger than 1 MB",
        ),
    ],
)
def test_bad_output_is_failed_saying_which_rule(
    machine: Machine, ext: str, source: str, why: str
) -> None:
    out = {"type": "object", "required": ["n"], "properties": {"n": {"type": "number"}}}
    result = run_tool(machine, make_tool(machine, source, ext=ext, output_schema=out))
    assert result.status == "failed" and result.output is None
    assert result.error is not None and result.error.startswith(why), result.error


@pytest.mark.jail
def test_timeout_counts_from_the_sandbox_start(machine: Machine) -> None:
    tool = make_tool(machine, "def run(i):\n    while True:\n        pass\n", timeout_ms=1000)
    result = run_tool(machine, tool)
    assert result.status == "timed_out" and result.output is None
    assert 1000 <= result.duration_ms < 2500
    assert result.error is not None and "1000 ms" in result.error


@pytest.mark.jail
def test_tool_that_exits_without_a_result_is_failed(machine: Machine) -> None:
    tool = make_tool(machine, "import os\ndef run(i):\n    os._exit(3)\n")
    result = run_tool(machine, tool)
    assert result.status == "failed"
    assert result.error == "the tool exited with code 3 without returning a result"


@pytest.mark.jail
@pytest.mark.parametrize(
    ("ext", "source"),
    [
        (".py", "import os, time\ndef run(i):\n    os._exit = lambda code: time.sleep(1.5)\n"
                "    return {'n': 1}\n"),
        (".mjs", "export function run() {\n  process.exit = () => setTimeout(() => {}, 1500)\n"
                 "  return { n: 1 }\n}\n"),
    ],
)  # fmt: skip
def test_the_answer_comes_with_the_reply_not_with_the_jails_end(
    machine: Machine, ext: str, source: str
) -> None:
    """The harness frames its reply with its length, so a call answers once the reply is
    complete (nsjail holds the result pipe open until it exits): here the tool keeps its
    jail alive 1.5 s after replying."""

    async def call() -> tuple[RunResult, float]:
        started = time.monotonic()
        result = await machine.pipeline.run(make_tool(machine, source, ext=ext), {}, logs=False)
        waited = time.monotonic() - started
        await asyncio.sleep(2)  # the jail's end, in the background, before the loop closes
        return result, waited

    result, waited = asyncio.run(call())
    assert (result.status, result.output) == ("succeeded", {"n": 1})
    assert waited < 1.0


@pytest.mark.jail
def test_with_logs_a_tool_that_lingers_after_its_reply_is_answered_and_stopped(
    machine: Machine,
) -> None:
    """``tool test`` shows logs, which end with the jail: a tool that replies and then
    keeps its jail alive (no exit, a thread sleeping 60 s) is stopped REPLY_GRACE_S after
    its reply, not at its deadline (before, it waited 10 s and was timed_out)."""
    source = (
        "import os, threading, time\ndef run(i):\n    print('before the reply')\n"
        "    os._exit = lambda code: None\n"
        "    threading.Thread(target=time.sleep, args=(60,)).start()\n    return {'n': 1}\n"
    )
    started = time.monotonic()
    result = run_tool(machine, make_tool(machine, source, timeout_ms=10_000))
    waited = time.monotonic() - started
    assert (result.status, result.output) == ("succeeded", {"n": 1}), result.error
    assert "before the reply" in result.logs
    assert waited < 8.0  # well before the 10 s deadline it would have waited for


@pytest.mark.jail
def test_a_tool_writing_to_the_result_channel_gets_no_result(machine: Machine) -> None:
    source = "import os, sys\ndef run(i):\n    os.write(int(sys.argv[1]), b'{}')\n    return {}\n"
    tool = make_tool(machine, source)
    result = run_tool(machine, tool, logs=False)
    assert result.status == "failed"
    assert result.error is not None and "is not a result" in result.error


@pytest.mark.jail
def test_prints_are_logs_not_results(machine: Machine) -> None:
    source = (
        'import sys\ndef run(i):\n    print(\'{"ok": true, "output": 1}\')\n'
        "    print('to stderr', file=sys.stderr)\n    return {'n': 1}\n"
    )
    result = run_tool(machine, make_tool(machine, source))
    assert result.output == {"n": 1}
    assert result.logs == '{"ok": true, "output": 1}\nto stderr\n'
    js = "export function run() { console.log('hello'); console.error('oops'); return {} }\n"
    result = run_tool(machine, make_tool(machine, js, ext=".mjs"))
    assert (result.output, result.logs) == ({}, "hello\noops\n")


@pytest.mark.jail
def test_logs_are_capped_at_64_kb(machine: Machine) -> None:
    source = "def run(i):\n    for _ in range(20000):\n        print('x' * 99)\n    return {}\n"
    result = run_tool(machine, make_tool(machine, source))
    assert result.status == "succeeded"
    assert len(result.logs) == 64 * 1024 and result.logs_truncated


@pytest.mark.jail
def test_each_run_starts_from_a_fresh_sandbox(machine: Machine) -> None:
    source = (
        "import os\nSTATE = []\ndef run(i):\n"
        "    seen = os.path.exists('/tmp/mark')\n"
        "    open('/tmp/mark', 'w').write('1')\n"
        "    STATE.append(1)\n"
        "    return {'seen': seen, 'state': len(STATE)}\n"
    )
    tool = make_tool(machine, source)
    assert [run_tool(machine, tool).output for _ in range(2)] == [
        {"seen": False, "state": 1},
        {"seen": False, "state": 1},
    ]


# --- secrets ----------------------------------------------------------------------------------

SECRET = "sk_live_51HqA9zSECRETvalue"


@pytest.mark.jail
@pytest.mark.smoke
def test_secret_reaches_the_tool_as_an_env_variable(machine: Machine) -> None:
    py = "import os\ndef run(i):\n    return {'len': len(os.environ['STRIPE_KEY'])}\n"
    js = "export const run = () => ({ len: process.env.STRIPE_KEY.length })\n"
    for source, ext in ((py, ".py"), (js, ".mjs")):
        result = run_tool(
            machine, make_tool(machine, source, ext=ext), secrets={"STRIPE_KEY": SECRET}
        )
        assert result.output == {"len": len(SECRET)}


@pytest.mark.jail
def test_jail_environment_is_built_explicitly(machine: Machine) -> None:
    source = "import os\ndef run(i):\n    return dict(os.environ)\n"
    result = run_tool(machine, make_tool(machine, source), secrets={"API_KEY": "abcd1234"})
    # The secret is in the env; the output then carries it, so it is withheld.
    assert result.status == "failed" and "API_KEY" in (result.error or "")
    env = run_tool(machine, make_tool(machine, source)).output
    assert env == {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}


@pytest.mark.jail
@pytest.mark.parametrize(
    "spelling",
    [
        "value",
        "base64.b64encode(value.encode()).decode()",
        "base64.b64encode(b'xx' + value.encode()).decode()",
        "base64.urlsafe_b64encode(value.encode()).decode()",
        "urllib.parse.quote(value)",
        "json.dumps({'k': value})",
        "value.splitlines()[1]",
    ],
)
def test_secret_in_error_or_logs_is_scrubbed(machine: Machine, spelling: str) -> None:
    source = (
        "import base64, json, os, urllib.parse\n"
        "def run(i):\n"
        "    value = os.environ['TOKEN']\n"
        f"    shown = {spelling}\n"
        "    print('log:', shown)\n"
        "    raise RuntimeError('failed with ' + shown)\n"
    )
    multi = SECRET + "\nsecond-line-of-the-key\nthird"
    result = run_tool(machine, make_tool(machine, source), secrets={"TOKEN": multi})
    assert result.status == "failed"
    for text in (result.error or "", result.logs):
        assert "[secret]" in text
        assert SECRET not in text and "second-line-of-the-key" not in text
        assert base64.b64encode(multi.encode()).decode()[:20] not in text
        assert urllib.parse.quote(multi)[:20] not in text


@pytest.mark.jail
@pytest.mark.parametrize(
    "spelling",
    [
        "value",
        "base64.b64encode(value.encode()).decode()",
        "urllib.parse.quote(value)",
        "'prefix-' + value[:]",
        "json.dumps(value)",
    ],
)
def test_output_with_secret_is_withheld(machine: Machine, spelling: str) -> None:
    source = (
        "import base64, json, os, urllib.parse\n"
        "def run(i):\n"
        "    value = os.environ['TOKEN']\n"
        f"    return {{'leak': {spelling}}}\n"
    )
    result = run_tool(machine, make_tool(machine, source), secrets={"TOKEN": SECRET})
    assert result.status == "failed" and result.output is None
    assert result.error == "output withheld: it contains the value of the secret TOKEN"


@pytest.mark.jail
def test_secrets_never_reach_argv_or_disk(machine: Machine, tmp_path: Any) -> None:
    marker = "zq-marker-7Hf2KkP0"
    tool = make_tool(machine, "import time\ndef run(i):\n    time.sleep(0.5)\n    return {}\n")

    async def observe() -> list[str]:
        task = asyncio.ensure_future(
            machine.pipeline.run(tool, {"m": marker}, secrets={"S": marker + "-secret"})
        )
        await asyncio.sleep(0.25)
        seen = []
        from pathlib import Path

        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                seen.append(cmdline.read_bytes().decode("utf-8", "replace"))
            except OSError:
                continue
        await task
        return seen

    cmdlines = asyncio.run(observe())
    assert any("nsjail" in c for c in cmdlines)
    assert not any(marker in c for c in cmdlines)
    data_dir = machine.settings.data_dir
    for path in data_dir.rglob("*"):
        if path.is_file():
            assert marker.encode() not in path.read_bytes(), path
    json.dumps(cmdlines)  # readable


@pytest.mark.jail
def test_jails_are_awaited_where_the_kernel_has_no_pidfds(
    machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open")

    monkeypatch.setattr(os, "pidfd_open", refuse)
    tool = make_tool(machine, "import sys\ndef run(i):\n    print('done')\n    return {'n': 1}\n")
    result = run_tool(machine, tool)  # with its logs: the answer waits for the jail's exit
    assert (result.status, result.output, result.logs) == ("succeeded", {"n": 1}, "done\n")


@pytest.mark.jail
def test_a_running_jail_is_awaited_by_the_event_loop_not_a_thread(machine: Machine) -> None:
    """Python 3.11's asyncio waits for each child process in a thread of its own
    ("waitpid-PID"); runnerd's jails are awaited through pidfds in the loop."""
    tool = make_tool(machine, "import time\ndef run(i):\n    time.sleep(0.5)\n    return {}\n")

    async def scenario() -> tuple[set[str], RunResult]:
        running = asyncio.ensure_future(machine.pipeline.run(tool, {}))
        await asyncio.sleep(0.3)
        names = {thread.name for thread in threading.enumerate()}
        return names, await running

    names, result = asyncio.run(scenario())
    assert result.status == "succeeded"
    assert not [name for name in names if name.startswith("waitpid")], names


@pytest.mark.parametrize("when", ["while-spawning", "spawned-not-yet-handed-over"])
def test_a_jail_start_cancelled_midway_leaves_no_process(when: str) -> None:
    """The spawn runs in a thread; a caller cancelled meanwhile (the daemon stopping)
    must not leave the process it started behind, and gets what it held for the
    process (its pipes, its uid) back only once the process is gone."""
    argv = ["/bin/sleep", "30.0417"]
    released: list[list[str]] = []

    def ours() -> list[str]:
        found = []
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if (proc / "cmdline").read_bytes().split(b"\0")[:2] == [a.encode() for a in argv]:
                    found.append(proc.name)
        return found

    async def scenario() -> None:
        read, write = os.pipe()
        starting = asyncio.ensure_future(
            spawn(argv, read, write, (), release=lambda: released.append(ours()))
        )
        await asyncio.sleep(0)  # in the spawner thread now
        if when == "spawned-not-yet-handed-over":
            time.sleep(1.0)  # the loop is held: the spawn ends, its result waits
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        # and the loop closes at once, as when the daemon stops: nothing is left to
        # deliver the started process to, or to kill it from

    asyncio.run(scenario())
    for _ in range(100):
        if released:
            break
        time.sleep(0.05)
    assert released == [[]]  # released once, with no such process left
    assert ours() == []


def test_a_run_is_metered_in_whole_milliseconds_rounded_up() -> None:
    assert [metered_ms(s) for s in (0.0, 0.0001, 0.0004, 0.001, 0.0012, 0.6)] == [
        1,
        1,
        1,
        1,
        2,
        600,
    ]
