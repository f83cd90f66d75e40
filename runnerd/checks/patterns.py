"""Regular expressions on a linear-time engine (RE2), for everything a tool's schema asks.

Python's ``re`` backtracks: ``^(a+)+$`` against 40 characters runs for hours, holding the
GIL, so one caller (or a tool's own output) could freeze the daemon. Every pattern a
schema carries (``pattern``, ``patternProperties``, the value of ``format: regex``) and
every ``format`` check therefore runs on RE2, whose matching time is linear in the input.
A pattern RE2 cannot run (lookaround, backreferences) is refused when the schema is
compiled, which is at upload.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

import re2

from runnerd.limits import MAX_PATTERN_MEMORY

__all__ = ["FORMATS", "PatternError", "compile_pattern"]


class PatternError(ValueError):
    """A pattern RE2 cannot compile; the message says why, for the builder."""


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print the pattern to stderr
    options.never_capture = True  # schemas only ask "does it match"
    options.max_mem = MAX_PATTERN_MEMORY
    return options


_OPTIONS = _options()


def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (``.search``/``.match``), or PatternError.

    JSON Schema patterns are ECMA-262 and unanchored; ``$`` means the end of the string,
    which is RE2's meaning too (Python's ``$`` also matches before a final newline).
    """
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(
            f"the pattern {_short(pattern)} cannot run on a linear-time regex engine: "
            f"{reason} (lookaround and backreferences are not supported, and repetition "
            "counts are at most 1000)"
        ) from None


def _short(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 60 else pattern[:57] + "...")


# --- format checks ---------------------------------------------------------------------------
# The same formats, with the same meaning, as fastjsonschema's own regexes, rewritten for
# RE2 where they used lookaround (email, idn-hostname, duration); ``\Z`` is RE2's ``\z``.

_DATE = (
    r"\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
    r"|02-(?:0[1-9]|1\d|2[0-8]))"
    r"|(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29"
)
_HOST_LABEL = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9\-]{0,61}[A-Za-z0-9])"
_IDN_LABEL = r"(?:xn--)?[a-zA-Z0-9][a-zA-Z0-9-_]{0,61}[a-zA-Z0-9]?"

_FORMAT_PATTERNS: dict[str, str] = {
    "date-time": r"^(?:" + _DATE + r")(t|T)(?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d+)?"
    r"(?:[+-](?:[01]\d|2[0-3]):[0-5]\d|[+-](?:[01]\d|2[0-3])[0-5]\d|z|Z)\z",
    "date": r"^(?:" + _DATE + r")\z",
    "time": r"^(?:[01]?\d|2[0-3]):(?:[0-5]?\d)(?::(?:[0-5]?\d|60)(?:\.(?:\d{1,6}))?"
    r"([zZ]|[+-](?:[01]\d|2[0-3]):[0-5]\d)?)?\z",
    "hostname": r"^(" + _HOST_LABEL + r"\.)*" + _HOST_LABEL + r"\z",
    # Without lookahead: each label's first character is a letter or digit, never "-".
    "idn-hostname": r"^" + _IDN_LABEL + r"\.(?:xn--)?(?:[a-zA-Z0-9][a-zA-Z0-9\-]{0,49}"
    r"|[a-zA-Z0-9][a-zA-Z0-9-]{0,29}\.[a-zA-Z]{2,})\z",
    "idn-email": r"^[^@]+@[^@]+\.[^@]+\z",
    "uri": r"^\w+:(\/?\/?)[^\s]+\z",
    "iri": r"^\w+:(\/?\/?)[^\s]+\z",
    "uri-reference": r"^(\w+:(\/?\/?))?[^#\\\s]*(#[^\\\s]*)?\z",
    "iri-reference": r"^(\w+:(\/?\/?))?[^#\\\s]*(#[^\\\s]*)?\z",
    "uri-template": r"^(?:(?:[^\x00-\x20\"'<>%\\^`{|}]|%[0-9a-f]{2})|\{[+#./;?&=,!@|]?"
    r"(?:[a-z0-9_]|%[0-9a-f]{2})+(?::[1-9][0-9]{0,3}|\*)?(?:,(?:[a-z0-9_]|%[0-9a-f]{2})+"
    r"(?::[1-9][0-9]{0,3}|\*)?)*\})*\z",
    "json-pointer": r"^(/(([^/~])|(~[01]))*)*\z",
    "relative-json-pointer": r"^(?:0|[1-9][0-9]*)(?:#|(?:\/(?:[^~/]|~0|~1)*)*)\z",
    "uuid": r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\z",
    # P then at least one part; a T must be followed by at least one time part.
    "duration": r"^P(?:[0-9]+W|(?:[0-9]+Y)?(?:[0-9]+M)?(?:[0-9]+D)?"
    r"(?:T(?:[0-9]+H)?(?:[0-9]+M)?(?:[0-9]+S)?)?)\z",
}

_EMAIL = compile_pattern(r"^[^@]+@[^@]+\.[^@]+\z")


def _email(value: str) -> bool:
    """fastjsonschema's email rule without lookaround: no ".." before the @, the local
    part neither starts nor ends with ".", and a dot in the domain."""
    local, at, _ = value.partition("@")
    return (
        bool(at)
        and not local.startswith(".")
        and not local.endswith(".")
        and ".." not in local
        and _EMAIL.match(value) is not None
    )


_DURATION_PARTS = compile_pattern(r"[0-9]")


def _matcher(name: str, pattern: str) -> Callable[[str], bool]:
    compiled = compile_pattern(pattern)
    if name == "duration":
        # "P" alone and a "T" with nothing after it are not durations.
        return lambda value: (
            compiled.match(value) is not None
            and _DURATION_PARTS.search(value) is not None
            and not value.endswith("T")
        )
    return lambda value: compiled.match(value) is not None


def _ipv4(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True


def _ipv6(value: str) -> bool:
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return "%" not in value  # a zone index is no address


def _regex(value: str) -> bool:
    try:
        compile_pattern(value)
    except PatternError:
        return False
    return True


# Every format fastjsonschema asserts, each checked in linear time.
FORMATS: dict[str, Callable[[str], bool]] = {
    **{name: _matcher(name, pattern) for name, pattern in _FORMAT_PATTERNS.items()},
    "email": _email,
    "ipv4": _ipv4,
    "ipv6": _ipv6,
    "regex": _regex,
}
