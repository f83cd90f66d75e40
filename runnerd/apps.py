"""The app lifecycle. For now: upload, the function a deploy calls."""

from __future__ import annotations

from collections.abc import Mapping

from runnerd.bundle import Bundle, load_bundle
from runnerd.store import Store, VersionRecord
from runnerd.toolchain import Toolchain

__all__ = ["upload_version"]


def upload_version(
    store: Store, files: Mapping[str, bytes], *, toolchain: Toolchain | None
) -> tuple[VersionRecord, Bundle]:
    """Check the uploaded ``files`` and store them as a new immutable version, all or nothing.

    Raises BundleRejected (with every problem) or VersionExists; in both cases the store
    is unchanged.
    """
    bundle = load_bundle(files, toolchain=toolchain)
    return store.add_version(bundle), bundle
