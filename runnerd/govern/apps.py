"""The rules of apps and installs, on every surface: an app's slug belongs to the
workspace that deployed it first; only a published version is installed; an install's
egress grant only ever narrows what its version asks for. And the changes of what an
install offers (install, switch, rollback), each announced to every surface that
listens (``Governor.on_tools_changed``: MCP), whichever surface made it."""

from __future__ import annotations

from collections.abc import Iterable

from runnerd import egress
from runnerd.errors import (
    AppNotFound,
    AppOwnedByAnotherWorkspace,
    EgressNotRequested,
    InvalidEgress,
    NoPreviousVersion,
    VersionNotFound,
    VersionNotPublished,
)
from runnerd.govern.admission import Principal
from runnerd.govern.governor import Governor
from runnerd.model import Bundle
from runnerd.run.package_envs import announce
from runnerd.store import AppRecord, InstallRecord, Store, VersionRecord

__all__ = [
    "add_version",
    "check_owner",
    "install_version",
    "narrowed_grant",
    "owned_app",
    "published_version",
    "rollback_install",
    "switch_install",
]


def check_owner(app: AppRecord, workspace_id: str | None) -> AppRecord:
    """``app``, if ``workspace_id`` may deploy and publish it (it owns it, or no
    workspace does); AppOwnedByAnotherWorkspace otherwise."""
    if app.workspace_id not in (None, workspace_id):
        raise AppOwnedByAnotherWorkspace(app.slug)
    return app


def owned_app(store: Store, slug: str, workspace_id: str) -> AppRecord:
    """The app ``slug``, if ``workspace_id`` may deploy and publish it (``check_owner``);
    AppNotFound or AppOwnedByAnotherWorkspace otherwise."""
    app = store.get_app(slug)
    if app is None:
        raise AppNotFound(slug)
    return check_owner(app, workspace_id)


def add_version(
    store: Store,
    bundle: Bundle,
    *,
    workspace_id: str,
    user_id: str | None,
    key_id: str | None,
    git: tuple[str, str | None] | None = None,
) -> VersionRecord:
    """Store a checked bundle as a new version of its app, for ``workspace_id`` (``git``:
    the commit and ref of a Git deploy): a new
    slug becomes the workspace's; one another workspace owns is refused
    (AppOwnedByAnotherWorkspace). Ownership is checked in the transaction that adds the
    version, so of two workspaces deploying one new slug at once, one owns it and the
    other is refused as any later deploy would be. Every other node is told to build
    the version's package envs (``announce``; this node built them before)."""

    def check(app: AppRecord) -> AppRecord:
        return check_owner(app, workspace_id)

    version = store.add_version(
        bundle,
        workspace_id=workspace_id,
        user_id=user_id,
        key_id=key_id,
        check_app=check,
        git=git,
    )
    if any(tool.packages for tool in bundle.tools):
        announce(store, version.id)
    return version


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


async def install_version(
    governor: Governor, workspace_id: str, slug: str, version: str, *, who: Principal
) -> InstallRecord:
    """Install a published version of app ``slug`` into the workspace (a second install
    of the app switches the first), and tell every surface its tools changed."""
    store = governor.store
    found = await store.io(published_version, store, slug, version)
    install = await store.io(
        store.create_install, workspace_id, found.app_id, found.id, who.user_id, key_id=who.key_id
    )
    await store.io(announce, store, found.id)  # a node that missed the deploy builds now
    await governor.tools_changed()
    return install


async def switch_install(
    governor: Governor, install: InstallRecord, version: str, *, who: Principal
) -> InstallRecord:
    """Switch the install to another published version of its app (its egress grant
    becomes what that version asks for), and tell every surface its tools changed."""
    store = governor.store
    found = await store.io(published_version, store, install.app_slug, version)
    switched = await store.io(
        store.switch_install, install.id, found.id, user_id=who.user_id, key_id=who.key_id
    )
    await store.io(announce, store, found.id)
    await governor.tools_changed()
    return switched


async def rollback_install(
    governor: Governor, install: InstallRecord, *, who: Principal
) -> InstallRecord:
    """Roll the install back to its previous version (NoPreviousVersion when it never ran
    another), and tell every surface its tools changed."""
    store = governor.store
    rolled = await store.io(
        store.rollback_install, install.id, user_id=who.user_id, key_id=who.key_id
    )
    if rolled is None:
        raise NoPreviousVersion
    await store.io(announce, store, rolled.version_id)
    await governor.tools_changed()
    return rolled


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
