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
import hmac
import time
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from runnerd.govern.results import CallResult, ResultCache
from runnerd.limits import MAX_PEER_ANSWER_BYTES, PEER_TIMEOUT_S, PEER_TOKEN_WINDOW_S
from runnerd.model import RunStatus

__all__ = ["PEER_HEADER", "PEER_PATH", "PeerUnreachable", "Peers"]

PEER_PATH = "/internal/results/{run_id}"
PEER_HEADER = "X-Runnerd-Node"


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
    """Asking other nodes for results, and answering them (``answer``)."""

    key: bytes  # vault.derive("node results"): the same on every node of a cluster
    results: ResultCache
    _client: httpx.AsyncClient | None = None

    def _mac(self, message: str) -> str:
        return hmac.new(self.key, message.encode(), "sha256").hexdigest()

    def sign(self, run_id: str, now: float | None = None) -> str:
        message = f"{run_id}.{int(time.time() if now is None else now)}"
        return f"{message}.{self._mac(message)}"

    def verify(self, run_id: str, token: str, now: float | None = None) -> bool:
        """Whether ``token`` is a node's request for ``run_id``, made within the window."""
        message, _, mac = token.rpartition(".")
        named, _, made = message.rpartition(".")
        if named != run_id or not made.isdigit():
            return False
        if not hmac.compare_digest(mac, self._mac(message)):
            return False
        return abs((time.time() if now is None else now) - int(made)) <= PEER_TOKEN_WINDOW_S

    def answer(self, run_id: str, token: str) -> bytes | None:
        """The result this node holds for a signed request (JSON), else None."""
        if not self.verify(run_id, token):
            return None
        held = self.results.get(run_id)
        if held is None:
            return None
        return msgspec.json.encode(
            _Wire(held.run_id, held.status, held.output, held.error, held.duration_ms)
        )

    async def fetch(self, url: str, run_id: str) -> CallResult | None:
        """The result of ``run_id`` from the node at ``url``; None when it holds none.
        PeerUnreachable when it does not answer within PEER_TIMEOUT_S."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=PEER_TIMEOUT_S, trust_env=False)
        target = url.rstrip("/") + PEER_PATH.format(run_id=run_id)
        headers = {PEER_HEADER: self.sign(run_id)}
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
        except (httpx.HTTPError, TimeoutError) as error:
            raise PeerUnreachable(str(error) or type(error).__name__) from None
        try:
            held = msgspec.json.decode(bytes(body), type=_Wire)
        except msgspec.ValidationError as error:
            raise PeerUnreachable(f"not a result: {error}") from None
        if held.run_id != run_id:
            raise PeerUnreachable("the answer is of another run")
        return CallResult(held.run_id, held.status, held.output, held.error, held.duration_ms)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
