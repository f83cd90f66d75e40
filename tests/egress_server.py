"""A test server for egress tests, run by the tests inside a network namespace they make
(never on any other address): HTTP on one port, HTTPS (a test CA's certificate) on
another, and optionally HTTPS with another certificate on a third port (one issued for
other names: a client must refuse it). It records the path and Authorization header of
each request in a file of the test's, so a test can see what a tool sent.

    python egress_server.py LOG_FILE HTTP_PORT HTTPS_PORT CERT_PEM KEY_PEM [PORT PEM]
"""

from __future__ import annotations

import json
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        """Reads the body (a length or chunks, to be recorded nowhere), then answers as GET."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while size := int(self.rfile.readline().split(b";")[0], 16):
                self.rfile.read(size + 2)
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
        else:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.do_GET()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        with open(LOG, "a") as log:
            log.write(json.dumps({"path": url.path, "auth": self.headers.get("Authorization")}))
            log.write("\n")
        if url.path == "/big":
            size = int(parse_qs(url.query)["bytes"][0])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * 65536
            try:
                while size > 0:
                    self.wfile.write(chunk[: min(size, len(chunk))])
                    size -= len(chunk)
            except OSError:
                pass
            return
        body = json.dumps(
            {"hello": "from the test server", "path": url.path, "tls": SECURE.get(self.server)}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


LOG = sys.argv[1]
SECURE: dict[object, bool] = {}


def main() -> None:
    http_port, https_port, cert, key = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    plain = ThreadingHTTPServer(("0.0.0.0", http_port), Handler)
    secure = ThreadingHTTPServer(("0.0.0.0", https_port), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    SECURE.update({plain: False, secure: True})
    threading.Thread(target=secure.serve_forever, daemon=True).start()
    if len(sys.argv) > 7:
        other = ThreadingHTTPServer(("0.0.0.0", int(sys.argv[6])), Handler)
        other_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        other_context.load_cert_chain(sys.argv[7], sys.argv[7])
        other.socket = other_context.wrap_socket(other.socket, server_side=True)
        SECURE[other] = True
        threading.Thread(target=other.serve_forever, daemon=True).start()
    print("ready", flush=True)
    plain.serve_forever()


main()
