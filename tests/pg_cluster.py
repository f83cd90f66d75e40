"""A throwaway PostgreSQL cluster for the tests: Debian's PostgreSQL binaries, initdb and
pg_ctl run as the ``postgres`` user, a Unix socket in a temp folder (no TCP port), and
one fresh database per test."""

from __future__ import annotations

import glob
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

__all__ = ["PgCluster"]


def _bin(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is missing: scripts/setup installs postgresql")
    return found


class PgCluster:
    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="runnerd-pg-", dir="/tmp"))
        shutil.chown(self.base, "postgres", "postgres")
        self.data = self.base / "data"
        self._as_postgres(_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U",
                          "postgres", "--no-sync", "-E", "UTF8")  # fmt: skip
        self.start()

    def start(self) -> None:
        options = f"-k {self.base} -c listen_addresses='' -c fsync=off -c max_connections=200"
        self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-w",
                          "-l", str(self.base / "log"), "start")  # fmt: skip

    def halt(self) -> None:
        """Stop the server, keeping its data (start() brings it back)."""
        self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def _as_postgres(self, *argv: str) -> None:
        done = subprocess.run(["runuser", "-u", "postgres", "--", *argv],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}{done.stderr}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.base}"

    def new_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
        return self.url(name)

    def stop(self) -> None:
        self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.base, ignore_errors=True)
