"""The audit trail: append-only, one hash chain per workspace, each entry chained to the
one before it in its chain by a keyed hash.

An entry's hash is an HMAC-SHA256, under a key kept out of the database (``audit.key``
in the data dir, or the ``audit_key`` setting), of its own fields and the previous
entry's hash: editing or deleting a row breaks the chain at that row, and re-chaining
after an edit needs the key, which someone who can write the database does not have.

Chains: one per workspace (``chain`` is its id) and one for the host's own actions, the
entries of no workspace (``host``); each numbers its entries 1, 2, 3 … (``chain_seq``,
gap-free: the gap check) and starts from GENESIS. An entry is appended under its chain's
keyed lock only (``audit:<chain>``), so writers of two workspaces never wait for each
other. The global ``seq`` stays unique and is the API's paging cursor: on PostgreSQL it
is drawn from the table's sequence under the chain lock, so within a chain it grows in
commit order (gaps in it are rollbacks, never a break); on SQLite it is max+1 under the
file's one writer, gap-free. Entries written before chains (``chain`` NULL, the legacy
trail) keep their one whole-database chain over ``seq``, checked as before.

Deleting the newest entries of a chain leaves no later row to break; records outside the
chain catch it: the database's high-water mark of each chain (PostgreSQL:
``runnerd_high_water`` ``audit:<chain>``, the chain's newest seq; SQLite: its one gap-free
sequence and ``sqlite_sequence``), and a checkpoint of the newest entry (``audit.head``
in the data dir, written as the daemon goes and when the store closes; ``runnerd audit
verify`` prints it for an operator to keep elsewhere, and ``--checkpoint SEQ:HASH``
compares a kept one). ``audit_verdict`` checks every chain and names the first break.
Entries never hold inputs, outputs or secret values: only names, ids, statuses, reasons.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
from typing import Any

import msgspec

from runnerd.ids import new_id, utc_now
from runnerd.store.core import StoreBase

__all__ = [
    "HOST_CHAIN",
    "AuditEntry",
    "AuditStore",
    "AuditVerdict",
]

log = logging.getLogger("runnerd")

GENESIS = "0" * 64
HEAD_FILE = "audit.head"  # the newest entry's seq and hash, beside the database's data dir
HOST_CHAIN = "host"  # the chain of entries with no workspace (a workspace id is ws_…)
LEGACY_MARK = "audit"  # the high-water mark of the trail written before chains
LEGACY_KEY = "legacy"  # that trail's name among audit.head's chains
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
# The chain's newest entry and the new entry's seq, in one round trip (under its lock).
_HEAD = (
    "SELECT {next}, h.chain_seq, h.hash FROM (SELECT 1) AS one LEFT JOIN "
    "(SELECT chain_seq, hash FROM audit WHERE chain = ? ORDER BY chain_seq DESC LIMIT 1) "
    "AS h ON 1 = 1"
)
_NEXT_SEQ = {
    "sqlite": "(SELECT COALESCE(MAX(seq), 0) + 1 FROM audit)",
    "postgresql": "nextval(pg_get_serial_sequence('audit', 'seq'))",
}


def chain_of(workspace_id: str | None) -> str:
    """The chain an entry of ``workspace_id`` is in."""
    return HOST_CHAIN if workspace_id is None else str(workspace_id)


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
    chains hold), why it breaks, and the newest entry (a checkpoint to keep elsewhere)."""

    entries: int
    first_break: int | None = None
    problem: str | None = None
    head_seq: int | None = None
    head_hash: str | None = None


