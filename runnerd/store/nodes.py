"""This node's place in a database that several nodes may share (docs/SCALING.md): it
joins with a lease, renews it, leaves at a graceful stop; the runs of a node whose lease
ran out are closed (as interrupted) by a node that has itself been in touch with the
database for a whole lease.

Leases are written and compared in the database's clock (PostgreSQL's
``clock_timestamp()``), never a node's: a node whose clock is off by a minute neither
looks lost nor finds the others lost. A node's own clock is kept beside it
(``renewed_at``) only to meter its own runs: an interrupted run is billed from its start
to its node's last renewal, both read on the same clock.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from runnerd.ids import new_id, stamp, utc_now
from runnerd.limits import NODE_CONTACT_GAP, NODE_ROW_RETENTION_S
from runnerd.store.runs import RunsStore

INTERRUPTED = "interrupted"  # the error kind of a run closed because its node stopped
# The keyed lock of the nodes table: joining, renewing, leaving, closing lost nodes.
NODES_LOCK = "nodes"


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class NodesStore(RunsStore):
    # In this process's monotonic clock: when its latest unbroken stretch of contact with
    # the database began, and its latest renewal ended (None: no contact yet).
    _healthy_since: float | None = None
    _last_contact: float | None = None
    _lease_s: float = 0.0

    def join(
        self, host: str, pid: int, version: str, lease_s: float, url: str | None = None
    ) -> str:
        """Serve this database as a new node: its id (runs it starts carry it) and
        ``url``, where other nodes ask it for the results it holds. On a
        SQLite file there is one node at a time (the data dir's lock), so every node
        before this one is over. Rows of nodes stopped longer than NODE_ROW_RETENTION_S
        ago, with no run left open, are removed."""
        node_id = new_id("node")
        with self._write(NODES_LOCK):
            now = self.db_now()
            if self.db.dialect == "sqlite":
                self.db.execute(
                    "UPDATE nodes SET stopped_at = ? WHERE stopped_at IS NULL", [stamp(now)]
                )
            self.db.execute(
                "DELETE FROM nodes WHERE stopped_at IS NOT NULL AND stopped_at < ? AND NOT "
                "EXISTS (SELECT 1 FROM runs WHERE runs.node_id = nodes.id AND status = 'running')",
                [stamp(now - timedelta(seconds=NODE_ROW_RETENTION_S))],
            )
            self.db.execute(
                "INSERT INTO nodes (id, host, pid, version, started_at, lease_until, stopped_at,"
                " renewed_at, url) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?)",
                [node_id, host, pid, version, stamp(now),
                 stamp(now + timedelta(seconds=lease_s)), utc_now(), url],
            )  # fmt: skip
        self.node_id = node_id
        self._lease_s = lease_s
        self._healthy_since = self._last_contact = time.monotonic()
        return node_id

    def renew_lease(self, lease_s: float) -> bool:
        """Extend this node's lease (to the database's now + ``lease_s``). False when it
        had run out and another node closed this node's runs: the node then serves on
        under the same id (``rejoin``), and corrects the runs it still ends."""
        began = time.monotonic()
        with self._write(NODES_LOCK):
            now = self.db_now()
            cur = self.db.execute(
                "UPDATE nodes SET lease_until = ?, renewed_at = ? "
                "WHERE id = ? AND stopped_at IS NULL",
                [stamp(now + timedelta(seconds=lease_s)), utc_now(), self.node_id],
            )
            kept = bool(cur.rowcount)
        self._contact(began, lease_s)
        return kept

    def _contact(self, began: float, lease_s: float) -> None:
        """A renewal that ended now, begun at ``began``: the stretch of unbroken contact
        goes on when the previous renewal ended less than NODE_CONTACT_GAP of a lease
        ago; else (an outage, a freeze, a renewal that hung) a new stretch begins."""
        done = time.monotonic()
        self._lease_s = lease_s
        broken = (
            self._last_contact is None
            or done - self._last_contact > lease_s * NODE_CONTACT_GAP
            or done - began > lease_s * NODE_CONTACT_GAP
        )
        if broken or self._healthy_since is None:
            self._healthy_since = done
        self._last_contact = done

    def rejoin(self, lease_s: float) -> None:
        """Serve on under this node's id after its lease ran out and another node closed
        its runs: its row is live again, and the stretch of contact starts anew."""
        with self._write(NODES_LOCK):
            now = self.db_now()
            self.db.execute(
                "UPDATE nodes SET stopped_at = NULL, lease_until = ?, renewed_at = ? WHERE id = ?",
                [stamp(now + timedelta(seconds=lease_s)), utc_now(), self.node_id],
            )
        self._healthy_since = self._last_contact = time.monotonic()

    def in_touch_for(self) -> float:
        """Seconds of unbroken contact with the database this node has now (0: none)."""
        if self._healthy_since is None or self._last_contact is None:
            return 0.0
        if time.monotonic() - self._last_contact > self._lease_s * NODE_CONTACT_GAP:
            return 0.0
        return time.monotonic() - self._healthy_since

    def leave(self) -> None:
        """This node stops; its runs are closed already (a graceful stop)."""
        with self._write(NODES_LOCK):
            self.db.execute(
                "UPDATE nodes SET stopped_at = ? WHERE id = ?",
                [stamp(self.db_now()), self.node_id],
            )

    def recover_lost_nodes(self, *, lease_s: float | None = None) -> list[str]:
        """Close the runs of nodes whose lease ran out (killed, or cut off), once: the
        nodes are marked stopped in the same transaction. Only once this node has been
        in touch with the database for a whole lease (``lease_s``, else its own): after
        an outage every node's lease ran out, and the others get a lease to renew
        theirs. Each run is metered from its start to its node's last renewal (both on
        that node's clock), at most its timeout. The closed runs' ids."""
        needed = self._lease_s if lease_s is None else lease_s
        if self.in_touch_for() < needed:
            return []
        with self._write(NODES_LOCK):
            now = stamp(self.db_now())
            lost = [
                row[0]
                for row in self.db.execute(
                    "SELECT id FROM nodes WHERE stopped_at IS NULL AND lease_until < ?", [now]
                ).fetchall()
            ]
            rows = self.db.execute(
                """SELECT r.id, r.started_at, r.timeout_ms, n.renewed_at FROM runs r
                   LEFT JOIN nodes n ON n.id = r.node_id
                   WHERE r.status = 'running' AND (r.node_id IS NULL OR n.id IS NULL
                         OR n.stopped_at IS NOT NULL OR n.lease_until < ?)
                   ORDER BY r.workspace_id, r.id"""
                + (" FOR UPDATE OF r" if self._for_update else ""),
                [now],
            ).fetchall()  # every row locked before any audit chain's lock, both in
            # workspace order (as _interrupt's): two closers cannot deadlock
            for node in lost:
                self.db.execute("UPDATE nodes SET stopped_at = ? WHERE id = ?", [now, node])
            closed = []
            for run_id, started_at, timeout_ms, renewed_at in rows:
                until = _parse(renewed_at) if renewed_at else datetime.now(UTC)
                known = int((until - _parse(started_at)).total_seconds() * 1000)
                known = max(known, 0)
                self._finish(run_id, "failed", min(known, timeout_ms or known), INTERRUPTED, None)
                closed.append(run_id)
            return closed

    def node_url(self, node_id: str) -> tuple[str | None, bool] | None:
        """Where node ``node_id`` answers other nodes (None: it published no address),
        and whether it still serves (not stopped); None for a node not in the table."""
        row = self.db.execute(
            "SELECT url, stopped_at FROM nodes WHERE id = ?", [node_id]
        ).fetchone()
        return None if row is None else (row[0], row[1] is None)

    def live_nodes(self) -> list[dict[str, Any]]:
        """The nodes serving now (not stopped, lease not run out), oldest first."""
        now = stamp(self.db_now())
        return list(
            self.db.query(
                "SELECT * FROM nodes WHERE stopped_at IS NULL AND lease_until >= ? ORDER BY id",
                [now],
            )
        )
