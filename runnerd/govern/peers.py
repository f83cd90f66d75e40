"""Results held by another node: a replay or a result read on any node of a cluster.

A finished run's output and error stay in the memory of the node that ran it (ResultCache),
never in the database, sealed or not. A node asked for a run that another node ran asks
that node, at the address it published in the nodes table (``node_url``), with a request
signed by a key derived from the secrets key every node shares: ``GET /internal/results/
{runId}`` with ``X-Runnerd-Node: <run id>.<unix time>.<mac>``. The asked node answers the
result it holds (200), or 404 when it holds none (or the signature is not good: nothing
tells a stranger which runs exist). Nothing is cached on the asking node: the output stays
where it was made, and is dropped there when its time is up.

What a node cannot get says why (``CallResult.missing``, OUTPUT_MISSING): the node that ran
it stopped since, it did not answer within PEER_TIMEOUT_S, or it no longer holds the result.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from runnerd.govern.results import CallResult, ResultCache
from runnerd.limits import (
    MAX_PEER_ANSWER_BYTES,
    MAX_PEER_NONCES,
    PEER_TIMEOUT_S,
    PEER_TOKEN_WINDOW_S,
)
from runnerd.model import RunStatus

__all__ = ["PEER_HEADER", "PEER_PATH", "PeerUnreachable", "Peers"]

PEER_PATH = "/internal/results/{run_id}"
PEER_HEADER = "X-Runnerd-Node"
PEER_ANSWER_HEADER = "X-Runnerd-Node-Answer"


class PeerUnreachable(Exception):
    """The node that holds a result did not answer (connect, timeout, or a 5xx)."""


class _Wire(msgspec.Struct, rename="camel"):
    run_id: str
    status: RunStatus
    output: Any
    error: str | None
    duration_ms: int


@dataclass
class Peers:
    """Asking other nodes for results, and answering them (``answer``).

    A request names the run, the node asked, when it was made and a nonce, under a MAC
    of the shared key: the asked node answers only a request made for it, within the
    window, once (a request seen on the wire is of no use again). The answer carries a
    MAC of the request and the body (``PEER_ANSWER_HEADER``): whatever answers at a
    node's address without the key cannot hand a node a result."""

    key: bytes  # vault.derive("node results"): the same on every node of a cluster
    results: ResultCache
    node_id: Callable[[], str | None]  # this node's id in the nodes table (set at join)
    _client: httpx.AsyncClient | None = None
    _seen: dict[str, float] = field(default_factory=dict)  # nonce -> until when refused

    def _mac(self, message: str) -> str:
        return hmac.new(self.key, message.encode(), "sha256").hexdigest()

    def sign(self, run_id: str, node_id: str, now: float | None = None) -> str:
        made = int(time.time() if now is None else now)
        message = f"{run_id}.{node_id}.{made}.{secrets.token_hex(12)}"
        return f"{message}.{self._mac(message)}"

    def verify(self, run_id: str, token: str, now: float | None = None) -> str | None:
        """The node a good request for ``run_id`` was made for, or None: not signed with
        the key, of another run, made outside the window, or seen before."""
        parts = token.split(".")
        if len(parts) != 5 or parts[0] != run_id or not parts[2].isdigit():
            return None
        message, mac = ".".join(parts[:4]), parts[4]
        if not hmac.compare_digest(mac, self._mac(message)):
            return None
        clock = time.time() if now is None else now
        if abs(clock - int(parts[2])) > PEER_TOKEN_WINDOW_S:
            return None
        if self._seen.get(parts[3], 0.0) > clock:
            return None  # a replay
        if len(self._seen) >= MAX_PEER_NONCES:  # the oldest go: they are past the window first
            for nonce in [n for n, until in self._seen.items() if until <= clock]:
                del self._seen[nonce]
            while len(self._seen) >= MAX_PEER_NONCES:
                del self._seen[next(iter(self._seen))]
        self._seen[parts[3]] = clock + 2 * PEER_TOKEN_WINDOW_S
        return parts[1]

    def answer_mac(self, token: str, body: bytes) -> str:
        return self._mac(f"{token}\n{hashlib.sha256(body).hexdigest()}")

    def answer(self, run_id: str, token: str) -> tuple[int, bytes, str | None]:
        """This node's answer to a request: (200, the result as JSON, its MAC); (421, b"",
        None) for a good request made for another node (its address in the nodes table
        is this node's: the asker says the node did not answer); else (404, b"", None)."""
        asked = self.verify(run_id, token)
        if asked is None:
            return 404, b"", None
        if asked != self.node_id():
            return 421, b"", None
        held = self.results.get(run_id)
        if held is None:
            return 404, b"", None
        body = msgspec.json.encode(
            _Wire(held.run_id, held.status, held.output, held.error, held.duration_ms)
        )
        return 200, body, self.answer_mac(token, body)

    async def fetch(self, url: str, node_id: str, run_id: str) -> CallResult | None:
        """The result of ``run_id`` from node ``node_id`` at ``url``; None when it holds
        none. PeerUnreachable when it does not answer within PEER_TIMEOUT_S, or answers
        what the key did not sign."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=PEER_TIMEOUT_S, trust_env=False)
        target = url.rstrip("/") + PEER_PATH.format(run_id=run_id)
        token = self.sign(run_id, node_id)
        headers = {PEER_HEADER: token}
        try:
            async with asyncio.timeout(PEER_TIMEOUT_S):  # the whole answer, not each read
                async with self._client.stream("GET", target, headers=headers) as response:
                    if response.status_code == 404:
                        return None
                    if response.status_code != 200:
                        raise PeerUnreachable(f"HTTP {response.status_code}")
                    body = bytearray()
                    async for chunk in response.aiter_raw():
                        body += chunk
                        if len(body) > MAX_PEER_ANSWER_BYTES:
                            raise PeerUnreachable("the answer is larger than any result")
                    mac = response.headers.get(PEER_ANSWER_HEADER, "")
        except (httpx.HTTPError, TimeoutError) as error:
            raise PeerUnreachable(str(error) or type(error).__name__) from None
        if not hmac.compare_digest(mac, self.answer_mac(token, bytes(body))):
            raise PeerUnreachable("the answer is not signed with the cluster's key")
        try:
            held = msgspec.json.decode(bytes(body), type=_Wire)
        except msgspec.DecodeError as error:
            raise PeerUnreachable(f"not a result: {error}") from None
        if held.run_id != run_id:
            raise PeerUnreachable("the answer is of another run")
        return CallResult(held.run_id, held.status, held.output, held.error, held.duration_ms)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
