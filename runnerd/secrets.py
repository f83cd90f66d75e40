"""Keeping secret values out of what a run returns.

A secret can leak in many spellings: as is, base64 (standard or URL-safe, at any byte
alignment), URL-encoded, JSON-escaped, or one line of a multi-line value. ``Scrubber``
knows every spelling of every secret of a run, replaces them in logs and errors with
``[secret]``, and tells whether an output contains any of them.

Fragments shorter than MIN_SCRUB_CHARS are not looked for: scrubbing every "a" out of
a log would destroy it, and a value that short is no secret.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from urllib.parse import quote, quote_plus

__all__ = ["MIN_SCRUB_CHARS", "REDACTED", "Scrubber"]

REDACTED = "[secret]"
MIN_SCRUB_CHARS = 4  # runnerd: a shorter fragment would match ordinary text


def _base64_cores(value: bytes) -> set[str]:
    """The base64 text of ``value`` wherever it starts in a longer base64 string.

    Base64 encodes 3 bytes as 4 characters, so a value inside a longer string is
    encoded one of three ways, depending on its offset. The characters that depend only
    on the value itself are the same in every string holding it; those are returned.
    """
    cores: set[str] = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + value).decode()
        head = (offset * 4 + 2) // 3  # characters that mix in the bytes before the value
        end = len(b"\0" * offset + value)
        tail_chars = ((end * 4) // 3) if end % 3 else len(encoded)  # stable up to here
        core = encoded[head:tail_chars].rstrip("=")
        if len(core) >= MIN_SCRUB_CHARS:
            cores.add(core)
            cores.add(core.replace("+", "-").replace("/", "_"))
    return cores


def _spellings(value: str) -> set[str]:
    forms = {value, quote(value, safe=""), quote_plus(value), json.dumps(value)[1:-1]}
    forms |= _base64_cores(value.encode())
    for line in value.splitlines():
        line = line.strip()
        if line:
            forms |= {line, json.dumps(line)[1:-1]}
    return {f for f in forms if len(f) >= MIN_SCRUB_CHARS}


class Scrubber:
    """Every spelling of the values in ``secrets`` (name -> value)."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self._names: dict[str, str] = {}
        for name, value in secrets.items():
            for form in _spellings(value):
                self._names.setdefault(form, name)
        # Longest first, so a whole value is replaced before any of its lines.
        forms = sorted(self._names, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, forms))) if forms else None

    def scrub(self, text: str) -> str:
        """``text`` with every spelling of every secret replaced by [secret]."""
        return self._pattern.sub(REDACTED, text) if self._pattern else text

    def found_in(self, text: str) -> list[str]:
        """The names of the secrets ``text`` contains, in any spelling (sorted)."""
        if self._pattern is None:
            return []
        return sorted({self._names[m.group(0)] for m in self._pattern.finditer(text)})
