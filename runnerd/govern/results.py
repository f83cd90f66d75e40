"""What a governed call answers: the result of a run that started (CallResult) or a call
held for approval (Pending), and finished results kept in memory for a while."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

from runnerd.model import RunStatus

__all__ = ["CallResult", "Pending", "ResultCache"]


@dataclass(frozen=True)
class CallResult:
    """A run that started, whatever its status; its output and error live in memory only."""

    run_id: str
    status: RunStatus
    output: Any
    error: str | None
    duration_ms: int


@dataclass(frozen=True)
class Pending:
    """A write call held until someone decides its approval, or it expires."""

    approval_id: str
    expires_at: str


class ResultCache:
    """Finished results in memory for a while (GET /runs/{id}, idempotent replays),
    bounded in bytes; never written anywhere."""

    def __init__(self, max_bytes: int, ttl_s: float) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._items: OrderedDict[str, tuple[float, int, CallResult]] = OrderedDict()
        self._bytes = 0

    def put(self, result: CallResult) -> None:
        size = len(msgspec.json.encode(result.output)) + len(result.error or "") + 256
        if size > self.max_bytes:
            return
        self._items[result.run_id] = (time.monotonic(), size, result)
        self._bytes += size
        while self._bytes > self.max_bytes or (
            self._items and time.monotonic() - next(iter(self._items.values()))[0] > self.ttl_s
        ):
            _, (_, old_size, _) = self._items.popitem(last=False)
            self._bytes -= old_size

    def get(self, run_id: str) -> CallResult | None:
        found = self._items.get(run_id)
        if found is None or time.monotonic() - found[0] > self.ttl_s:
            return None
        return found[2]
