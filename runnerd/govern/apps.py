"""The rules of apps and installs, on every surface: an app's slug belongs to the
workspace that deployed it first; only a published version is installed; an install's
egress grant only ever narrows what its version asks for."""

from __future__ import annotations

from collections.abc import Iterable

from runnerd import egress
from runnerd.errors import (
    AppNotFound,
    AppOwnedByAnotherWorkspace,
    EgressNotRequested,
    InvalidEgress,
    VersionNotFound,
    VersionNotPublished,
)
from runnerd.store import AppRecord, Store, VersionRecord

__all__ = ["narrowed_grant", "owned_app", "published_version"]


def owned_app(store: Store, slug: str, workspace_id: str) -> AppRecord:
    """The app ``slug``, if ``workspace_id`` may deploy and publish it (it owns it, or
    no workspace does); AppNotFound or AppOwnedByAnotherWorkspace otherwise."""
    app = store.get_app(slug)
    if app is None:
        raise AppNotFound(slug)
    if app.workspace_id not in (None, workspace_id):
        raise AppOwnedByAnotherWorkspace(slug)
    return app


def published_version(store: Store, slug: str, version: str) -> VersionRecord:
    """Version ``version`` of app ``slug``, if it may be installed (it is published);
    VersionNotFound or VersionNotPublished otherwise."""
    app = store.get_app(slug)
    found = store.find_version(app.id, version) if app else None
    if found is None:
        raise VersionNotFound(slug, version)
    if store.published_at(found.id) is None:
        raise VersionNotPublished(slug, version)
    return found


def narrowed_grant(
    requested: Iterable[str], entries: Iterable[str], version: str
) -> tuple[str, ...]:
    """The grant ``entries`` ask for, in normal form and without repeats, if each is
    covered by what the version asks for (``requested``); InvalidEgress or
    EgressNotRequested naming the first entry that is not."""
    asked = [egress.parse(e) for e in requested]
    granted: dict[str, None] = {}
    for i, entry in enumerate(entries):
        try:
            wanted = egress.parse(entry)
        except egress.EgressError as exc:
            raise InvalidEgress(i, str(exc)) from None
        if not any(egress.covers(a, wanted) for a in asked):
            raise EgressNotRequested(i, str(wanted), version)
        granted[str(wanted)] = None
    return tuple(granted)
