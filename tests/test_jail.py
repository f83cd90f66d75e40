"""The jail's outside uids: one per live jail, host-wide."""

from __future__ import annotations

from pathlib import Path

import pytest

from runnerd.config import load_settings
from runnerd.run.jail import SandboxUnavailable, UidPool


def test_two_pools_over_one_host_folder_never_hand_out_the_same_uid(tmp_path: Path) -> None:
    # Two daemons with their own data dirs and overlapping ranges, as on one host.
    first = UidPool(tmp_path / "uids", 700_000, 3)
    second = UidPool(tmp_path / "uids", 700_001, 3)
    held = [first.lease() for _ in range(3)]
    taken = {uid for uid, _ in held}
    assert taken == {700_000, 700_001, 700_002}
    uid, lock = second.lease()
    assert uid == 700_003
    with pytest.raises(SandboxUnavailable):
        second.lease()
    lock.close()
    held[0][1].close()
    assert second.lease()[0] in {held[0][0], 700_003}


def test_the_uid_locks_live_outside_every_data_dir(tmp_path: Path) -> None:
    settings = load_settings(env={}, flags={"data_dir": tmp_path / "data"})
    assert settings.uid_lock_dir == Path("/run/runnerd/uids")
    assert not settings.uid_lock_dir.is_relative_to(settings.data_dir)
