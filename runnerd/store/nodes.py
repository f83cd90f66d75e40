"""This node's place in a database that several nodes may share (docs/SCALING.md): it
joins with a lease, renews it, leaves at a graceful stop; the runs of a node whose lease
ran out are closed (as interrupted) by whichever node sees it first.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from runnerd.ids import new_id, stamp, utc_now
from runnerd.store.runs import RunsStore


class NodesStore(RunsStore):
    def join(self, host: str, pid: int, version: str, lease_s: float) -> str:
        """Serve this database as a new node: its id (runs it starts carry it). On a
        SQLite file there is one node at a time (the data dir's lock), so every node
        before this one is over."""
        node_id = new_id("node")
        now = datetime.now(UTC)
        with self._write():
            if self.db.dialect == "sqlite":
                self.db.execute(
                    "UPDATE nodes SET stopped_at = ? WHERE stopped_at IS NULL", [stamp(now)]
                )
            self.db.execute(
                "INSERT INTO nodes VALUES (?, ?, ?, ?, ?, ?, NULL)",
                [node_id, host, pid, version, stamp(now),
                 stamp(now + timedelta(seconds=lease_s))],
            )  # fmt: skip
        self.node_id = node_id
        return node_id

    def renew_lease(self, lease_s: float) -> bool:
        """Extend this node's lease. False when it had run out and another node has
        closed this node's runs (its later results change nothing)."""
        until = stamp(datetime.now(UTC) + timedelta(seconds=lease_s))
        with self._write():
            cur = self.db.execute(
                "UPDATE nodes SET lease_until = ? WHERE id = ? AND stopped_at IS NULL",
                [until, self.node_id],
            )
            return bool(cur.rowcount)

    def leave(self) -> None:
        """This node stops; its runs are closed already (a graceful stop)."""
        with self._write():
            self.db.execute(
                "UPDATE nodes SET stopped_at = ? WHERE id = ?", [utc_now(), self.node_id]
            )

    def recover_lost_nodes(self) -> list[str]:
        """Close the runs of nodes whose lease ran out (killed, or cut off), once: the
        nodes are marked stopped in the same transaction. The closed runs' ids."""
        now = utc_now()
        with self._write():
            lost = [
                row[0]
                for row in self.db.execute(
                    "SELECT id FROM nodes WHERE stopped_at IS NULL AND lease_until < ?", [now]
                ).fetchall()
            ]
            rows = self.db.execute(
                """SELECT id FROM runs WHERE status = 'running' AND (node_id IS NULL
                   OR node_id IN (SELECT id FROM nodes WHERE stopped_at IS NOT NULL
                                  OR lease_until < ?))""",
                [now],
            ).fetchall()
            for node in lost:
                self.db.execute("UPDATE nodes SET stopped_at = ? WHERE id = ?", [now, node])
            return self._interrupt([row[0] for row in rows])

    def live_nodes(self) -> list[dict[str, Any]]:
        """The nodes serving now (not stopped, lease not run out), oldest first."""
        now = utc_now()
        return list(
            self.db.query(
                "SELECT * FROM nodes WHERE stopped_at IS NULL AND lease_until >= ? ORDER BY id",
                [now],
            )
        )
