"""Every spelling of a secret that docs/SECURITY.md lists ("Secrets in what a run returns")
is caught: scrubbed out of a real run's error and logs, and an output holding it withheld.
The length rules (MIN_SCRUB_CHARS, MIN_FOLDED_CHARS) are tested too: what a short value
is not looked for in.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.parse

import pytest

from conftest import make_tool, run_tool
from runnerd.limits import MIN_FOLDED_CHARS, MIN_SCRUB_CHARS
from runnerd.run.machine import Machine
from runnerd.run.scrub import REDACTED, Scrubber

# A value with bytes that URL-, form- and JSON-encoding each change (/ + = " ! and a space).
LONG = 'Sk_live/4f9c+2D="7e! 1b'
MULTI = "first-line-Q7zp\nsecond-line-of-the-key\nthird-line-Vx9w"
SHORT = "pw!7Q"  # 5 characters: at least MIN_SCRUB_CHARS, under MIN_FOLDED_CHARS
# Letters whose casefold() is longer than they are (ß -> ss, ﬁ -> fi, İ -> i̇).
UNICODE = "Geheim-Straße-ﬁx-İ-4711"
SECRETS = {"LONG": LONG, "MULTI": MULTI, "SHORT": SHORT, "UNICODE": UNICODE}

_PERCENT = "''.join('%%%02X' % c for c in raw)"
_MIXED = "''.join(('%%%02X' if n % 2 else '%%%02x') % c for n, c in enumerate(raw))"

# (the secret, a Python expression of it: ``value`` str, ``raw`` bytes), by the list's names.
SPELLINGS: dict[str, tuple[str, str]] = {
    "as is": ("LONG", "value"),
    "URL-encoded": ("LONG", "urllib.parse.quote(value, safe='')"),
    "form-encoded": ("LONG", "urllib.parse.quote_plus(value)"),
    "JSON-escaped": ("LONG", "json.dumps(value)[1:-1]"),
    "base64": ("LONG", "base64.b64encode(raw).decode()"),
    "base64 after 1 byte": ("LONG", "base64.b64encode(b'x' + raw).decode()"),
    "base64 after 2 bytes": ("LONG", "base64.b64encode(b'xy' + raw).decode()"),
    "URL-safe base64": ("LONG", "base64.urlsafe_b64encode(raw).decode()"),
    "URL-safe base64 after 1 byte": ("LONG", "base64.urlsafe_b64encode(b'?' + raw).decode()"),
    "a line of a multi-line value": ("MULTI", "value.splitlines()[1]"),
    "a line, JSON-escaped": ("MULTI", "json.dumps(value.splitlines()[0])"),
    "a multi-line value JSON-escaped": ("MULTI", "json.dumps(value)"),
    "every byte %-encoded, upper case": ("LONG", _PERCENT),
    "every byte %-encoded, lower case": ("LONG", _PERCENT + ".lower()"),
    "every byte %-encoded, mixed case": ("LONG", _MIXED),
    "every byte %-encoded, a short value": ("SHORT", _PERCENT + ".lower()"),
    "as is, a short value": ("SHORT", "value"),
    "as is, letters that fold to two": ("UNICODE", "value"),
    "reversed, letters that fold to two": ("UNICODE", "value[::-1]"),
    "JSON-escaped, letters that fold to two": ("UNICODE", "json.dumps(value)[1:-1]"),
    "URL-encoded, letters that fold to two": ("UNICODE", "urllib.parse.quote(value, safe='')"),
    "base64, a short value": ("SHORT", "base64.b64encode(raw).decode()"),
    "any letter case": ("LONG", "value.swapcase()"),
    "upper case": ("LONG", "value.upper()"),
    "reversed": ("LONG", "value[::-1]"),
    "reversed, upper case": ("LONG", "value[::-1].upper()"),
    "hex": ("LONG", "raw.hex()"),
    "hex, upper case": ("LONG", "raw.hex().upper()"),
    "URL-encoded, lower-case hex": ("LONG", "urllib.parse.quote(value, safe='').lower()"),
    "base32": ("LONG", "base64.b32encode(raw).decode()"),
    "base32 after 3 bytes, lower case": ("LONG", "base64.b32encode(b'abc' + raw).decode().lower()"),
    "base64, lower case": ("LONG", "base64.b64encode(raw).decode().lower()"),
    "base64 after 2 bytes, upper case": ("LONG", "base64.b64encode(b'xy' + raw).decode().upper()"),
}

_TOOL = """\
import base64, json, os, urllib.parse
def run(i):
    value = os.environ[{secret!r}]
    raw = value.encode()
    shown = {expr}
    print("log:", shown)
    if i.get("give"):
        return {{"leak": "see " + shown}}
    raise RuntimeError("failed with " + shown)
