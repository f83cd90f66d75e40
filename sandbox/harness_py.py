"""runnerd's Python harness: runs inside the jail, calls the tool's run(input) once.

argv: RESULT_FD MODE [ENV_DIR]; MODE "bytecode": the request's "bytecode" is the tool's
code compiled by the daemon, for this interpreter's version; "source": it compiles "code".
stdin: one JSON request {"code", "bytecode", "file", "input", "env": {NAME: VALUE}}, read
to the end.
The jail may be started before its call: it waits here, interpreter loaded, until the
request arrives. The tool's code comes in the request; it is never a file in the jail.
RESULT_FD: one JSON reply, {"ok": true, "output": ...} or
           {"ok": false, "kind": "error"|"output", "type", "message", "stack"},
           after its length in bytes and a newline (the daemon answers once it has
           them all, without waiting for the jail to end).
stdout/stderr stay the tool's own: they are the run's logs, never the result.

Start-up time is the run's latency, so this file imports nothing at the top but what
the interpreter has already loaded: JSON goes through the C accelerator ``_json``
directly (``import json`` alone costs ~10 ms, most of it ``re``); asyncio and traceback
are imported only when a tool needs them.
"""

import _json
import marshal
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


# ENETUNREACH, and getaddrinfo's EAI_AGAIN, EAI_NONAME, EAI_NODATA: what a jail's own
# network answers (it has only lo, and no resolver).
_NO_NETWORK = {101, -3, -2, -5}


def _network_hint(exc, egress):
    """A sentence for an error that came from the jail's lack of a network."""
    seen = []
    while exc is not None and len(seen) < 8 and exc not in seen:
        seen.append(exc)
        if isinstance(exc, OSError) and exc.errno in _NO_NETWORK:
            if egress:
                return (" [runnerd: the jail has no network of its own; connect through the "
                        "egress proxy in HTTP_PROXY/HTTPS_PROXY, which resolves names]")
            return (" [runnerd: this run has no network: a tool reaches another system only "
                    "through egress its app lists in agentserve.app.yaml and its install "
                    "grants]")
        reason = getattr(exc, "reason", None)  # urllib's URLError wraps the OSError
        exc = reason if isinstance(reason, BaseException) else exc.__cause__ or exc.__context__
    return ""


def _load(code, display, bytecode):
    module = type(sys)("tool")
    module.__file__ = display
    sys.modules["tool"] = module
    if bytecode:
        exec(marshal.loads(bytes.fromhex(bytecode)), module.__dict__)
    else:
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


def _relay(socket_path, token):
    """Egress: listen on 127.0.0.1 (the jail's own lo) and relay each connection to the
    daemon's proxy socket, in one thread; point the usual proxy variables at it."""
    import selectors
    import socket
    import threading

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.setblocking(False)
    url = f"http://run:{token}@127.0.0.1:{listener.getsockname()[1]}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        os.environ[name] = url
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        os.environ.pop(name, None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    peer, pending, masks, ended = {}, {}, {}, set()  # ended: sides that sent their EOF

    def watch(sock):
        """Read a side while its peer has nothing waiting; write it while it has."""
        want = 0
        if sock not in ended and not pending.get(peer[sock]):
            want |= selectors.EVENT_READ
        if pending.get(sock):
            want |= selectors.EVENT_WRITE
        have = masks.get(sock, 0)
        if want != have:
            if not have:
                selector.register(sock, want)
            elif not want:
                selector.unregister(sock)
            else:
                selector.modify(sock, want)
            masks[sock] = want

    def drop(sock):
        for end in (sock, peer.get(sock)):
            if end is not None and end in peer:
                if masks.pop(end, 0):
                    selector.unregister(end)
                end.close()
                del peer[end]
                pending.pop(end, None)
                ended.discard(end)

    def step(sock, events):
        other = peer[sock]
        if events & selectors.EVENT_WRITE:
            sent = sock.send(pending[sock])
            pending[sock] = pending[sock][sent:]
        if events & selectors.EVENT_READ:
            data = sock.recv(65536)
            if data:
                try:
                    data = data[other.send(data):]
                except BlockingIOError:
                    pass
                pending[other] = data
            else:
                ended.add(sock)
        # An EOF passes on once what came before it is written; both ended: done.
        for end in (sock, other):
            if end in ended and not pending.get(peer[end]):
                try:
                    peer[end].shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        if sock in ended and other in ended:
            drop(sock)
            return
        watch(sock)
        watch(other)

    def loop():
        while True:
            for key, events in selector.select():
                sock = key.fileobj
                if sock is listener:
                    try:
                        inner, _ = listener.accept()
                    except OSError:
                        continue
                    outer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    try:
                        outer.connect(socket_path)
                    except OSError:
                        inner.close()
                        outer.close()
                        continue
                    inner.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    for end, other in ((inner, outer), (outer, inner)):
                        end.setblocking(False)
                        peer[end] = other
                    watch(inner)
                    watch(outer)
                elif sock in peer:
                    try:
                        step(sock, events)
                    except BlockingIOError:
                        pass
                    except OSError:
                        drop(sock)

    threading.Thread(target=loop, daemon=True, name="runnerd-egress").start()


def _warm(compiles):
    """Pay the interpreter's one-time costs while the jail waits for its call, not after
    the request arrives: the first compile() in a process costs about a millisecond
    (the parser's lazy set-up; a jail that gets bytecode never pays it), the first call,
    decode and encode a little more."""
    if compiles:
        namespace = {}
        exec(compile("def run(input):\n    return input\n", "<warm>", "exec"), namespace)
    dumps({"ok": True, "output": _scan('{"n": 1}', 0)[0]})


def main():
    result_fd = int(sys.argv[1])
    if len(sys.argv) > 3:
        sys.path.insert(0, sys.argv[3])
    request, _ = _scan(sys.stdin.buffer.read().decode(), 0)
    code, display = request["code"], request["file"]
    os.environ.update(request.get("env") or {})
    egress = request.get("egress")
    if egress:
        _relay(egress["socket"], egress["token"])
    reply = None
    try:
        run = getattr(_load(code, display, request.get("bytecode")), "run", None)
        if not callable(run):
            raise TypeError("the tool defines no callable run(input)")
        output = _call(run, request["input"])
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        reply = {
            "ok": False,
            "kind": "error",
            "type": type(exc).__name__,
            "message": _text(exc) + _network_hint(exc, bool(egress)),
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
    data = data.encode()
    view = memoryview(b"%d\n%b" % (len(data), data))
    while view:
        written = os.write(result_fd, view)
        view = view[written:]
    os.close(result_fd)  # the reply is complete: the daemon need not wait for the exit
    # Do not wait for threads or handlers the tool left behind: the run is over.
    os._exit(0)


_warm(sys.argv[2] != "bytecode")
main()
