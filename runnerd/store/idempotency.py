"""Idempotency keys of run requests: a retry with the same key replays the first run.

A key holds no input: it is bound to the SHA-256 of the request (install, version, tool
and input), never to the input itself. The key that claimed a run is given the run's id
in the run's own transaction (``RunsStore.start_run``); one whose call was held for
approval, the approval's id in the approval's (``ApprovalsStore.create_approval``).
"""

from __future__ import annotations

from datetime import timedelta

from runnerd.ids import stamp
from runnerd.store.core import StoreBase


class IdempotencyStore(StoreBase):
    def claim_idempotency_key(
        self, user_id: str, key: str, request_hash: str, max_age_s: int
    ) -> tuple[str, str | None, str | None] | None:
        """Claim ``key`` for this request. None: claimed, go on. Else (hash it was first
        used with, run id, approval id: both None while the first call starts). Keys
        older than ``max_age_s`` are forgotten."""
        with self._transaction():  # single statements: no lock shared with anyone
            now = self.db_now()  # the database's clock: every node forgets a key alike
            cutoff = stamp(now - timedelta(seconds=max_age_s))
            self.db.execute("DELETE FROM idempotency WHERE created_at < ?", [cutoff])
            claimed = self.db.execute(
                """INSERT INTO idempotency (user_id, key, request_hash, created_at)
                   VALUES (?, ?, ?, ?) ON CONFLICT (user_id, key) DO NOTHING""",
                [user_id, key, request_hash, stamp(now)],
            ).rowcount
            if claimed:
                return None
            row = self.db.execute(
                """SELECT request_hash, run_id, approval_id FROM idempotency
                   WHERE user_id = ? AND key = ?""",
                [user_id, key],
            ).fetchone()
            if row is not None:
                return row[0], row[1], row[2]
        return None

    def release_idempotency_key(
        self, user_id: str, key: str, approval_id: str | None = None
    ) -> None:
        """Release a key whose call was refused before its run started, so a retry runs.
        A key that released a run (``start_run(idempotency=…)``) stays: retries replay it.
        So does one held for approval, unless ``approval_id`` (that approval was denied
        or expired: a retry asks again)."""
        with self._transaction():
            if approval_id is not None:
                self.db.execute(
                    """DELETE FROM idempotency WHERE user_id = ? AND key = ? AND run_id IS NULL
                       AND approval_id = ?""",
                    [user_id, key, approval_id],
                )
                return
            self.db.execute(
                """DELETE FROM idempotency WHERE user_id = ? AND key = ? AND run_id IS NULL
                   AND approval_id IS NULL""",
                [user_id, key],
            )
