"""What a governed call answers: the result of a run that started (CallResult) or a call
held for approval (Pending), finished results kept in memory for a while, and who may
see a result's output (``may_see_output``, the rule of every surface)."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

from runnerd.model import Role, RunStatus

__all__ = [
    "OUTPUT_MISSING",
    "RUN_INTERRUPTED",
    "CallResult",
    "Pending",
    "ResultCache",
    "may_see_output",
]

# The error of a run closed as interrupted (its errorKind), once no node holds its result:
# its node was killed, cut off or stopped before the run ended (docs/API.md).
RUN_INTERRUPTED = "interrupted: the node running it stopped before the run ended"

# Why a finished run's answer has no output (its ``outputMissing``; docs/API.md). Outputs
# live in the memory of the node that ran the run, for the result cache's lifetime; any
# node asks that node for them (govern/peers.py).
OUTPUT_MISSING = {
    # The node that ran it no longer holds it: past the result cache's lifetime, or
    # dropped for room (result_cache_mb).
    "OUTPUT_EXPIRED": "the output is no longer held: past the result cache's lifetime",
    # The node that ran it stopped or restarted since: what it held in memory went with it.
    "OUTPUT_NODE_STOPPED": "the node that ran it has stopped since; outputs live in memory",
    # The node that ran it is in the cluster but did not answer in time.
    "OUTPUT_NODE_UNREACHABLE": "the node that ran it did not answer; try again",
    # The run never ended: its node stopped while it ran (errorKind interrupted).
    "RUN_INTERRUPTED": RUN_INTERRUPTED,
}


@dataclass(frozen=True)
class CallResult:
    """A run that started, whatever its status; its output and error live in memory only.
    ``missing``: why a finished run's output and error are not here (OUTPUT_MISSING)."""

    run_id: str
    status: RunStatus
    output: Any
    error: str | None
    duration_ms: int
    missing: str | None = None

    @property
    def output_available(self) -> bool:
        return self.missing is None


@dataclass(frozen=True)
class Pending:
    """A write call held until someone decides its approval, or it expires."""

    approval_id: str
    expires_at: str


def may_see_output(
    user_id: str, *, role: Role | None, ran_for: str, released_by: str | None
) -> bool:
    """Whether ``user_id`` (of ``role`` in the run's workspace, None when not a member)
    may see a run's output and error: they are the asker's, so the person it ran for,
    the approver whose decision released it, and admins; anyone else of the workspace
    sees its status only. GET /api/v2/runs/{id} and MCP's ``runnerd.approval`` ask here."""
    return user_id in (ran_for, released_by) or role == "admin"


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
