"""Files runnerd ships beside its code: published schemas and the sandbox harnesses.

In a source checkout they are top-level folders (``schemas/``, ``sandbox/``); in an
installed wheel they sit inside the package (pyproject's force-include).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["resource_dir"]

_PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """The folder ``name`` (``schemas`` or ``sandbox``); raise if the install lacks it."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"runnerd's {name}/ folder is missing from the installation")
