"""Keeping secret values out of what a run returns and what runnerd stores.

A secret can leak in many spellings. ``Scrubber`` knows these spellings of every secret
of a run (docs/SECURITY.md lists the same, and tests/test_scrub.py tests each one through a
real run):

- exactly: as is; URL-encoded (``quote`` and ``quote_plus``: reserved bytes only);
  JSON-escaped; base64, standard and URL-safe, at any byte alignment; each line of a
  multi-line value, as is and JSON-escaped;
- in any case of its hex digits: every byte %-encoded (``%73%6B`` or ``%73%6b``);
- in any letter case, for a value of MIN_FOLDED_CHARS or more: the value; reversed; hex;
  URL-encoded; base32 at any alignment; base64 at any alignment (a host name is lower
  case, so a name built from one spelling is caught too).

It replaces them with ``[secret]`` in logs, errors and whatever else a tool controls that
runnerd stores or shows (egress destination names), and tells whether an output contains
any of them. Matching runs on RE2 (one linear pass, whatever the number of spellings).

What this cannot do: a tool holds its secrets, so its own code can always re-encode one
in a way no list of spellings foresees (split, compressed, encrypted). Scrubbing protects
against accidental exposure and the common encodings; egress grants limit where a tool
can send anything (docs/SECURITY.md says so).

Fragments shorter than MIN_SCRUB_CHARS are not looked for: scrubbing every "a" out of
a log would destroy it, and a value that short is no secret.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus

import msgspec
import re2

from runnerd.limits import MAX_SCRUB_MEMORY, MIN_FOLDED_CHARS, MIN_SCRUB_CHARS

__all__ = ["REDACTED", "Scrubber"]

REDACTED = "[secret]"


def _cores(value: bytes, encode: Callable[[bytes], bytes], bits: int, group: int) -> set[str]:
    """The text of ``value`` in a base-2^bits encoding wherever it starts in a longer
    string: the characters that depend on the value's own bits only, at each of the
    ``group`` byte alignments it can have."""
    cores: set[str] = set()
    for offset in range(group):
        encoded = encode(b"\0" * offset + value).decode()
        end = offset + len(value)
        first = -(-8 * offset // bits)  # ceil: the first character of the value alone
        last = (8 * end) // bits  # characters after this one mix in what follows
        core = encoded[first:last].rstrip("=")
        if len(core) >= MIN_SCRUB_CHARS:
            cores.add(core)
    return cores


def _spellings(value: str) -> tuple[set[str], set[str]]:
    """(spellings matched exactly, spellings matched in any case) of one value."""
    raw = value.encode()
    forms = {
        value,
        quote(value, safe=""),
        quote_plus(value),
        json.dumps(value)[1:-1],
        msgspec.json.encode(value).decode()[1:-1],
    }
    b64 = _cores(raw, base64.b64encode, 6, 3)
    b64 |= {c.replace("+", "-").replace("/", "_") for c in b64}
    forms |= b64
    for line in value.splitlines():
        line = line.strip()
        if line:
            forms |= {line, json.dumps(line)[1:-1]}
    # Every byte %-encoded: only hex digits and "%", so any case is this value alone.
    folded = {"".join(f"%{byte:02X}" for byte in raw)}
    if len(value) >= MIN_FOLDED_CHARS:
        folded |= {value, value[::-1], raw.hex(), quote(value, safe="").lower()}
        folded |= _cores(raw, base64.b32encode, 5, 5) | b64
    # An output is checked as JSON, where a spelling's quotes and backslashes are escaped.
    # (msgspec keeps other letters as they are; json.dumps writes them as \u escapes.)
    forms |= {_json(f) for f in forms} | {json.dumps(f)[1:-1] for f in forms}
    folded |= {_json(f) for f in folded} | {json.dumps(f)[1:-1] for f in folded}
    return _long_enough(forms - folded), _long_enough(folded)  # folded ones match as is too


def _json(text: str) -> str:
    return msgspec.json.encode(text).decode()[1:-1]


def _long_enough(forms: set[str]) -> set[str]:
    return {f for f in forms if len(f) >= MIN_SCRUB_CHARS}


def _options(longest: bool) -> Any:
    options = re2.Options()
    options.log_errors = False
    options.longest_match = longest  # at each place, the longest spelling wins
    options.max_mem = MAX_SCRUB_MEMORY
    return options


class Scrubber:
    """Every spelling of the values in ``secrets`` (name -> value)."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self._exact: dict[str, str] = {}
        self._folded: dict[str, str] = {}  # casefold() of a spelling -> its secret's name
        any_case: dict[str, None] = {}  # the spellings themselves, for RE2's (?i:)
        for name, value in secrets.items():
            exact, folded = _spellings(value)
            for form in exact:
                self._exact.setdefault(form, name)
            for form in folded:
                any_case.setdefault(form)
                self._folded.setdefault(form.casefold(), name)
        alternatives = [re2.escape(f) for f in self._exact]
        if any_case:
            # The spellings as they are, not casefold()ed: RE2 folds one character to one
            # (simple folding), so "ß" casefolded to "ss" would never match a "ß".
            alternatives.append("(?i:" + "|".join(map(re2.escape, any_case)) + ")")
        self._pattern = (
            re2.compile("|".join(alternatives), _options(True)) if alternatives else None
        )
        # The longest spelling, in bytes: a log kept this much past its cap can be
        # scrubbed before it is cut, so no secret straddles the cut.
        self.longest = max((len(f.encode()) for f in [*self._exact, *any_case]), default=0)

    def scrub(self, text: str) -> str:
        """``text`` with every spelling of every secret replaced by [secret]."""
        return self._pattern.sub(REDACTED, text) if self._pattern else text

    def found_in(self, text: str) -> list[str]:
        """The names of the secrets ``text`` contains, in any spelling (sorted)."""
        if self._pattern is None:
            return []
        return sorted({self._name(m.group(0)) for m in self._pattern.finditer(text)})

    def _name(self, found: str) -> str:
        # RE2's case folding and Python's can differ on rare letters: then say "a secret".
        return self._exact.get(found) or self._folded.get(found.casefold()) or "a secret"
