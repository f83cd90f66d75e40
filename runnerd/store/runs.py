"""Runs, budgets and the usage ledger.

A run's row is written before its sandbox starts, together with its budget reservation
(the tool's timeout). Its end, its ledger row, its audit entry and the settlement of its
reservation to the real time are written in one transaction. Runs a killed daemon left
open are closed by ``recover_interrupted`` at the next start.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from runnerd.errors import BudgetExhausted
from runnerd.ids import new_id, stamp, utc_now
from runnerd.model import RunEnd, RunStatus, Surface
from runnerd.store.audit import AuditStore
from runnerd.store.records import InstallRecord

LEDGER_KIND_TOOL = "app-tool"  # the usage ledger's kind for a tool run's sandbox time


def month_of(stamp: str) -> str:
    """'2026-11' of an ISO 8601 UTC time."""
    return stamp[:7]


def month_end(month: str) -> str:
    """When a budget month ends (the next month starts), ISO 8601 UTC."""
    start = datetime.strptime(month + "-01", "%Y-%m-%d").replace(tzinfo=UTC)
    return stamp((start + timedelta(days=32)).replace(day=1))


class BudgetStatus(msgspec.Struct, frozen=True):
    install_id: str
    month: str
    monthly_ms: int | None  # None: unlimited
    used_ms: int
    reserved_ms: int
    resets_at: str

    @property
    def spent(self) -> bool:
        """Whether the month admits no more runs: what ran and what admitted runs have
        reserved reach the budget (an unlimited one is never spent)."""
        return self.monthly_ms is not None and self.used_ms + self.reserved_ms >= self.monthly_ms


class RunRow(msgspec.Struct, frozen=True):
    id: str
    workspace_id: str
    install_id: str
    app_id: str
    version_id: str
    tool: str
    user_id: str
    surface: Surface
    status: RunStatus
    started_at: str
    workflow_run_id: str | None = None
    duration_ms: int | None = None
    ended_at: str | None = None
    error_kind: str | None = None
    approval_id: str | None = None
    user_email: str | None = None
    version: str | None = None
    # Per destination reached through the egress proxy: {destination, connections,
    # bytesSent, bytesReceived[, refused]}; None for a run without a grant.
    egress: list[dict[str, Any]] | None = None


_RUN_SQL = """SELECT r.id, r.workspace_id, r.install_id, r.app_id, r.version_id, r.tool,
    r.user_id, r.surface, r.status, r.started_at, r.workflow_run_id, r.duration_ms,
    r.ended_at, r.error_kind, r.approval_id, u.email AS user_email, v.version, r.egress
