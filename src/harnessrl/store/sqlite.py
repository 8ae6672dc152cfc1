"""``SQLiteStore``: the embedded ``Store`` on one SQLite file (WAL), shared by several processes.

The gateway, controller and trainer each open their own ``SQLiteStore`` on the same file. Within a
process, one connection is shared by all threads behind an ``RLock`` (SQLite has one writer at a
time anyway). Across processes, every read-modify-write (seq assignment, claims, transitions,
metadata merges) runs in ``BEGIN IMMEDIATE``, which takes the database's write lock before reading,
so two processes never decide from the same stale read; waiting for that lock is bounded by
``busy_timeout``.

Durability: ``journal_mode=WAL`` with ``synchronous=NORMAL``. A commit has been written into the
WAL file (the OS page cache) before ``COMMIT`` returns, so it survives the process being SIGKILLed,
which is what the ``Store`` contract asks for; only an OS crash or power loss can drop the last few
commits. Pass ``synchronous="FULL"`` to fsync every commit when that matters more than latency.
WAL needs shared memory, so the file must be on a local filesystem (not NFS).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from harnessrl.store.migrations import migrate_sqlite
from harnessrl.store.sql import SQLStore, StatusFilter

__all__ = ["SQLiteStore", "StatusFilter"]


class SQLiteStore(SQLStore):
    """The ``Store`` protocol on SQLite. ``path`` is a file (parent folders are created) or ``":memory:"``."""

    PARAM = "?"
    ROW_LOCK = ""  # the write transaction already holds the database's write lock
    CLAIM_LOCK = ""
    NO_LIMIT = -1  # SQLite needs a LIMIT before OFFSET; -1 means none

    def __init__(
        self,
        path: str | Path,
        *,
        timeout_s: float = 30.0,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
    ) -> None:
        super().__init__()
        self.path = str(path)
        self._timeout_s = timeout_s
        self._synchronous = synchronous
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._closed = False
        self._conn = self._connect()
        with self._write() as conn:
            migrate_sqlite(conn, where=f"store {self.path!r}")
        if self.path != ":memory:" and not self.path.startswith("file:"):
            # Every task with its hidden data and every rollout key: readable by its owner only (the
            # WAL and shared-memory files SQLite creates next to it copy these permissions).
            with contextlib.suppress(OSError):
                os.chmod(self.path, 0o600)

    @property
    def local_file(self) -> Path | None:
        if self.path == ":memory:" or self.path.startswith("file:"):
            return None
        return Path(self.path)

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: the sqlite3 module never opens transactions on its own; we issue
        # BEGIN IMMEDIATE / COMMIT ourselves so every write's locking is explicit.
        conn = sqlite3.connect(
            self.path, timeout=self._timeout_s, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        if self._pid != os.getpid() and not self._closed:
            # A forked child must not use the parent's connection (its POSIX locks do not carry
            # over, which can corrupt the file) nor a lock another parent thread may have held.
            self._pid, self._lock = os.getpid(), threading.RLock()
            if self.path != ":memory:":
                self._conn = self._connect()
        with self._lock:
            yield self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding the database's write lock from its first read."""
        with self._locked() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    _read = _locked

    def named(self, column: str) -> str:
        return f":{column}"

    def _executemany(self, conn: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
        conn.executemany(sql, rows)

    # -- lifecycle --------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
