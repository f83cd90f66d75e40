"""Package pins: each package a tool lists must name one exact version, as a lockfile does.

npm (JavaScript and TypeScript tools): ``name@1.2.3`` or ``@scope/name@1.2.3``.
PyPI (Python tools): ``name==1.2.3``, ``name[extra]==1.2.3``, also ``name@1.2.3``.
Ranges, tags, URLs, paths and the other ecosystem's syntax are refused with a reason.
"""

from __future__ import annotations

import re

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from runnerd.limits import MAX_NPM_NAME_CHARS
from runnerd.model import Language

__all__ = ["PinError", "normalize_pin", "pin_name"]

_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?"
)
_NPM_NAME = re.compile(r"(@[a-z0-9~][a-z0-9._~-]*/)?[a-z0-9~][a-z0-9._~-]*")
_PYPI = re.compile(
    r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
    r"(?P<extras>\[[A-Za-z0-9._,\s-]*\])?\s*(?P<op>===|==|@|~=|!=|<=|>=|<|>)?\s*(?P<version>.*)"
)
_URLISH = re.compile(r"://|^(git\+|git:|github:|file:|link:|workspace:|npm:|http)|^[./~]")


class PinError(ValueError):
    """A package entry that is not an exact pin for the tool's ecosystem; says why."""


def pin_name(pin: str) -> str:
    """The package name of a normalized pin (``zod`` of ``zod@3.25.76``, ``requests`` of
    ``requests==2.32.3``)."""
    if "==" in pin:
        return pin.split("==", 1)[0].split("[", 1)[0]
    return pin[: pin.rindex("@")]


def normalize_pin(entry: str, language: Language) -> str:
    """The canonical form of ``entry`` for a tool in ``language``; raise PinError if refused."""
    entry = entry.strip()
    if language == "python":
        return _pypi(entry)
    return _npm(entry)


def _npm(entry: str) -> str:
    if "==" in entry or re.search(r"(>=|<=|~=|!=)", entry):
        raise PinError(
            f"{entry!r} is PyPI syntax, but this is a JavaScript/TypeScript tool: "
            "npm packages are pinned as name@1.2.3"
        )
    at = entry.rfind("@")
    if at <= 0:
        raise PinError(f"{entry!r} has no version: pin it exactly, such as zod@3.25.76")
    name, version = entry[:at], entry[at + 1 :]
    if _URLISH.search(version) or _URLISH.search(name):
        raise PinError(f"{entry!r} is a URL, path or git reference: pin a registry version")
    if not _NPM_NAME.fullmatch(name) or len(name) > MAX_NPM_NAME_CHARS:
        raise PinError(f"{name!r} is not a valid npm package name")
    if _SEMVER.fullmatch(version):
        return f"{name}@{version}"
    if re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*", version):
        raise PinError(f"{entry!r} names the tag {version!r}, not an exact version like 1.2.3")
    raise PinError(f"{entry!r} is a range or a partial version: pin one exact version like 1.2.3")


def _pypi(entry: str) -> str:
    if entry.startswith("@"):
        raise PinError(
            f"{entry!r} is an npm package, but this is a Python tool: "
            "list PyPI packages as name==1.2.3"
        )
    if ";" in entry:
        raise PinError(f"{entry!r} has an environment marker; list the exact pin only")
    match = _PYPI.fullmatch(entry)
    if match is None:
        raise PinError(f"{entry!r} is not a valid PyPI requirement")
    op, version = match.group("op"), match.group("version").strip()
    if op is None:
        raise PinError(f"{entry!r} has no version: pin it exactly, such as requests==2.32.3")
    if op == "@" and _URLISH.search(version):
        raise PinError(f"{entry!r} is a URL or path: pin a version from the index")
    if op not in ("==", "@") or "*" in version or "," in version:
        raise PinError(f"{entry!r} is a range: pin one exact version with ==")
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise PinError(f"{entry!r}: {version!r} is not a valid version") from None
    extras = match.group("extras") or ""
    if extras:
        names = sorted(canonicalize_name(x) for x in extras[1:-1].split(",") if x.strip())
        extras = f"[{','.join(names)}]"
    return f"{canonicalize_name(match.group('name'))}{extras}=={parsed}"
