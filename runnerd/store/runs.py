"""Runs: the row written before a sandbox starts, and its end."""

from __future__ import annotations

from typing import Any

from runnerd.store.core import StoreBase
from runnerd.store.records import (
    InstallRecord,
    new_id,
    utc_now,
)


class RunsStore(StoreBase):
    # --- Runs -------------------------------------------------------------------------------

    def start_run(
        self,
        *,
        install: InstallRecord,
        tool: str,
        user_id: str,
        surface: str,
        workflow_run_id: str | None = None,
    ) -> str:
        """A run's row, written before its sandbox starts."""
        run_id = new_id("run")
        with self._write():
            self.db.execute(
                """INSERT INTO runs (id, workspace_id, install_id, app_id, version_id, tool,
                   user_id, surface, workflow_run_id, started_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [
                    run_id,
                    install.workspace_id,
                    install.id,
                    install.app_id,
                    install.version_id,
                    tool,
                    user_id,
                    surface,
                    workflow_run_id,
                    utc_now(),
                ],
            )
        return run_id

    def finish_run(self, run_id: str, *, status: str, duration_ms: int) -> None:
        with self._write():
            self.db.execute(
                "UPDATE runs SET status = ?, duration_ms = ?, ended_at = ? WHERE id = ?",
                [status, duration_ms, utc_now(), run_id],
            )

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        rows = list(self.db.query("SELECT * FROM runs WHERE id = ?", [run_id]))
        return rows[0] if rows else None
