"""The rules a secret meets wherever it is given (the API, ``runnerd tool test --secret``):
its name is an environment variable name that neither runnerd nor the runtimes use, and
its value is long enough to scrub from what a run says and short enough to be a
credential, not a file."""

from __future__ import annotations

import re

from runnerd.errors import InvalidSecretName, InvalidSecretValue
from runnerd.limits import MAX_SECRET_BYTES, MAX_SECRET_NAME_CHARS, MIN_SCRUB_CHARS

__all__ = ["SECRET_NAME", "check_secret_name", "check_secret_value"]

# An environment variable name of at most MAX_SECRET_NAME_CHARS, in capitals.
SECRET_NAME = re.compile(rf"[A-Z_][A-Z0-9_]{{0,{MAX_SECRET_NAME_CHARS - 1}}}")
RESERVED_NAMES = frozenset({"PATH", "HOME", "LANG", "PWD", "SHELL", "USER", "TMPDIR"})
RESERVED_PREFIXES = ("RUNNERD_", "LD_", "PYTHON", "NODE_", "NSJAIL")


def check_secret_name(name: str) -> str:
    """``name``, if it may name a secret; InvalidSecretName otherwise."""
    if (
        not SECRET_NAME.fullmatch(name)
        or name in RESERVED_NAMES
        or name.startswith(RESERVED_PREFIXES)
    ):
        raise InvalidSecretName
    return name


def check_secret_value(value: str) -> str:
    """``value``, if it may be a secret's value; InvalidSecretValue otherwise."""
    if len(value.encode()) > MAX_SECRET_BYTES or len(value) < MIN_SCRUB_CHARS:
        raise InvalidSecretValue(
            f"a secret value is {MIN_SCRUB_CHARS} characters to {MAX_SECRET_BYTES // 1024} KB"
        )
    return value
