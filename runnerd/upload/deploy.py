"""The app lifecycle's checks: what a deploy runs before it stores a version."""

from __future__ import annotations

from collections.abc import Mapping

from runnerd.errors import BundleRejected, Problem
from runnerd.run.package_envs import EnvBuildFailed, EnvManager
from runnerd.run.toolchain import Toolchain
from runnerd.store import Store, VersionRecord
from runnerd.upload.bundle import Bundle, load_bundle

__all__ = ["check_upload", "upload_version"]


def check_upload(
    files: Mapping[str, bytes], *, toolchain: Toolchain | None, envs: EnvManager | None
) -> Bundle:
    """Every check of an upload, and the package environments its tools need, built so
    the first call does not pay for them. Touches no database (safe in a worker thread).

    Raises BundleRejected with every problem; an install failure is a problem of the
    tool file, with the installer's own message.
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
    return bundle


def upload_version(
    store: Store,
    files: Mapping[str, bytes],
    *,
    toolchain: Toolchain | None,
    envs: EnvManager | None = None,
    workspace_id: str | None = None,
) -> tuple[VersionRecord, Bundle]:
    """Check the uploaded ``files`` and store them as a new immutable version, all or nothing.

    Raises BundleRejected (with every problem) or VersionExists; in both cases the store
    is unchanged.
    """
    bundle = check_upload(files, toolchain=toolchain, envs=envs)
    return store.add_version(bundle, workspace_id=workspace_id), bundle
