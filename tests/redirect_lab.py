"""Loopback servers of the SDK tests' own for redirects: a ``Redirector`` that answers each
request with the redirect its test asks for (or passes ``/via/...`` on to the daemon), and
``Trap`` listeners on other loopback addresses and ports that count every connection they
get, so a test proves that nothing reached another origin. Nothing listens beyond 127/8.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

# A route maps a request's path to a redirect (status, Location); None answers 404.
Route = Callable[[str], "tuple[int, str] | None"]


class Trap:
    """A TCP listener that answers nothing and counts the connections made to it (the
    kernel completes a handshake before connect() returns, so a count taken after a call
    sees every connection that call made)."""

    def __init__(self, host: str) -> None:
        self._socket = socket.create_server((host, 0))
        self._socket.setblocking(False)
        self.host = host
        self.port = self._socket.getsockname()[1]
        self._count = 0

    def connections(self) -> int:
        while True:
            try:
                peer, _ = self._socket.accept()
            except BlockingIOError:
                return self._count
            peer.close()
            self._count += 1

    def close(self) -> None:
        self._socket.close()


class Redirector:
    """An HTTP/1.0 server on 127.0.0.1 (one connection per request, so ``connections``
    counts requests, TLS hellos included). ``route`` decides each answer; a path under
    ``/via/`` is sent on to ``upstream`` with its method, headers and body."""

    def __init__(self, upstream: str | None = None) -> None:
        self.route: Route = lambda path: None
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []  # headers in lower case
        self.upstream = upstream
        lab = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                lab.seen.append((self.command, self.path, headers, body))
                if self.path.startswith("/via/") and lab.upstream:
                    status, kind, sent = lab._pass_on(self.command, self.path[4:], self, body)
                    self._reply(status, sent, kind)
                    return
                found = lab.route(self.path)
                if found is None:
                    error = {"code": "NOT_FOUND", "message": "no route", "details": {}}
                    self._reply(404, json.dumps({"error": error}).encode())
                    return
                self._reply(found[0], b"", location=found[1])

            def _reply(
                self, status: int, body: bytes, kind: str = "application/json",
                location: str | None = None,
            ) -> None:  # fmt: skip
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                if location is not None:
                    self.send_header("Location", location)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def verify_request(self, request: Any, client_address: Any) -> bool:
                lab.connections += 1
                return True

        self.connections = 0
        self.far, self.near = Trap("127.0.0.2"), Trap("127.0.0.1")
        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # shutdown() waits for serve_forever's next poll: 0.5 s by default, for every lab.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def _pass_on(
        self, method: str, path: str, request: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, str, bytes]:
        keep = ("x-api-key", "content-type", "idempotency-key")
        headers = {k: v for k, v in request.headers.items() if k.lower() in keep}
        url = f"{self.upstream}{path}"
        answer = httpx.request(method, url, headers=headers, content=body, timeout=60)
        return answer.status_code, answer.headers.get("content-type", ""), answer.content

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.far.close()
        self.near.close()


@contextmanager
def redirect_lab(upstream: str | None = None) -> Iterator[Redirector]:
    """A Redirector with its traps: ``far`` on 127.0.0.2, ``near`` on 127.0.0.1 (another
    port)."""
    lab = Redirector(upstream)
    try:
        yield lab
    finally:
        lab.close()
