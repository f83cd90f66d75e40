"""The app lifecycle. For now: upload, the function a deploy calls."""

from __future__ import annotations

from collections.abc import Mapping

from runnerd.bundle import Bundle, load_bundle
from runnerd.envs import EnvBuildFailed, EnvManager
from runnerd.errors import BundleRejected, Problem
from runnerd.store import Store, VersionRecord
from runnerd.toolchain import Toolchain

__all__ = ["upload_version"]


def upload_version(
    store: Store,
    files: Mapping[str, bytes],
    *,
    toolchain: Toolchain | None,
    envs: EnvManager | None = None,
) -> tuple[VersionRecord, Bundle]:
    """Check the uploaded ``files`` and store them as a new immutable version, all or nothing.

    With ``envs``, every package environment the tools need is built first, so the first
    call does not pay for it; an install failure refuses the upload with the installer's
    message. Raises BundleRejected (with every problem) or VersionExists; in both cases
    the store is unchanged.
    """
    bundle = load_bundle(files, toolchain=toolchain)
    if envs is not None:
        problems = []
        for tool in bundle.tools:
            if not tool.packages:
                continue
            try:
                envs.ensure_sync(tool.language, tool.packages)
            except EnvBuildFailed as exc:
                problems.append(Problem(tool.yaml_path, f"packages: the install failed: {exc}"))
        if problems:
            raise BundleRejected(problems)
    return store.add_version(bundle), bundle
