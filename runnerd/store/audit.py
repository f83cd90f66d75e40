"""The audit trail: append-only, each entry chained to the one before by a keyed hash.

An entry's hash is an HMAC-SHA256, under a key kept out of the database (``audit.key``
in the data dir, or the ``audit_key`` setting), of its own fields and the previous
entry's hash: editing or deleting a row breaks the chain at that row, and re-chaining
after an edit needs the key, which someone who can write the database does not have.
Deleting the newest entries leaves no later row to break; two records outside the
trail catch it: the database's high-water mark of the sequence, and a checkpoint of the
newest entry (``audit.head`` in the data dir, written as the daemon goes and when the
store closes; ``runnerd audit verify`` prints it for an operator to keep elsewhere, and
``--checkpoint SEQ:HASH`` compares a kept one). ``verify_audit`` finds the first break.
Entries never hold inputs, outputs or secret values: only names, ids, statuses, reasons.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
from typing import TYPE_CHECKING, Any

import msgspec

from runnerd.ids import new_id, utc_now
from runnerd.store.core import StoreBase

if TYPE_CHECKING:
    pass

__all__ = [
    "AuditEntry",
    "AuditStore",
    "AuditVerdict",
]

log = logging.getLogger("runnerd")

GENESIS = "0" * 64
HEAD_FILE = "audit.head"  # the newest entry's seq and hash, beside the database's data dir
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


class AuditVerdict(msgspec.Struct, frozen=True):
    """What ``verify_audit`` found: entries read, the seq of the first break (None: the
    chain holds), why it breaks, and the newest entry (a checkpoint to keep elsewhere)."""

    entries: int
    first_break: int | None = None
    problem: str | None = None
    head_seq: int | None = None
    head_hash: str | None = None


def _digest(key: bytes | None, prev_hash: str, row: dict[str, Any]) -> str:
    """An entry's hash: HMAC-SHA256 under the chain key; without a key, the plain SHA-256
    of trails written before the chain was keyed (only read, to re-chain them)."""
    body = json.dumps([row.get(f) for f in _FIELDS], separators=(",", ":"), sort_keys=True)
    message = f"{prev_hash}\n{body}".encode()
    if key is None:
        return hashlib.sha256(message).hexdigest()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


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
        row["hash"] = _digest(self.audit_key, prev, row)
        self.db.insert("audit", row)
        self.db.record_high_water("audit", seq)
        return str(row["id"])

    def audit(self, action: str, **fields: Any) -> str:
        """Append one entry in a transaction of its own."""
        with self._write():
            return self._append_audit(action, **fields)

    def _append_audit_for_person(
        self, user_id: str | None, action: str, *, workspace_id: str | None = None, **fields: Any
    ) -> None:
        """Append ``action`` in ``workspace_id``, or with none named, once in each workspace
        of the person ``user_id`` (what acts in all of them: a personal key made or revoked
        on the host, a sign-in, a sign-out), or once with no workspace if they have none;
        inside the caller's write transaction."""
        workspaces: list[str | None] = [workspace_id] if workspace_id is not None else []
        if workspace_id is None and user_id is not None:
            workspaces = [
                str(r[0])
                for r in self.db.execute(
                    "SELECT workspace_id FROM memberships WHERE user_id = ? ORDER BY 1",
                    [user_id],
                ).fetchall()
            ]
        for found in workspaces or [None]:
            self._append_audit(action, workspace_id=found, **fields)

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
        verdict = self.audit_verdict()
        return verdict.entries, verdict.first_break

    def audit_verdict(self, checkpoint: tuple[int, str] | None = None) -> AuditVerdict:
        """The whole chain checked under the chain key, then against what is kept outside
        the trail: the high-water mark of its sequence, this data dir's ``audit.head``,
        and ``checkpoint`` (a seq and hash an operator kept) when given."""
        prev, expected_seq, count = GENESIS, 1, 0
        hashes: dict[int, str] = {}
        head_file = self._read_head()
        wanted = {kept[0] for kept in (checkpoint, head_file) if kept is not None}

        def broken(seq: int, problem: str) -> AuditVerdict:
            return AuditVerdict(count, seq, problem, None, None)

        for row in self.db.query("SELECT * FROM audit ORDER BY seq"):
            count += 1
            if row["seq"] != expected_seq:  # the chain breaks at the row after the gap
                gap = f"{expected_seq}..{row['seq'] - 1}" if row["seq"] > expected_seq + 1 else ""
                return broken(
                    int(row["seq"]), f"entries {gap} are missing" if gap else
                    f"entry {expected_seq} is missing"
                )  # fmt: skip
            if row["prev_hash"] != prev or _digest(self.audit_key, prev, row) != row["hash"]:
                return broken(
                    int(row["seq"]),
                    f"entry {row['seq']} was changed, or the one before it (or this node's "
                    "audit key is not the one that wrote it)",
                )
            if row["seq"] in wanted:
                hashes[row["seq"]] = row["hash"]
            prev, expected_seq = row["hash"], row["seq"] + 1
        head = (expected_seq - 1, prev) if count else (None, None)
        # Deleting the newest entries leaves no later row to break: the database's record
        # of the highest seq ever given out, and the checkpoints kept elsewhere, remember.
        top = self.db.high_water("audit")
        if top is not None and top >= expected_seq:
            return broken(expected_seq, f"entries {expected_seq}..{top} were deleted")
        for kept, what in ((head_file, HEAD_FILE), (checkpoint, "the checkpoint")):
            seq, digest = kept if kept is not None else (None, None)
            if seq is None or digest is None:
                continue
            if seq >= expected_seq:
                return broken(
                    expected_seq,
                    f"{what} names entry {seq}, but the trail ends at "
                    f"{expected_seq - 1}: newer entries were deleted",
                )
            if not hmac.compare_digest(hashes.get(seq, ""), digest):
                return broken(seq, f"entry {seq} is not the one {what} names: re-chained")
        return AuditVerdict(count, None, None, head[0], head[1])

    def _read_head(self) -> tuple[int, str] | None:
        if self.audit_head_path is None:
            return None
        try:
            found = json.loads(self.audit_head_path.read_text())
            return int(found["seq"]), str(found["hash"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, OSError):
            return (0, "unreadable")  # never matches: verify says the checkpoint differs

    def checkpoint_audit(self) -> bool:
        """Write the newest entry's seq and hash to ``audit.head`` when the entry the file
        named before is still in the trail, unchanged; False (and an error in the log)
        when it is not, and the old checkpoint is kept for ``audit verify`` to report."""
        if self.audit_head_path is None:
            return True
        last = self.db.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        if last is None:
            return True
        kept = self._read_head()
        if kept is not None:
            if kept == (last[0], last[1]):
                return True
            row = self.db.execute("SELECT hash FROM audit WHERE seq = ?", [kept[0]]).fetchone()
            if row is None or not hmac.compare_digest(str(row[0]), kept[1]):
                log.error(
                    "the audit trail no longer holds entry %s as %s recorded it: entries were "
                    "deleted or changed; run `runnerd audit verify`",
                    kept[0],
                    self.audit_head_path,
                )
                return False
        text = json.dumps({"seq": int(last[0]), "hash": str(last[1]), "at": utc_now()})
        staging = self.audit_head_path.with_name(f".{HEAD_FILE}.{os.getpid()}")
        with contextlib.suppress(OSError):
            fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text + "\n")
            os.replace(staging, self.audit_head_path)
        return True

    def audit_key_matches(self) -> bool:
        """Whether the newest entry verifies under this store's chain key (an empty trail
        does): False when another key wrote it (a node given another audit key)."""
        rows = self.db.query("SELECT * FROM audit ORDER BY seq DESC LIMIT 1")
        return all(_digest(self.audit_key, r["prev_hash"], r) == r["hash"] for r in rows)

    def upgrade_audit_chain(self) -> int:
        """Key a trail written before the chain was keyed (plain SHA-256), once: each
        entry's hash becomes its HMAC, and an ``audit.rechain`` entry says how many were
        re-chained and where the plain chain broke, if it did. Only for a trail whose
        newest entry has a plain hash, in a data dir that has no checkpoint yet: a keyed
        chain (under this key or another) is never re-chained, ``audit verify`` reports
        its breaks. Returns the count."""
        if self.audit_head_path is not None and self.audit_head_path.exists():
            return 0
        newest = list(self.db.query("SELECT * FROM audit ORDER BY seq DESC LIMIT 1"))
        if not newest or self.audit_key_matches():
            return 0
        if _digest(None, newest[0]["prev_hash"], newest[0]) != newest[0]["hash"]:
            return 0  # keyed under another key (a node given the wrong one): never re-key
        with self._write():
            prev_old, prev_new, expected, plain_break = GENESIS, GENESIS, 1, None
            rows = self.db.query("SELECT * FROM audit ORDER BY seq")
            updates = []
            for row in rows:
                if plain_break is None and (
                    row["seq"] != expected
                    or row["prev_hash"] != prev_old
                    or _digest(None, prev_old, row) != row["hash"]
                ):
                    plain_break = int(row["seq"])
                new_hash = _digest(self.audit_key, prev_new, row)
                updates.append((prev_new, new_hash, row["seq"]))
                prev_old, prev_new, expected = row["hash"], new_hash, row["seq"] + 1
            for prev_hash, new_hash, seq in updates:
                self.db.execute(
                    "UPDATE audit SET prev_hash = ?, hash = ? WHERE seq = ?",
                    [prev_hash, new_hash, seq],
                )
            self._append_audit(
                "audit.rechain", detail={"entries": len(updates), "plainFirstBreak": plain_break}
            )
        return len(updates)
