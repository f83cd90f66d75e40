"""Ids and times as runnerd writes them: sortable prefixed ids, ISO 8601 UTC stamps.

A leaf, so that the store, the machine and the governor share one clock format and one id
sequence without importing each other.
"""

from __future__ import annotations

import secrets
import threading
import time
from datetime import UTC, datetime

__all__ = ["new_id", "stamp", "utc_now"]

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"

# The last id this process made, so the next one is larger (see new_id).
_last_id = 0
_id_lock = threading.Lock()


def new_id(prefix: str) -> str:
    """A sortable unique id: ``prefix_`` + 48-bit milliseconds + 80 random bits, base32.

    Ids made by one process only grow: within a millisecond (or if the clock steps
    back) the next id is the last one plus one, so runs listed by id keep the order
    in which they started."""
    global _last_id
    with _id_lock:
        value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
        if value <= _last_id:
            value = _last_id + 1
        _last_id = value
    chars = []
    for _ in range(26):
        value, rem = divmod(value, 32)
        chars.append(_CROCKFORD[rem])
    return f"{prefix}_{''.join(reversed(chars))}"


def utc_now() -> str:
    """Now as ISO 8601 UTC with milliseconds, such as 2026-11-30T02:46:41.123Z."""
    return stamp(datetime.now(UTC))


def stamp(when: datetime) -> str:
    """``when`` (UTC) as runnerd writes times: ISO 8601 with milliseconds and a Z."""
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
