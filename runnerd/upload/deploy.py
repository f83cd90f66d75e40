"""What a deploy runs before it stores a version: every check of the upload, and the
package environments its tools need."""

from __future__ import annotations

from collections.abc import Mapping

from runnerd.errors import BundleRejected, EnvBuildFailed
from runnerd.model import Bundle, Problem
from runnerd.run.package_envs import EnvManager
from runnerd.run.toolchain import Toolchain
from runnerd.upload.bundle import load_bundle

__all__ = ["check_upload"]


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