FROM runs r LEFT JOIN users u ON u.id = r.user_id
LEFT JOIN app_versions v ON v.id = r.version_id"""


def _json_or_null(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _run_row(row: dict[str, Any]) -> RunRow:
    egress = row.get("egress")
    return RunRow(**{**row, "egress": None if egress is None else json.loads(egress)})


class RunsStore(AuditStore):
    # --- budgets ------------------------------------------------------------------------------

    def set_budget(
        self,
        install_id: str,
        monthly_ms: int | None,
        user_id: str | None,
        *,
        workspace_id: str,
        key_id: str | None = None,
    ) -> None:
        with self._write(f"budget:{install_id}"):
            before = self.db.execute(
                "SELECT monthly_ms FROM budgets WHERE install_id = ?", [install_id]
            ).fetchone()
            self.db.execute(
                """INSERT INTO budgets VALUES (?, ?, ?, ?) ON CONFLICT (install_id) DO UPDATE
                   SET monthly_ms = excluded.monthly_ms, updated_at = excluded.updated_at,
                   updated_by = excluded.updated_by""",
                [install_id, monthly_ms, utc_now(), user_id],
            )
            self._append_audit(
                "budget.set",
                workspace_id=workspace_id,
                install_id=install_id,
                actor_user_id=user_id,
                actor_key_id=key_id,
                detail={
                    "monthlyMs": monthly_ms,
                    "previousMonthlyMs": before[0] if before else None,
                },
            )

    def budget(self, install_id: str, month: str | None = None) -> BudgetStatus:
        month = month or month_of(utc_now())
        limit = self.db.execute(
            "SELECT monthly_ms FROM budgets WHERE install_id = ?", [install_id]
        ).fetchone()
        usage = self.db.execute(
            "SELECT used_ms, reserved_ms FROM budget_usage WHERE install_id = ? AND month = ?",
            [install_id, month],
        ).fetchone()
        return BudgetStatus(
            install_id=install_id,
            month=month,
            monthly_ms=limit[0] if limit else None,
            used_ms=usage[0] if usage else 0,
            reserved_ms=usage[1] if usage else 0,
            resets_at=month_end(month),
        )

    def _usage(self, install_id: str, month: str, used: int, reserved: int) -> None:
        self.db.execute(
            """INSERT INTO budget_usage VALUES (?, ?, ?, ?) ON CONFLICT (install_id, month)
               DO UPDATE SET used_ms = budget_usage.used_ms + excluded.used_ms,
                 reserved_ms = CASE WHEN budget_usage.reserved_ms + excluded.reserved_ms < 0
                               THEN 0 ELSE budget_usage.reserved_ms + excluded.reserved_ms END""",
            [install_id, month, used, reserved],
        )

    # --- runs ---------------------------------------------------------------------------------

    def start_run(
        self,
        *,
        install: InstallRecord,
        tool: str,
        user_id: str,
        surface: Surface,
        timeout_ms: int = 0,
        version_id: str | None = None,
        workflow_run_id: str | None = None,
        approval_id: str | None = None,
        run_id: str | None = None,
        idempotency: tuple[str, str] | None = None,
    ) -> str:
        """Admit a run: check the budget, reserve the tool's timeout, write the run's row,
        all in one transaction. Raises BudgetExhausted (and writes nothing) when the
        month's budget is spent, counting what admitted runs have reserved.

        In the same transaction, the approval that released the run (``approval_id``)
        and the idempotency key that claimed it (``idempotency``: user id, key) are given
        the run's id, so a retry replays this run. ``run_id``: the caller's own id."""
        run_id = run_id or new_id("run")
        now = utc_now()
        month = month_of(now)
        with self._write(f"budget:{install.id}"):
            status = self.budget(install.id, month)
            if status.spent:
                raise BudgetExhausted(install.id, status.resets_at)
            self._usage(install.id, month, 0, timeout_ms)
            self.db.execute(
                """INSERT INTO runs (id, workspace_id, install_id, app_id, version_id, tool,
                   user_id, surface, workflow_run_id, started_at, reserved_ms, month,
                   approval_id, timeout_ms, node_id)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [
                    run_id,
                    install.workspace_id,
                    install.id,
                    install.app_id,
                    version_id or install.version_id,
                    tool,
                    user_id,
                    surface,
                    workflow_run_id,
                    now,
                    timeout_ms,
                    month,
                    approval_id,
                    timeout_ms,
                    self.node_id,
                ],
            )
            if approval_id is not None:
                self.db.execute(
                    "UPDATE approvals SET run_id = ? WHERE id = ?", [run_id, approval_id]
                )
            if idempotency is not None:
                self.db.execute(
                    "UPDATE idempotency SET run_id = ? WHERE user_id = ? AND key = ?",
                    [run_id, *idempotency],
                )
        return run_id

    def finish_run(
        self,
        run_id: str,
        *,
        status: RunEnd,
        duration_ms: int,
        error_kind: str | None = None,
        key_id: str | None = None,
        egress: list[dict[str, Any]] | None = None,
        egress_audit: dict[str, Any] | None = None,
    ) -> None:
        """End a run: its row, its ledger row, its audit entry and its budget settlement,
        in one transaction. Ending a run twice changes nothing the second time.
        ``egress``: what it reached through the proxy, per destination (figures, never
        payloads; scrubbed by the pipeline), kept in the run's row for its history.
        ``egress_audit``: what the audit entry keeps of it (counts per grant entry and per
        refusal reason, EgressPass.summary): never a destination the tool named.

        A run of this node that another node closed as interrupted (this node's lease ran
        out while it still ran it) is corrected to its real end instead (``_correct``)."""
        with self._transaction():  # the run's row is locked as _finish reads it
            self._finish(
                run_id, status, duration_ms, error_kind, key_id, egress, egress_audit,
                correct=True,
            )  # fmt: skip

    def _finish(
        self,
        run_id: str,
        status: RunEnd,
        duration_ms: int,
        error_kind: str | None,
        key_id: str | None,
        egress: list[dict[str, Any]] | None = None,
        egress_audit: dict[str, Any] | None = None,
        *,
        correct: bool = False,
    ) -> None:
        row = self.db.execute(
            """SELECT workspace_id, install_id, app_id, version_id, tool, user_id, surface,
                      workflow_run_id, reserved_ms, month, status, error_kind, duration_ms,
                      node_id FROM runs WHERE id = ?"""
            + self._for_update,
            [run_id],
        ).fetchone()
        if row is None:
            return
        if row[10] != "running":
            closed_by_another = row[10] == "failed" and row[11] == "interrupted"
            if correct and closed_by_another and row[13] is not None and row[13] == self.node_id:
                self._correct(run_id, row, status, duration_ms, error_kind, egress)
            return
        (
            workspace_id,
            install_id,
            app_id,
            version_id,
            tool,
            user_id,
            surface,
            workflow_run_id,
            reserved_ms,
            month,
            *_,
        ) = row
        now = utc_now()
        self.db.execute(
            """UPDATE runs SET status = ?, duration_ms = ?, ended_at = ?, error_kind = ?,
               reserved_ms = 0, egress = ? WHERE id = ?""",
            [status, duration_ms, now, error_kind, _json_or_null(egress), run_id],
        )
        payer_kind, payer_id = (
            ("workflow_run", workflow_run_id) if workflow_run_id else ("workspace", workspace_id)
        )
        self.db.insert(
            "ledger",
            {
                "id": new_id("led"),
                "kind": LEDGER_KIND_TOOL,
                "run_id": run_id,
                "sandbox_ms": duration_ms,
                "payer_kind": payer_kind,
                "payer_id": payer_id,
                "workspace_id": workspace_id,
                "app_id": app_id,
                "install_id": install_id,
                "version_id": version_id,
                "tool": tool,
                "user_id": user_id,
                "month": month,
                "created_at": now,
            },
        )
        self._usage(install_id, month, duration_ms, -reserved_ms)
        self._append_audit(
            "tool.run",
            workspace_id=workspace_id,
            actor_user_id=user_id,
            actor_key_id=key_id,
            install_id=install_id,
            version_id=version_id,
            tool=tool,
            surface=surface,
            status=status,
            duration_ms=duration_ms,
            reason=error_kind,
            detail={
                "runId": run_id,
                **({"workflowRunId": workflow_run_id} if workflow_run_id else {}),
                **({"egress": egress_audit} if egress_audit is not None else {}),
            },
        )

    def _correct(
        self,
        run_id: str,
        row: Any,
        status: RunEnd,
        duration_ms: int,
        error_kind: str | None,
        egress: list[dict[str, Any]] | None,
    ) -> None:
        """The real end of a run another node closed as interrupted while this node still
        ran it: its row, its ledger row and its install's month of use take the real
        status and duration, and a ``run.corrected`` entry names the before and after."""
        workspace_id, install_id, _, version_id, tool, _, surface = row[:7]
        month, before_kind, before_ms = row[9], row[11], row[12] or 0
        self.db.execute(
            "UPDATE runs SET status = ?, duration_ms = ?, error_kind = ?, egress = ?, ended_at = ? "
            "WHERE id = ?",  # its end on the clock of the node that ran it, as its start
            [status, duration_ms, error_kind, _json_or_null(egress), utc_now(), run_id],
        )
        self.db.execute(
            "UPDATE ledger SET sandbox_ms = ? WHERE run_id = ? AND kind = ?",
            [duration_ms, run_id, LEDGER_KIND_TOOL],
        )
        self._usage(install_id, month, duration_ms - before_ms, 0)
        self._append_audit(
            "run.corrected",
            workspace_id=workspace_id,
            install_id=install_id,
            version_id=version_id,
            tool=tool,
            surface=surface,
            status=status,
            duration_ms=duration_ms,
            reason=error_kind,
            detail={
                "runId": run_id,
                "before": {"status": "failed", "errorKind": before_kind, "durationMs": before_ms},
                "after": {"status": status, "errorKind": error_kind, "durationMs": duration_ms},
            },
        )

    def usage_by_day(self, install_id: str, days: int) -> list[dict[str, Any]]:
        """Runs per day (UTC) by status, and sandbox time, over the last ``days`` days;
        days without runs are absent."""
        since = (datetime.now(UTC) - timedelta(days=days - 1)).strftime("%Y-%m-%d")
        return list(
            self.db.query(
                """SELECT substr(started_at, 1, 10) AS day,
                          sum(CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END) AS succeeded,
                          sum(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS failed,
                          sum(CASE WHEN status = 'timed_out' THEN 1 ELSE 0 END) AS timed_out,
                          sum(CASE WHEN status = 'running' THEN 1 ELSE 0 END) AS running,
                          coalesce(sum(duration_ms), 0) AS sandbox_ms
                   FROM runs WHERE install_id = ? AND started_at >= ?
                   GROUP BY day ORDER BY day""",
                [install_id, since],
            )
        )

    def recover_interrupted(self) -> list[str]:
        """Close every run a stopped daemon left open (see interrupt_runs). Their ids."""
        rows = self.db.execute("SELECT id FROM runs WHERE status = 'running'").fetchall()
        return self.interrupt_runs([row[0] for row in rows])

    def interrupt_runs(self, run_ids: list[str]) -> list[str]:
        """End runs that cannot finish: ``failed``, error ``interrupted``, metered for the
        time known (from their start to now, at most their timeout), audited, their
        reservations released. Runs already ended are left as they are."""
        with self._transaction():
            return self._interrupt(run_ids)

    def _interrupt(self, run_ids: list[str]) -> list[str]:
        now = datetime.now(UTC)
        closed = []
        if run_ids and self._for_update:  # PostgreSQL: every row locked before any audit
            # chain's lock, in workspace order (as recover_lost_nodes'): closers cannot deadlock
            marks = ", ".join("?" * len(run_ids))
            run_ids = [
                row[0]
                for row in self.db.execute(
                    f"SELECT id FROM runs WHERE id IN ({marks}) ORDER BY workspace_id, id "
                    "FOR UPDATE",
                    run_ids,
                ).fetchall()
            ]
        for run_id in run_ids:
            row = self.db.execute(
                "SELECT started_at, timeout_ms FROM runs WHERE id = ? AND status = 'running'",
                [run_id],
            ).fetchone()
            if row is None:
                continue
            started = datetime.fromisoformat(row[0].replace("Z", "+00:00"))
            known = int((now - started).total_seconds() * 1000)
            timeout_ms = row[1]
            self._finish(
                run_id, "failed", min(max(known, 0), timeout_ms or known), "interrupted", None
            )
            closed.append(run_id)
        return closed

    def run_node(self, run_id: str) -> str | None:
        """The node that ran (or runs) ``run_id``: the one holding its result."""
        row = self.db.execute("SELECT node_id FROM runs WHERE id = ?", [run_id]).fetchone()
        return None if row is None else row[0]

    def get_run(self, run_id: str) -> RunRow | None:
        rows = list(self.db.query(_RUN_SQL + " WHERE r.id = ?", [run_id]))
        return _run_row(rows[0]) if rows else None

    def list_runs(
        self,
        install_id: str,
        *,
        tool: str | None = None,
        status: str | None = None,
        surface: str | None = None,
        since: str | None = None,
        before: str | None = None,
        limit: int = 50,
    ) -> list[RunRow]:
        """Runs of an install, newest first; ``before`` is the id of the last one seen;
        ``since``: started on or after this ISO date or time (UTC)."""
        where, args = ["r.install_id = ?"], [install_id]
        for column, value in (("r.tool", tool), ("r.status", status), ("r.surface", surface)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if since is not None:
            where.append("r.started_at >= ?")
            args.append(since)
        if before is not None:
            where.append("r.id < ?")
            args.append(before)
        rows = self.db.query(
            f"{_RUN_SQL} WHERE {' AND '.join(where)} ORDER BY r.id DESC LIMIT ?", [*args, limit]
        )
        return [_run_row(r) for r in rows]

    def latest_runs(self, install_id: str, per_tool: int) -> dict[str, list[RunRow]]:
        """The newest ``per_tool`` runs of each tool of an install."""
        rows = self.db.query(
            f"""SELECT * FROM (
                    SELECT x.*, ROW_NUMBER() OVER (PARTITION BY x.tool ORDER BY x.id DESC)
                        AS nth
                    FROM ({_RUN_SQL} WHERE r.install_id = ?) AS x) AS ranked
                WHERE nth <= ? ORDER BY tool, id DESC""",
            [install_id, per_tool],
        )
        found: dict[str, list[RunRow]] = {}
        for r in rows:
            r.pop("nth")
            found.setdefault(r["tool"], []).append(_run_row(r))
        return found

    # --- the ledger ---------------------------------------------------------------------------

    def ledger(
        self,
        *,
        month: str | None = None,
        workspace_id: str | None = None,
        install_id: str | None = None,
        app_id: str | None = None,
        payer_id: str | None = None,
    ) -> list[dict[str, Any]]:
        where, args = ["1 = 1"], []
        for column, value in (
            ("month", month),
            ("workspace_id", workspace_id),
            ("install_id", install_id),
            ("app_id", app_id),
            ("payer_id", payer_id),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        return list(
            self.db.query(
                f"SELECT * FROM ledger WHERE {' AND '.join(where)} ORDER BY created_at, id", args
            )
        )
