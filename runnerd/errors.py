"""Domain errors. They know nothing about HTTP; the API layer maps them to the envelope."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["BudgetExhausted", "BundleRejected", "Problem", "RunnerdError", "VersionExists"]


class Problem(msgspec.Struct, frozen=True, omit_defaults=True):
    """One thing wrong with an upload: the file (relative to the app), the line, the message."""

    file: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.message}"


class RunnerdError(Exception):
    """Base of every error runnerd raises on purpose.

    An error a caller of the API may meet says so with ``reason`` (the wire reason,
    ``details.code``) and ``status`` (the HTTP status); ``wire_details`` adds what the caller
    needs besides, and ``retry_after_s`` when trying again later will work. The API maps
    every such error through these, in one place (api/errors.py). An error without a
    ``reason`` never reaches a caller as such: it is a 500.
    """

    reason: str | None = None
    status: int = 500
    retry_after_s: int | None = None

    def wire_details(self) -> dict[str, Any]:
        return {}


class BundleRejected(RunnerdError):
    """An upload had problems; nothing was stored. ``problems`` lists every one found."""

    reason, status = "BUNDLE_REJECTED", 400

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        count = len(problems)
        super().__init__(
            f"{count} problem{'s' if count != 1 else ''} in the upload; nothing stored"
        )

    def __repr__(self) -> str:
        return f"BundleRejected({len(self.problems)} problems: {self.problems[:3]!r}...)"

    def wire_details(self) -> dict[str, Any]:
        return {"problems": [msgspec.to_builtins(p) for p in self.problems]}


class VersionExists(RunnerdError):
    """The app already has a version with this version string; versions are immutable."""

    reason, status = "VERSION_EXISTS", 409

    def __init__(self, slug: str, version: str) -> None:
        self.slug = slug
        self.version = version
        super().__init__(
            f"app {slug!r} already has version {version!r}; versions are immutable, "
            "so change `version` in agentserve.app.yaml (or remove it to get the next number)"
        )


class BudgetExhausted(RunnerdError):
    """The install's monthly budget is spent; refused before any sandbox starts."""

    reason, status = "budget_exhausted", 403  # lowercase: the wire reason apps already know

    def __init__(self, install_id: str, resets_at: str) -> None:
        self.install_id = install_id
        self.resets_at = resets_at
        super().__init__(
            f"the monthly budget of this install is spent; it resets at {resets_at}, or "
            "when an admin raises it"
        )

    def wire_details(self) -> dict[str, Any]:
        return {"resetsAt": self.resets_at}


class DatabaseUnavailable(RunnerdError):
    """The shared database (PostgreSQL) did not answer; nothing was started or changed.
    Try again shortly: the node reconnects on the next call."""

    reason, status, retry_after_s = "DATABASE_UNAVAILABLE", 503, 5
