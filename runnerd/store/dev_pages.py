"""A person's dev pages of an install (``runnerd app dev``, api/dev_pages.py), kept in the
store so that every node of a cluster serves them, whichever node took the PUT.

They are a developer's page files, not secrets, but they are that person's only: read
by (install, person), never listed. Their time is the database's clock (``db_now``): a
person's pages are alive while their last PUT is younger than ``ttl_s`` on every node
alike. Past it they are never served, and the next PUT (any person's, on any node) drops
them; so does the person's DELETE, and the install's removal (its rows cascade). All the
dev pages of the store together stay within ``max_bytes``: a PUT past it drops the oldest
person's first.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import msgspec

from runnerd.ids import stamp
from runnerd.store.core import StoreBase

__all__ = ["DevPagesRow", "DevPagesStore"]

# The keyed lock of every PUT: the store-wide bound on their bytes is read, then written
# on the strength of, across nodes.
_LOCK = "dev-pages"


class DevPagesRow(msgspec.Struct, frozen=True):
    """A person's dev pages of an install, without their files."""

    install_id: str
    user_id: str
    entry: str
    revision: int  # counts the PUTs since none were held: 1 for the first
    size: int  # bytes of every file together
    files: int
    updated_at: str  # the last PUT's, on the database's clock


class DevPagesStore(StoreBase):
    def _alive_since(self, ttl_s: float) -> str:
        """The oldest last PUT that is still alive now, on the database's clock."""
        return stamp(self.db_now() - timedelta(seconds=ttl_s))

    def put_dev_pages(
        self,
        install_id: str,
        user_id: str,
        entry: str,
        files: Mapping[str, tuple[bytes, str, str]],
        *,
        ttl_s: float,
        max_bytes: int,
    ) -> DevPagesRow:
        """Replace the person's dev pages of the install with ``files`` (path -> content,
        content type, sha256; ``entry`` among them), in one transaction: the revision is
        one more than the one they held alive (1 when none). Drops every person's pages
        past ``ttl_s`` first, then the oldest others' until all fit in ``max_bytes``."""
        size = sum(len(content) for content, _, _ in files.values())
        with self._write(_LOCK):
            now = self.db_now()
            self.db.execute(  # the files go with them (ON DELETE CASCADE)
                "DELETE FROM dev_pages WHERE updated_at <= ?",
                [stamp(now - timedelta(seconds=ttl_s))],
            )
            before = self.db.execute(
                "SELECT revision FROM dev_pages WHERE install_id = ? AND user_id = ?",
                [install_id, user_id],
            ).fetchone()
            self.db.execute(
                "DELETE FROM dev_pages WHERE install_id = ? AND user_id = ?", [install_id, user_id]
            )
            held = self.db.execute(
                "SELECT install_id, user_id, size FROM dev_pages "
                "ORDER BY updated_at, install_id, user_id"
            ).fetchall()
            total = sum(int(row[2]) for row in held)
            for other_install, other_user, other_size in held:
                if total + size <= max_bytes:
                    break
                self.db.execute(
                    "DELETE FROM dev_pages WHERE install_id = ? AND user_id = ?",
                    [other_install, other_user],
                )
                total -= int(other_size)
            row = DevPagesRow(
                install_id=install_id,
                user_id=user_id,
                entry=entry,
                revision=(int(before[0]) if before else 0) + 1,
                size=size,
                files=len(files),
                updated_at=stamp(now),
            )
            self.db.insert(
                "dev_pages",
                {"install_id": install_id, "user_id": user_id, "entry": entry,
                 "revision": row.revision, "size": size, "updated_at": row.updated_at},
            )  # fmt: skip
            self.db.insert_all(
                "dev_page_files",
                [
                    {"install_id": install_id, "user_id": user_id, "path": path,
                     "content": content, "content_type": kind, "sha256": sha256}
                    for path, (content, kind, sha256) in files.items()
                ],
            )  # fmt: skip
        return row

    def dev_pages(self, install_id: str, user_id: str, *, ttl_s: float) -> DevPagesRow | None:
        """The person's dev pages of the install (without their files); None when they
        hold none, or none younger than ``ttl_s``."""
        found = self.db.execute(
            """SELECT d.entry, d.revision, d.size, d.updated_at,
                      (SELECT count(*) FROM dev_page_files f
                       WHERE f.install_id = d.install_id AND f.user_id = d.user_id)
               FROM dev_pages d WHERE d.install_id = ? AND d.user_id = ? AND d.updated_at > ?""",
            [install_id, user_id, self._alive_since(ttl_s)],
        ).fetchone()
        if found is None:
            return None
        entry, revision, size, updated_at, files = found
        return DevPagesRow(
            install_id, user_id, str(entry), int(revision), int(size), int(files), str(updated_at)
        )

    def dev_page(
        self, install_id: str, user_id: str, path: str | None, *, ttl_s: float
    ) -> tuple[bytes, str, str] | None:
        """(content, content type, sha256) of the one file ``path`` (None: the entry) of
        the person's dev pages of the install, one row read; None when they hold none
        younger than ``ttl_s``, or no such file."""
        which = "f.path = d.entry" if path is None else "f.path = ?"
        found = self.db.execute(
            f"""SELECT f.content, f.content_type, f.sha256 FROM dev_pages d
                JOIN dev_page_files f ON f.install_id = d.install_id AND f.user_id = d.user_id
                WHERE d.install_id = ? AND d.user_id = ? AND d.updated_at > ? AND {which}""",
            [install_id, user_id, self._alive_since(ttl_s), *([] if path is None else [path])],
        ).fetchone()
        return (bytes(found[0]), str(found[1]), str(found[2])) if found else None

    def drop_dev_pages(self, install_id: str, user_id: str) -> bool:
        """Drop the person's dev pages of the install; False when they held none."""
        with self._write(_LOCK):  # after a PUT of theirs going on, never halfway; files cascade
            cur = self.db.execute(
                "DELETE FROM dev_pages WHERE install_id = ? AND user_id = ?", [install_id, user_id]
            )
        return bool(cur.rowcount)

    def drop_stale_dev_pages(self, ttl_s: float) -> int:
        """Drop every person's dev pages whose last PUT is ``ttl_s`` old or more (on the
        database's clock); how many people's went."""
        with self._transaction():
            cur = self.db.execute(
                "DELETE FROM dev_pages WHERE updated_at <= ?", [self._alive_since(ttl_s)]
            )
        return int(cur.rowcount)