"""


def _spelled(secret: str, expr: str) -> str:
    found = eval(expr, {"base64": base64, "json": json, "urllib": urllib}, {
        "value": SECRETS[secret], "raw": SECRETS[secret].encode()
    })  # fmt: skip
    assert isinstance(found, str)
    return found


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_listed_spelling_is_scrubbed(spelling: str) -> None:
    secret, expr = SPELLINGS[spelling]
    shown = _spelled(secret, expr)
    scrub = Scrubber(SECRETS)
    assert shown not in scrub.scrub(f"before {shown} after") and REDACTED in scrub.scrub(shown)
    assert scrub.found_in(json.dumps({"leak": shown})) == [secret]


@pytest.mark.jail
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_listed_spelling_is_scrubbed_from_a_runs_error_and_logs(
    machine: Machine, spelling: str
) -> None:
    secret, expr = SPELLINGS[spelling]
    shown = _spelled(secret, expr)
    tool = make_tool(machine, _TOOL.format(secret=secret, expr=expr))
    result = run_tool(machine, tool, secrets=SECRETS)
    assert result.status == "failed"
    for text in (result.error or "", result.logs):
        assert REDACTED in text, text
        assert shown not in text, text


@pytest.mark.jail
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_an_output_with_a_listed_spelling_is_withheld(machine: Machine, spelling: str) -> None:
    secret, expr = SPELLINGS[spelling]
    shown = _spelled(secret, expr)
    tool = make_tool(machine, _TOOL.format(secret=secret, expr=expr))
    result = run_tool(machine, tool, {"give": True}, secrets=SECRETS)
    assert result.status == "failed" and result.output is None
    assert result.error == f"output withheld: it contains the value of the secret {secret}"
    assert shown not in result.logs and REDACTED in result.logs


@pytest.mark.parametrize(
    "text",
    [
        SHORT[::-1],  # reversed: only for MIN_FOLDED_CHARS or more
        SHORT.upper(),  # another case: the same
        SHORT.encode().hex(),  # hex: the same
        "pw!",  # a fragment under MIN_SCRUB_CHARS
    ],
)
def test_a_short_value_is_not_looked_for_in_common_text_spellings(text: str) -> None:
    assert MIN_SCRUB_CHARS <= len(SHORT) < MIN_FOLDED_CHARS
    assert Scrubber({"SHORT": SHORT}).scrub(f"a {text} b") == f"a {text} b"


def test_a_spelling_under_min_scrub_chars_is_not_looked_for() -> None:
    value = "a1!"  # as is, 3 characters: not looked for; every byte %-encoded, 9: looked for
    assert len(value) < MIN_SCRUB_CHARS
    assert Scrubber({"TINY": value}).scrub(f"{value} %61%31%21") == f"{value} {REDACTED}"


def test_building_a_scrubber_stays_cheap() -> None:
    """One Scrubber (one RE2) per run: ten secrets of 40 characters build in well under
    the time a jail takes to start (a few ms here; a run takes tens). Counted in this
    process's CPU time, which other work on the machine does not stretch."""
    secrets = {f"S{i}": f"sk_live_{i:02d}_4f9c2d7e1b8a93c5d0e7f1a2b3c4d5e6" for i in range(10)}
    Scrubber(secrets)
    started = time.process_time()
    for _ in range(20):
        Scrubber(secrets)
    assert (time.process_time() - started) / 20 < 0.02
