"""runnerd's Python harness: runs inside the jail, calls the tool's run(input) once.

argv: RESULT_FD [ENV_DIR]
stdin: one JSON request {"code", "file", "input", "env": {NAME: VALUE}}, read to the end.
The jail may be started before its call: it waits here, interpreter loaded, until the
request arrives. The tool's code comes in the request; it is never a file in the jail.
RESULT_FD: one JSON reply, {"ok": true, "output": ...} or
           {"ok": false, "kind": "error"|"output", "type", "message", "stack"}.
stdout/stderr stay the tool's own: they are the run's logs, never the result.

Start-up time is the run's latency, so this file imports nothing at the top but what
the interpreter has already loaded: JSON goes through the C accelerator ``_json``
directly (``import json`` alone costs ~10 ms, most of it ``re``); asyncio and traceback
are imported only when a tool needs them.
"""

import _json
import os
import sys

MAX_FRAMES = 8


class _Decoding:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = None
    memo = {}  # noqa: RUF012 - read by _json's scanner


def _not_json(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_scan = _json.make_scanner(_Decoding())
# markers, default, encoder, indent, key sep, item sep, sort_keys, skipkeys, allow_nan
_encode = _json.make_encoder(
    None, _not_json, _json.encode_basestring_ascii, None, ":", ",", False, False, False
)


def dumps(value):
    return "".join(_encode(value, 0))


def _stack(exc, code, display):
    import linecache
    import traceback

    # The code is no file: give traceback its lines so frames show the source.
    linecache.cache[display] = (len(code), None, code.splitlines(True), display)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == display]
    lines = []
    for frame in frames[-MAX_FRAMES:]:
        text = f"  at {frame.name} ({display}:{frame.lineno})"
        if frame.line:
            text += f": {frame.line.strip()}"
        lines.append(text)
    return "\n".join(lines)


def _text(exc):
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001 - a __str__ that raises must not lose the run
        return f"<{type(exc).__name__} with an unprintable message>"


def _load(code, display):
    module = type(sys)("tool")
    module.__file__ = display
    sys.modules["tool"] = module
    exec(compile(code, display, "exec"), module.__dict__)
    return module


def _call(run, value):
    result = run(value)
    if hasattr(result, "__await__"):
        import asyncio

        async def wait():
            return await result

        result = asyncio.run(wait())
    return result


def main():
    result_fd = int(sys.argv[1])
    if len(sys.argv) > 2:
        sys.path.insert(0, sys.argv[2])
    request, _ = _scan(sys.stdin.buffer.read().decode(), 0)
    code, display = request["code"], request["file"]
    os.environ.update(request.get("env") or {})
    reply = None
    try:
        run = getattr(_load(code, display), "run", None)
        if not callable(run):
            raise TypeError("the tool defines no callable run(input)")
        output = _call(run, request["input"])
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        reply = {
            "ok": False,
            "kind": "error",
            "type": type(exc).__name__,
            "message": _text(exc),
            "stack": _stack(exc, code, display),
        }
    if reply is None:
        try:
            data = dumps({"ok": True, "output": output})
        except (TypeError, ValueError, RecursionError) as exc:
            reply = {"ok": False, "kind": "output", "type": type(exc).__name__,
                     "message": _text(exc), "stack": ""}
    if reply is not None:
        data = dumps(reply)
    sys.stdout.flush()
    sys.stderr.flush()
    view = memoryview(data.encode())
    while view:
        written = os.write(result_fd, view)
        view = view[written:]
    os.close(result_fd)  # the reply is complete: the daemon need not wait for the exit
    # Do not wait for threads or handlers the tool left behind: the run is over.
    os._exit(0)


main()
