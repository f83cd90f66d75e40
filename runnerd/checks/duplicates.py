"""A key that one JSON object holds twice, found before a decoder silently keeps the last.

msgspec, like most JSON decoders, keeps the last of two equal keys, so ``{"apiKey": A,
"apiKey": B}`` reads as B while a proxy, a log or a validator in front may have read A.
Callers decode a body first (that refuses what is not JSON, or nests too deeply), then
refuse it when ``duplicate_key`` finds a key twice. Keys compare as decoded: ``"a"`` and
``"\\u0061"`` are the same key.

Two ways to look, for two kinds of text:

- ``duplicate_key``: Python's C JSON scanner, with a hook per object (2.5 µs on a
  100-byte run body, ~7 ms on 256 KB of small objects). Its one C call builds every
  string: on 34 MB of base64 it holds the GIL ~90 ms.
- ``duplicate_key_sparse``: a loop over strings and brackets only, each string skipped
  with ``bytes.find`` (2.7 ms on a 34 MB deploy body of 100 files, never more than one
  string's worth at a time). It is slow per token, so it stops after ``max_tokens``.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["TooManyTokens", "duplicate_key", "duplicate_key_sparse"]


class _Repeated(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _refuse_repeats(pairs: list[tuple[str, Any]]) -> None:
    if len(pairs) > 1 and len(dict(pairs)) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Repeated(key)
            seen.add(key)
    return None  # the values are never used: keep none of them


_PAIRS = json.JSONDecoder(object_pairs_hook=_refuse_repeats)


def duplicate_key(data: bytes | bytearray | str) -> str | None:
    """The first key (decoded) that some object of the JSON text ``data`` holds twice, at
    any depth, else None. None too when ``data`` is not JSON: the decoder that follows
    refuses it. Raises RecursionError past Python's recursion limit: callers check the
    depth first (checks/nesting.py) or decode with a bounded decoder before."""
    try:
        text = data if isinstance(data, str) else data.decode()
        _PAIRS.decode(text)
    except _Repeated as repeated:
        return repeated.key
    except ValueError:  # not UTF-8 or not JSON (JSONDecodeError is a ValueError)
        return None
    return None


class TooManyTokens(ValueError):
    """The text holds more strings and brackets than the caller allows."""


# What the sparse scan stops at: a string's start, or a bracket.
_TOKEN = re.compile(rb'["{}\[\]]')
# A JSON string with escapes, unrolled so the engine never backtracks.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_COLON = re.compile(rb"[ \t\r\n]*:")
_OBJECT, _ARRAY = ord("{"), ord("[")


def _text(raw: bytes | bytearray) -> str:
    # Accepted JSON is UTF-8; should it not be, distinct bytes still stay distinct keys.
    return raw.decode("utf-8", "surrogateescape")


def duplicate_key_sparse(raw: bytes | bytearray, max_tokens: int) -> str | None:
    """``duplicate_key`` for a text of few, long strings (a deploy body: paths and base64),
    without building any string but the keys. ``raw`` must be JSON that a decoder has
    accepted. Raises TooManyTokens once it has met ``max_tokens`` strings and brackets;
    never recurses."""
    objects: list[set[str] | None] = []  # one per open bracket: its keys, None for arrays
    pos, tokens = 0, 0
    while (found := _TOKEN.search(raw, pos)) is not None:
        tokens += 1
        if tokens > max_tokens:
            raise TooManyTokens(f"more than {max_tokens:,} strings and brackets")
        start = found.start()
        char = raw[start]
        if char != ord('"'):
            if char in (_OBJECT, _ARRAY):
                objects.append(set() if char == _OBJECT else None)
            elif objects:
                objects.pop()
            pos = start + 1
            continue
        end = raw.find(b'"', start + 1)
        escaped = end >= 0 and raw.find(b"\\", start + 1, end) >= 0
        if escaped:  # the first quote may be an escaped one: match the whole string
            match = _STRING.match(raw, start)
            end = -1 if match is None else match.end() - 1
        if end < 0:
            return None  # not JSON after all; the decoder refuses it
        pos = end + 1
        colon = _COLON.match(raw, pos)
        keys = objects[-1] if objects else None
        if colon is None or keys is None:
            continue  # a value
        key = json.loads(raw[start : end + 1]) if escaped else _text(raw[start + 1 : end])
        if key in keys:
            return str(key)
        keys.add(key)
        pos = colon.end()
    return None
