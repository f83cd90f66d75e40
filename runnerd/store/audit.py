"""The audit trail: append-only, each entry chained to the one before by its hash.

An entry's hash covers its own fields and the previous entry's hash, so editing or
deleting a row breaks the chain at that row; ``verify_audit`` finds the first break.
Entries never hold inputs, outputs or secret values: only names, ids, statuses, reasons.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

from runnerd.store.core import StoreBase
from runnerd.store.records import new_id, utc_now

GENESIS = "0" * 64
_FIELDS = (
    "seq",
    "id",
    "at",
    "workspace_id",
    "actor_user_id",
    "actor_key_id",
    "action",
    "install_id",
    "version_id",
    "tool",
    "surface",
    "status",
    "duration_ms",
    "reason",
    "detail",
)


class AuditEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    seq: int
    id: str
    at: str
    action: str
    workspace_id: str | None = None
    actor_user_id: str | None = None
    actor_key_id: str | None = None
    install_id: str | None = None
    version_id: str | None = None
    tool: str | None = None
    surface: str | None = None
    status: str | None = None
    duration_ms: int | None = None
    reason: str | None = None
    detail: dict[str, Any] = msgspec.field(default_factory=dict)


def _digest(prev_hash: str, row: dict[str, Any]) -> str:
    body = json.dumps([row.get(f) for f in _FIELDS], separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(f"{prev_hash}\n{body}".encode()).hexdigest()


class AuditStore(StoreBase):
    def _append_audit(self, action: str, **fields: Any) -> str:
        """Append one entry inside the caller's write transaction; returns its id."""
        last = self.db.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        seq, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
        detail = fields.pop("detail", None) or {}
        row: dict[str, Any] = {f: None for f in _FIELDS}
        row.update(fields)
        row.update(
            seq=seq,
            id=new_id("aud"),
            at=utc_now(),
            action=action,
            detail=json.dumps(detail, separators=(",", ":"), sort_keys=True),
        )
        row["prev_hash"] = prev
        row["hash"] = _digest(prev, row)
        self.db.insert("audit", row)
        self.db.record_high_water("audit", seq)
        return str(row["id"])

    def audit(self, action: str, **fields: Any) -> str:
        """Append one entry in a transaction of its own."""
        with self._write():
            return self._append_audit(action, **fields)

    def audit_entries(
        self,
        *,
        workspace_id: str | None = None,
        action: str | None = None,
        install_id: str | None = None,
        after_seq: int = 0,
        limit: int = 100,
    ) -> list[AuditEntry]:
        where: list[str] = ["seq > ?"]
        args: list[Any] = [after_seq]
        for column, value in (("workspace_id", workspace_id), ("install_id", install_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if action is not None:
            where.append("(action = ? OR action LIKE ?)")
            args += [action, action + ".%"]
        rows = self.db.query(
            f"SELECT * FROM audit WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?",
            [*args, limit],
        )
        return [
            AuditEntry(
                **{
                    **{k: v for k, v in r.items() if k not in ("prev_hash", "hash")},
                    "detail": json.loads(r["detail"]),
                }
            )
            for r in rows
        ]

    def verify_audit(self) -> tuple[int, int | None]:
        """(entries checked, seq of the first entry whose chain breaks, or None)."""
        prev, expected_seq, count = GENESIS, 1, 0
        for row in self.db.query("SELECT * FROM audit ORDER BY seq"):
            count += 1
            if row["seq"] != expected_seq or row["prev_hash"] != prev:
                return count, int(row["seq"])
            if _digest(prev, row) != row["hash"]:
                return count, int(row["seq"])
            prev, expected_seq = row["hash"], row["seq"] + 1
        # Deleting the newest entries leaves no later row to break: the database's record
        # of the highest seq ever given out still remembers them.
        top = self.db.high_water("audit")
        if top is not None and top >= expected_seq:
            return count, expected_seq
        return count, None
