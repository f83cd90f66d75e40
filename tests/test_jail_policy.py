"""The jail policy as golden files: nsjail's argv for each kind of jail, the /tmp mount
config the argv names, and the seccomp policy, so that any change to what a jail is
shows up as a reviewable diff of tests/golden/.

No jail is started. The argv is Sandbox.command's, of the Sandbox build_machine makes, for
fixed inputs (a fixed uid and fixed descriptors, default Settings, and placeholders for the
runtimes and cgroups a host has), and what
would differ between machines (the temporary folders, the process id in the proxy socket's
name) is replaced by placeholders too, so the files are the same on every host.

After a deliberate change, regenerate the files and review their diff:

    RUNNERD_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_jail_policy.py -p no:cacheprovider
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
from pathlib import Path

import pytest

from runnerd.config import load_settings
from runnerd.limits import DEFAULT_TIMEOUT_MS
from runnerd.run.cgroups import Cgroups
from runnerd.run.jail import JailKind, Sandbox, reachable_harnesses
from runnerd.run.machine import build_sandbox
from runnerd.run.runtimes import NodeRuntime, PythonRuntime, Runtimes
from runnerd.run.warm import WAITING_WALL_S

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("RUNNERD_UPDATE_GOLDEN") == "1"
REGENERATE = (
    "RUNNERD_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_jail_policy.py -p no:cacheprovider"
)

UID = 700_123  # the jail's outside uid (from the UidPool)
RESULT_FD, LOG_FD = 7, 9  # the jail's ends of the result pipe and of nsjail's log
ENV_DIR = Path("/var/cache/runnerd/envs/0123456789abcdef")  # a tool's package environment
# What runtimes.py finds on a host (the binary, its library folders, each shared library
# it links): host-specific, so placeholders; the jail mounts each one read-only.
RUNTIMES = Runtimes(
    python=PythonRuntime(
        executable="<python>",
        version="3.11.2",
        mounts=("<python>", "<python stdlib>", "<real shared library>:<shared library>"),
    ),
    node=NodeRuntime(
        path="<node>",
        version="20.20.2",
        mounts=("<node>", "<real shared library>:<shared library>"),
    ),
)
CGROUPS_V2 = Cgroups("v2", ("--use_cgroupv2", "--cgroupv2_mount", "<cgroup>/jails"), has_cpu=True)
NO_CGROUPS = Cgroups("none", ())
COLD_WALL_S = math.ceil(DEFAULT_TIMEOUT_MS / 1000)  # a call's own jail, for the default timeout

# name: (kind, wall_s, waiting, cgroups)
CASES = {
    "python-cold": (JailKind("python", None), COLD_WALL_S, False, CGROUPS_V2),
    "python-warm": (JailKind("python", None), WAITING_WALL_S, True, CGROUPS_V2),
    "python-warm-packages": (JailKind("python", ENV_DIR), WAITING_WALL_S, True, CGROUPS_V2),
    "python-egress": (JailKind("python", None, egress=True), COLD_WALL_S, False, CGROUPS_V2),
    "python-cold-no-cgroups": (JailKind("python", None), COLD_WALL_S, False, NO_CGROUPS),
    "node-cold": (JailKind("javascript", None), COLD_WALL_S, False, CGROUPS_V2),
    "node-warm": (JailKind("javascript", None), WAITING_WALL_S, True, CGROUPS_V2),
    "node-warm-packages": (JailKind("typescript", ENV_DIR), WAITING_WALL_S, True, CGROUPS_V2),
    "node-egress": (JailKind("javascript", None, egress=True), COLD_WALL_S, False, CGROUPS_V2),
    "node-cold-no-cgroups": (JailKind("javascript", None), COLD_WALL_S, False, NO_CGROUPS),
}


class _Placeholders:
    """Machine-dependent parts of the policy, as placeholders."""

    def __init__(self, harness: Path, state: Path) -> None:
        self._parts = [(str(harness), "<harness>"), (str(state), "<state>")]

    def __call__(self, text: str) -> str:
        for real, placeholder in self._parts:
            text = text.replace(real, placeholder)
        return re.sub(r"/egress/\d+\.sock", "/egress/<pid>.sock", text)


def _sandbox(tmp_path: Path, cgroups: Cgroups) -> tuple[Sandbox, _Placeholders]:
    """The daemon's Sandbox for default Settings, the placeholder runtimes and ``cgroups``."""
    flags = {"data_dir": tmp_path / "data", "uid_lock_dir": tmp_path / "uids", "nsjail": "<nsjail>"}
    settings = load_settings(env={}, flags=flags)
    # Compiled by this interpreter: the jails' bytecode harness, as on a daemon whose
    # jails run the interpreter it runs on.
    harness = reachable_harnesses(tmp_path / "harness", sys.executable)
    sandbox = build_sandbox(settings, runtimes=RUNTIMES, cgroups=cgroups, harness_dir=harness)
    return sandbox, _Placeholders(harness, tmp_path)


def _matches_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return
    assert path.is_file(), f"no golden file {path}; write it with:\n    {REGENERATE}"
    golden = path.read_text()
    if text != golden:
        diff = "".join(
            difflib.unified_diff(
                golden.splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"tests/golden/{name}",
                "now",
            )
        )
        pytest.fail(
            f"the jail policy changed ({name}):\n{diff}\nIf the change is meant, "
            f"regenerate the golden files and review their diff:\n    {REGENERATE}",
            pytrace=False,
        )


@pytest.mark.parametrize("case", list(CASES))
def test_nsjail_argv_of_each_kind_of_jail_is_the_golden_one(tmp_path: Path, case: str) -> None:
    kind, wall_s, waiting, cgroups = CASES[case]
    sandbox, placeholders = _sandbox(tmp_path, cgroups)
    argv = sandbox.command(kind, UID, RESULT_FD, LOG_FD, wall_s, waiting=waiting)
    _matches_golden(f"argv-{case}.txt", "".join(placeholders(arg) + "\n" for arg in argv))


def test_the_tmp_mount_config_the_argv_names_is_the_golden_one(tmp_path: Path) -> None:
    sandbox, _ = _sandbox(tmp_path, CGROUPS_V2)
    argv = sandbox.command(JailKind("python", None), UID, RESULT_FD, LOG_FD, COLD_WALL_S)
    config = Path(argv[argv.index("--config") + 1])
    _matches_golden("jail-tmp-config.txt", config.read_text())


def test_the_seccomp_policy_the_argv_names_is_the_golden_one(tmp_path: Path) -> None:
    """The rules nsjail loads: the policy file, less its comments and blank lines (those
    change no rule, so editing them needs no new golden file)."""
    sandbox, _ = _sandbox(tmp_path, CGROUPS_V2)
    argv = sandbox.command(JailKind("python", None), UID, RESULT_FD, LOG_FD, COLD_WALL_S)
    policy = Path(argv[argv.index("--seccomp_policy") + 1]).read_text()
    policy = re.sub(r"/\*.*?\*/", "", policy, flags=re.DOTALL)
    rules = [re.sub(r"//.*", "", line).rstrip() for line in policy.splitlines()]
    _matches_golden("seccomp-policy.txt", "".join(f"{line}\n" for line in rules if line.strip()))
