"""A write call held for approval keeps its input sealed in the store (AES-GCM with the
secrets key), so it is released after a restart of the node that held it, and a key
rotation carries it over; the input is nowhere on disk in the clear, and the sealed copy
is cleared when the approval is decided."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import RUNNERD
from daemon import running_daemon, serving_again
from test_governance import gov_app

pytestmark = pytest.mark.jail


def _on_disk(root: Path, marker: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and marker.encode() in p.read_bytes()]


def test_a_held_call_is_released_after_a_restart_and_a_key_rotation(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    with running_daemon(toolchain_dir, approval_ttl_s="600", warm_jails="0") as d:
        iid = d.ship(gov_app(tmp_path / "gov"))["installId"]
        asker = d.person("sealed-asker@example.com")
        marker = "sealed-" + os.urandom(8).hex()
        calls = [d.run(iid, "send", {"to": f"{marker}-{n}"}, key=asker, surface="relay")
                 for n in (1, 2)]  # fmt: skip
        assert [c.status_code for c in calls] == [202, 202], [c.text for c in calls]
        kept, denied = (c.json()["approvalId"] for c in calls)
        d.proc.terminate()
        d.proc.wait(timeout=20)
        assert _on_disk(d.data_dir, marker) == []  # sealed, never in the clear
        rotated = subprocess.run([RUNNERD, "admin", "rotate-secrets-key", "--json"],
                                 capture_output=True, text=True, env=d.env)  # fmt: skip
        assert rotated.returncode == 0, rotated.stderr

        with serving_again(d):
            no = d.call("POST", f"/api/v2/approvals/{denied}/deny", d.admin_key)
            assert no.status_code == 200, no.text
            yes = d.call("POST", f"/api/v2/approvals/{kept}/approve", d.admin_key)
            assert yes.status_code == 200, yes.text
            run = d.ended_run(yes.json()["runId"], asker)
            assert run["run"]["status"] == "succeeded"
            assert run["output"] == {"sent": f"{marker}-1"}
            again = d.call("POST", f"/api/v2/approvals/{kept}/approve", d.admin_key)
            assert again.status_code == 409  # one run, once

        store = d.store()
        try:
            for approval_id in (kept, denied):
                row = store.get_approval(approval_id)
                assert row is not None and row.sealed_input is None and row.sealed_nonce is None
            runs = [r for r in store.list_runs(iid, tool="send") if r.approval_id]
            assert [r.approval_id for r in runs] == [kept]
        finally:
            store.close()
