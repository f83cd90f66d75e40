"""Idempotency keys: a call repeated with the same key and the same request gets the
first run's result instead of a second run; with another request it is refused. The
store keeps the key's claim and the request's hash, never the input."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from runnerd.errors import IdempotencyConflict, InvalidIdempotencyKey
from runnerd.govern.admission import Principal
from runnerd.govern.results import CallResult, Pending
from runnerd.limits import MAX_CALL_WAIT_S, MAX_IDEMPOTENCY_KEY_CHARS
from runnerd.store import Store

__all__ = [
    "IdempotencyKeys",
    "request_hash",
]


def request_hash(install_id: str, version_id: str, tool: str, value: Any) -> str:
    """What approvals and idempotency keys are bound to: never the input itself."""
    digest = hashlib.sha256()
    digest.update(f"{install_id}\0{version_id}\0{tool}\0".encode())
    digest.update(msgspec.json.encode(value, order="sorted"))
    return digest.hexdigest()


def check_key(key: str) -> None:
    """InvalidIdempotencyKey unless ``key`` is 1 to MAX_IDEMPOTENCY_KEY_CHARS characters."""
    if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_CHARS:
        raise InvalidIdempotencyKey(MAX_IDEMPOTENCY_KEY_CHARS)


@dataclass
class IdempotencyKeys:
    """The claims of idempotency keys, per person, for ``ttl_s`` after their first use."""

    store: Store
    ttl_s: int

    async def replay(
        self,
        who: Principal,
        key: str,
        fingerprint: str,
        outcome: Callable[[str], Awaitable[CallResult]],
        held: Callable[[str], Awaitable[CallResult | Pending | None]],
    ) -> CallResult | Pending | None:
        """The first call's answer for a repeated key: its run's result (``outcome`` of
        its run id), or for a call held for approval, ``held`` of the approval's id (the
        same pending approval, or the run it released). None: the key is now claimed by
        this call, which goes on (also when the first call's approval was denied or
        expired: the retry asks again). IdempotencyConflict when the key was first used
        with another request."""
        claim = self.store.claim_idempotency_key
        found = await self.store.io(claim, who.user_id, key, fingerprint, self.ttl_s)
        if found is None:
            return None
        first_hash, run_id, approval_id = found
        if first_hash != fingerprint:
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different request (another "
                "input or tool, or the install now runs another version: a switch or "
                "rollback makes a retry a new request)"
            )
        deadline = time.monotonic() + MAX_CALL_WAIT_S
        while run_id is None and approval_id is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # the first call is starting
            again = await self.store.io(claim, who.user_id, key, fingerprint, self.ttl_s)
            if again is None:  # the first call was refused and released the key
                return None
            _, run_id, approval_id = again
        if run_id is not None:
            return await outcome(run_id)
        assert approval_id is not None
        answer = await held(approval_id)
        if answer is not None:
            return answer
        # Denied or expired: give the key up, and claim it for this call (or replay the
        # retry that claimed it first).
        await self.store.io(self.store.release_idempotency_key, who.user_id, key, approval_id)
        return await self.replay(who, key, fingerprint, outcome, held)

    async def release(self, who: Principal, key: str) -> None:
        """Give the key back: the call it claimed was refused, or is held for approval."""
        await self.store.io(self.store.release_idempotency_key, who.user_id, key)