def _digest(key: bytes | None, prev_hash: str, row: dict[str, Any]) -> str:
    """An entry's hash: HMAC-SHA256 under the chain key; without a key, the plain SHA-256
    of trails written before the chain was keyed (only read, to re-chain them). The same
    fields for every entry (its chain follows from its workspace; its place in the chain
    from the link to the one before)."""
    body = json.dumps([row.get(f) for f in _FIELDS], separators=(",", ":"), sort_keys=True)
    message = f"{prev_hash}\n{body}".encode()
    if key is None:
        return hashlib.sha256(message).hexdigest()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class _Links:
    """Where each chain stands as the trail is read in seq order: the legacy trail
    (``chain`` NULL) over the global seq, every other chain over its ``chain_seq``."""

    def __init__(self) -> None:
        self.heads: dict[str | None, tuple[int, str]] = {}

    def expect(self, row: dict[str, Any]) -> tuple[int, int, str]:
        """(the row's place in its chain, the place expected, the hash it must link to)."""
        chain = row["chain"]
        place = int(row["seq"] if chain is None else row["chain_seq"] or 0)
        done, prev = self.heads.get(chain, (0, GENESIS))
        return place, done + 1, prev

    def advance(self, row: dict[str, Any], digest: str) -> None:
        chain = row["chain"]
        self.heads[chain] = (int(row["seq"] if chain is None else row["chain_seq"]), digest)


def _name(chain: str | None) -> str:
    if chain is None:
        return "the trail written before chains"
    return "the host's chain" if chain == HOST_CHAIN else f"workspace {chain}'s chain"


