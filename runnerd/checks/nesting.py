"""How deep a JSON text nests, found without recursion, before anything decodes it.

msgspec, Python's json and every validator recurse once per level; past ~1,000 levels
they raise RecursionError (a 500, or a traceback), and well before that the work is
waste. Callers check the raw bytes with ``nesting_over`` first and refuse what nests
deeper than limits.MAX_JSON_DEPTH.
"""

from __future__ import annotations

import itertools
import re

__all__ = ["nesting_over"]

# A JSON string, unrolled so the engine never backtracks: "…" with escapes inside.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
for _open in b"[{":
    _STEP[_open] = 1
for _close in b"]}":
    _STEP[_close] = -1


def nesting_over(data: bytes | bytearray | str, limit: int) -> int | None:
    """The nesting depth of the JSON text ``data`` when it is deeper than ``limit``,
    else None. Linear time, no recursion. Malformed JSON may be counted a little deeper
    than it is (an unterminated string hides no brackets); its decoding fails anyway."""
    raw = data.encode() if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return None  # strings included, it opens too few to nest deeper (a fast first look)
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    if brackets.count(b"[") + brackets.count(b"{") <= limit:
        return None  # cannot nest deeper than it opens
    depth = max(itertools.accumulate(map(_STEP.__getitem__, brackets)))
    return depth if depth > limit else None