class AuditStore(StoreBase):
    def _append_audit(self, action: str, **fields: Any) -> str:
        """Append one entry inside the caller's write transaction; returns its id. Takes
        its chain's lock (held until the transaction ends) and reads that chain only."""
        chain = chain_of(fields.get("workspace_id"))
        self.db.lock(f"audit:{chain}")
        head = self.db.execute(_HEAD.format(next=_NEXT_SEQ[self.db.dialect]), [chain]).fetchone()
        seq = int(head[0])
        chain_seq, prev = (1, GENESIS) if head[1] is None else (int(head[1]) + 1, str(head[2]))
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
        row["chain"] = chain
        row["chain_seq"] = chain_seq
        self.db.insert("audit", row)
        self.db.record_high_water(f"audit:{chain}", seq)
        return str(row["id"])

    def audit(self, action: str, **fields: Any) -> str:
        """Append one entry in a transaction of its own (its chain's lock only)."""
        with self._transaction():
            return self._append_audit(action, **fields)

    def _append_audit_for_person(
        self, user_id: str | None, action: str, *, workspace_id: str | None = None, **fields: Any
    ) -> None:
        """Append ``action`` in ``workspace_id``, or with none named, once in each workspace
        of the person ``user_id`` (what acts in all of them: a personal key made or revoked
        on the host, a sign-in, a sign-out), or once with no workspace if they have none;
        inside the caller's write transaction (chain locks in workspace order)."""
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
        hidden = ("prev_hash", "hash", "chain", "chain_seq")
        return [
            AuditEntry(
                **{
                    **{k: v for k, v in r.items() if k not in hidden},
                    "detail": json.loads(r["detail"]),
                }
            )
            for r in rows
        ]

    def verify_audit(self) -> tuple[int, int | None]:
        """(entries checked, seq of the first entry whose chain breaks, or None)."""
        verdict = self.audit_verdict()
        return verdict.entries, verdict.first_break

    def audit_verdict(
        self, checkpoint: tuple[int, str] | None = None, *, workspace_id: str | None = None
    ) -> AuditVerdict:
        """Every chain checked under the chain key, then against what is kept outside
        them: each chain's high-water mark, this data dir's ``audit.head``, and
        ``checkpoint`` (a seq and hash an operator kept) when given. The first break is
        the smallest seq at which any chain breaks.

        With ``workspace_id``: that workspace's chain only, and the legacy trail (one
        chain for every workspace; what it holds of theirs is theirs); on SQLite also
        a gap in the file's one gap-free seq, which cannot say whose entry went. The
        count and the head are then the workspace's; ``audit.head`` and ``checkpoint``
        (the whole trail's) are not compared."""
        links = _Links()
        breaks: dict[str | None, tuple[int, str]] = {}  # a chain's first break (None: legacy)
        global_break: tuple[int, str] | None = None
        gap_free = self.db.dialect == "sqlite"  # one writer, max+1: every seq is there
        count, last_seq, last_hash = 0, 0, GENESIS
        chain_top: dict[str, int] = {}  # each chain's newest seq
        mine: tuple[int, str] | None = None  # the workspace's newest entry
        head_file = self._read_head() if workspace_id is None else None
        kept_heads = self._read_chain_heads() if workspace_id is None else {}
        if workspace_id is not None:
            checkpoint = None
        wanted = {kept[0] for kept in (checkpoint, head_file) if kept is not None}
        wanted |= {seq for seq, _ in kept_heads.values()}
        hashes: dict[int, str] = {}
        chains_began = False
        # What is kept outside the rows is read before them: an entry committed meanwhile
        # is then among the rows, never a mark (or a checkpoint) ahead of them.
        marks = self._marks()
        given = self.db.high_water("audit") if gap_free else None  # sqlite_sequence

        for row in self.db.query("SELECT * FROM audit ORDER BY seq"):
            seq, chain = int(row["seq"]), row["chain"]
            ours = workspace_id is None or row["workspace_id"] == workspace_id
            count += ours
            if gap_free and global_break is None and seq != last_seq + 1:
                global_break = (
                    seq,
                    f"entries {last_seq + 1}..{seq - 1} are missing"
                    if seq > last_seq + 2
                    else f"entry {last_seq + 1} is missing",
                )
            last_seq, last_hash = seq, str(row["hash"])
            if seq in wanted:
                hashes[seq] = str(row["hash"])
            if chain is not None:
                chains_began = True
                chain_top[chain] = seq
                if workspace_id is not None and chain == workspace_id:
                    mine = (seq, str(row["hash"]))
            if chain in breaks:
                continue  # a chain is checked up to its first break
            place, expected, prev = links.expect(row)
            problem = None
            if chain is None and chains_began:
                problem = f"entry {seq} has no chain but comes after the chains began"
            elif chain is not None and chain != chain_of(row["workspace_id"]):
                problem = f"entry {seq} is filed in a chain that is not its workspace's"
            elif place != expected:  # the chain breaks at the row after the gap
                many = place > expected + 1
                what = f"entries {expected}..{place - 1}" if many else f"entry {expected}"
                where = "" if chain is None else f" of {_name(chain)}"
                problem = f"{what}{where} {'are' if many else 'is'} missing"
            elif row["prev_hash"] != prev or _digest(self.audit_key, prev, row) != row["hash"]:
                problem = (
                    f"entry {seq} was changed, or the one before it in its chain (or this "
                    "node's audit key is not the one that wrote it)"
                )
            if problem is not None:
                breaks[chain] = (seq, problem)
                continue
            links.advance(row, str(row["hash"]))

        # Deleting the newest entries of a chain leaves no later row to break: the
        # database's marks of the highest seq each chain had, and the checkpoints kept
        # elsewhere, remember.
        legacy_top = links.heads.get(None, (0, GENESIS))[0]
        for name, top in marks.items():
            chain = None if name == LEGACY_MARK else name.removeprefix("audit:")
            have = legacy_top if chain is None else chain_top.get(chain, 0)
            if chain not in breaks and top > have:
                if chain is None:
                    problem = f"entries {have + 1}..{top} were deleted"
                    breaks[None] = (have + 1, problem)
                else:
                    problem = (
                        f"{_name(chain)} ends at entry {have}, but it had entry {top}: "
                        "its newest entries were deleted"
                    )
                    breaks[chain] = (top, problem)
        if given is not None and global_break is None and given > last_seq:
            global_break = (last_seq + 1, f"entries {last_seq + 1}..{given} were deleted")
        for kept, what in ((head_file, HEAD_FILE), (checkpoint, "the checkpoint")):
            if kept is None or global_break is not None:
                continue
            seq, digest = kept
            if seq > last_seq:
                global_break = (
                    last_seq + 1,
                    f"{what} names entry {seq}, but the trail ends at {last_seq}: newer "
                    "entries were deleted",
                )
            elif not hmac.compare_digest(hashes.get(seq, ""), digest):
                global_break = (seq, f"entry {seq} is not the one {what} names: re-chained")
        # Each chain's newest entry when audit.head was last written: still there, as it was
        # (a chain's newest entries deleted, and its mark in the database lowered too).
        for name, (seq, digest) in sorted(kept_heads.items(), key=lambda kept: kept[1]):
            if global_break is not None or hmac.compare_digest(hashes.get(seq, ""), digest):
                continue
            chain = None if name == LEGACY_KEY else name
            gone = "was deleted" if seq not in hashes else "is not the one it names: re-chained"
            global_break = (seq, f"{HEAD_FILE} names entry {seq} as the newest of "
                            f"{_name(chain)} then; it {gone}")  # fmt: skip

        found = [
            found
            for chain, found in breaks.items()
            if workspace_id is None or chain is None or chain == workspace_id
        ]
        if global_break is not None:
            found.append(global_break)
        if found:
            seq, problem = min(found)
            return AuditVerdict(count, seq, problem, None, None)
        if workspace_id is not None:
            return AuditVerdict(count, None, None, *(mine or (None, None)))
        if not last_seq:
            return AuditVerdict(count, None, None, None, None)
        return AuditVerdict(count, None, None, last_seq, last_hash)

    def _marks(self) -> dict[str, int]:
        """The high-water marks this database keeps of the trail: ``audit`` for the
        legacy trail, ``audit:<chain>`` for each chain (PostgreSQL's runnerd_high_water;
        a SQLite file keeps none per chain: its one gap-free seq is the check)."""
        if self.db.dialect != "postgresql":
            return {}
        rows = self.db.execute(
            "SELECT name, value FROM runnerd_high_water WHERE name = ? OR name LIKE ?",
            [LEGACY_MARK, "audit:%"],
        ).fetchall()
        return {str(name): int(value) for name, value in rows}

    def audit_marks(self) -> dict[str, int]:
        """What a copy of this trail must remember as its high-water marks (``admin
        copy``): this database's own marks, else (a SQLite file) each chain's newest
        seq, and the legacy trail's, or the file's highest seq ever given out when
        the trail has no chains yet."""
        marks = self._marks()
        if marks:
            return marks
        found = {
            f"audit:{chain}": int(top)
            for chain, top in self.db.execute(
                "SELECT chain, MAX(seq) FROM audit WHERE chain IS NOT NULL GROUP BY chain"
            ).fetchall()
        }
        legacy = self.db.execute("SELECT MAX(seq) FROM audit WHERE chain IS NULL").fetchone()
        top = self.db.high_water("audit") if not found else None
        legacy_top = max(int(legacy[0] or 0), int(top or 0))
        if legacy_top:
            found[LEGACY_MARK] = legacy_top
        return found

    def align_audit_sequence(self) -> None:
        """After rows were written with their own seq (``admin copy``): PostgreSQL's
        sequence goes past them, so the next entry's seq is new. (SQLite: max+1.)"""
        if self.db.dialect == "postgresql":
            self.db.execute(
                "SELECT setval(pg_get_serial_sequence('audit', 'seq'), "
                "COALESCE(MAX(seq), 0) + 1, false) FROM audit"
            )

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

    def _read_chain_heads(self) -> dict[str, tuple[int, str]]:
        """Each chain's newest entry (seq, hash) as ``audit.head`` last recorded it (the
        legacy trail under ``legacy``); none from a file without them (an older runnerd's)
        or unreadable (``_read_head`` says so)."""
        if self.audit_head_path is None:
            return {}
        try:
            found = json.loads(self.audit_head_path.read_text()).get("chains") or {}
            return {str(name): (int(seq), str(digest)) for name, (seq, digest) in found.items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}

    def _chain_heads_after(self, after: int) -> dict[str, tuple[int, str]]:
        """The newest entry of each chain that has entries after seq ``after`` (all of
        them from 0: once, the first checkpoint of a trail), one round trip."""
        rows = self.db.execute(
            "SELECT a.chain, a.seq, a.hash FROM audit AS a JOIN (SELECT chain, MAX(seq) AS seq "
            "FROM audit WHERE seq > ? GROUP BY chain) AS m ON a.seq = m.seq",
            [after],
        ).fetchall()
        return {
            LEGACY_KEY if chain is None else str(chain): (int(seq), str(digest))
            for chain, seq, digest in rows
        }

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
        # Each chain's newest entry too: the newest overall pins one chain only. The
        # chains that moved since the file was written, each from the entry it named.
        heads = self._read_chain_heads() if kept is not None else {}
        after = kept[0] if kept is not None and heads else 0
        moved = self._chain_heads_after(after)
        before = {name: heads[name] for name in moved if name in heads}
        if before:
            have = dict(
                self.db.execute(
                    f"SELECT seq, hash FROM audit WHERE seq IN ({', '.join('?' * len(before))})",
                    [seq for seq, _ in before.values()],
                ).fetchall()
            )
            for name, (seq, digest) in before.items():
                if not hmac.compare_digest(str(have.get(seq, "")), digest):
                    log.error(
                        "the audit trail no longer holds entry %s, the newest of chain %s "
                        "when %s was written: entries were deleted or changed; run "
                        "`runnerd audit verify`",
                        seq,
                        name,
                        self.audit_head_path,
                    )
                    return False
        heads.update(moved)
        text = json.dumps(
            {
                "seq": int(last[0]),
                "hash": str(last[1]),
                "at": utc_now(),
                "chains": {name: [seq, digest] for name, (seq, digest) in sorted(heads.items())},
            }
        )
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
        entry's hash becomes its HMAC, chain by chain, and an ``audit.rechain`` entry says
        how many were re-chained and where the plain chain broke, if it did. Only for a
        trail whose newest entry has a plain hash, in a data dir that has no checkpoint
        yet: a keyed chain (under this key or another) is never re-chained, ``audit
        verify`` reports its breaks. Returns the count."""
        if self.audit_head_path is not None and self.audit_head_path.exists():
            return 0
        newest = list(self.db.query("SELECT * FROM audit ORDER BY seq DESC LIMIT 1"))
        if not newest or self.audit_key_matches():
            return 0
        if _digest(None, newest[0]["prev_hash"], newest[0]) != newest[0]["hash"]:
            return 0  # keyed under another key (a node given the wrong one): never re-key
        with self._write():
            old, new, plain_break = _Links(), _Links(), None
            rows = self.db.query("SELECT * FROM audit ORDER BY seq")
            updates = []
            for row in rows:
                place, expected, prev_old = old.expect(row)
                if plain_break is None and (
                    place != expected
                    or row["prev_hash"] != prev_old
                    or _digest(None, prev_old, row) != row["hash"]
                ):
                    plain_break = int(row["seq"])
                prev_new = new.expect(row)[2]
                new_hash = _digest(self.audit_key, prev_new, row)
                updates.append((prev_new, new_hash, row["seq"]))
                old.advance(row, str(row["hash"]))
                new.advance(row, new_hash)
            for prev_hash, new_hash, seq in updates:
                self.db.execute(
                    "UPDATE audit SET prev_hash = ?, hash = ? WHERE seq = ?",
                    [prev_hash, new_hash, seq],
                )
            self._append_audit(
                "audit.rechain", detail={"entries": len(updates), "plainFirstBreak": plain_break}
            )
        return len(updates)
