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

import os
import secrets
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from harnessrl.errors import NotFound
from harnessrl.schemas import (
    Call,
    Outcome,
    PolicyVersion,
    Rollout,
    RolloutStatus,
    Run,
    Task,
    now,
    status_for_outcome,
)
from harnessrl.store.codecs import (
    ROLLOUT_COLUMNS,
    call_from_row,
    call_to_row,
    check_transition,
    dump_json,
    load_json,
    policy_version_from_row,
    rollout_from_row,
    rollout_to_row,
    run_from_row,
    sql_where,
    task_from_row,
)
from harnessrl.store.migrations import migrate_sqlite

StatusFilter = RolloutStatus | Sequence[RolloutStatus] | None


class SQLiteStore:
    """The ``Store`` protocol on SQLite. ``path`` is a file (parent folders are created) or ``":memory:"``."""

    def __init__(
        self,
        path: str | Path,
        *,
        timeout_s: float = 30.0,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
    ) -> None:
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

    # -- runs -------------------------------------------------------------------------------------
    def create_run(self, run_id: str, config: dict[str, Any] | None = None) -> Run:
        run = Run(run_id=run_id, config=config or {})
        with self._write() as conn:
            conn.execute(
                "INSERT INTO runs (run_id, config, status, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (run_id) DO NOTHING",
                (run.run_id, dump_json(run.config), run.status, run.created_at),
            )
            return run_from_row(
                _fetch_one(conn, "SELECT * FROM runs WHERE run_id = ?", (run_id,), "run", run_id)
            )

    def get_run(self, run_id: str) -> Run:
        with self._locked() as conn:
            return run_from_row(
                _fetch_one(conn, "SELECT * FROM runs WHERE run_id = ?", (run_id,), "run", run_id)
            )

    def list_runs(self) -> list[Run]:
        with self._locked() as conn:
            return [run_from_row(row) for row in conn.execute("SELECT * FROM runs ORDER BY pk")]

    def set_run_status(self, run_id: str, status: str) -> None:
        with self._write() as conn:
            if conn.execute("UPDATE runs SET status = ? WHERE run_id = ?", (status, run_id)).rowcount == 0:
                raise NotFound(f"run {run_id!r} not found")

    # -- tasks ------------------------------------------------------------------------------------
    def add_tasks(self, tasks: Sequence[Task]) -> None:
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO tasks (task_id, run_id, split, data) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (task_id) DO NOTHING",
                [(t.task_id, t.run_id, t.split, dump_json(t.data)) for t in tasks],
            )

    def get_task(self, task_id: str) -> Task:
        with self._locked() as conn:
            row = _fetch_one(conn, "SELECT * FROM tasks WHERE task_id = ?", (task_id,), "task", task_id)
            return task_from_row(row)

    def list_tasks(self, run_id: str | None = None, split: str | None = None) -> list[Task]:
        where, params = sql_where("?", run_id=run_id, split=split)
        with self._locked() as conn:
            return [
                task_from_row(row) for row in conn.execute(f"SELECT * FROM tasks{where} ORDER BY pk", params)
            ]

    # -- rollouts ---------------------------------------------------------------------------------
    def create_rollout(
        self,
        *,
        rollout_id: str | None = None,
        task: dict[str, Any] | None = None,
        run_id: str | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
        step: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        rollout = Rollout(
            rollout_id=rollout_id or uuid.uuid4().hex,
            api_key="hrl-" + secrets.token_urlsafe(24),
            run_id=run_id,
            task_id=task_id,
            task=task or {},
            group_id=group_id,
            step=step,
            metadata=metadata or {},
        )
        with self._write() as conn:
            # ON CONFLICT DO NOTHING makes a repeated create (e.g. a retried HTTP request) a no-op,
            # so the caller gets back the key the first call issued.
            _insert(conn, "rollouts", rollout_to_row(rollout), "ON CONFLICT (rollout_id) DO NOTHING")
            return rollout_from_row(_rollout_row(conn, rollout.rollout_id))

    def get_rollout(self, rollout_id: str) -> Rollout:
        with self._locked() as conn:
            return rollout_from_row(_rollout_row(conn, rollout_id))

    def get_rollout_by_key(self, api_key: str) -> Rollout:
        with self._locked() as conn:
            row = conn.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE api_key = ?", (api_key,)
            ).fetchone()
        if row is None:
            raise NotFound("no rollout has this api key")  # never echo a (wrong) key into logs
        return rollout_from_row(row)

    def list_rollouts(
        self,
        *,
        run_id: str | None = None,
        status: StatusFilter = None,
        step: int | None = None,
        group_id: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        where, params = sql_where("?", run_id=run_id, status=status, step=step, group_id=group_id)
        # SQLite needs a LIMIT before OFFSET; -1 means no limit.
        params += [-1 if limit is None else limit, offset]
        sql = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts{where} ORDER BY pk LIMIT ? OFFSET ?"
        with self._locked() as conn:
            return [rollout_from_row(row) for row in conn.execute(sql, params)]

    def count_rollouts(
        self, *, run_id: str | None = None, status: StatusFilter = None, step: int | None = None
    ) -> int:
        where, params = sql_where("?", run_id=run_id, status=status, step=step)
        with self._locked() as conn:
            return conn.execute(f"SELECT COUNT(*) FROM rollouts{where}", params).fetchone()[0]

    def claim_rollouts(self, worker_id: str, limit: int, *, run_id: str | None = None) -> list[Rollout]:
        if limit <= 0:
            return []
        run_filter = "" if run_id is None else " AND run_id = ?"
        params: list[Any] = [worker_id, now(), *([] if run_id is None else [run_id]), limit]
        with self._write() as conn:
            rows = conn.execute(
                "UPDATE rollouts SET status = 'running', worker_id = ?, started_at = ? WHERE pk IN "
                f"(SELECT pk FROM rollouts WHERE status = 'queued'{run_filter} ORDER BY pk LIMIT ?) "
                f"RETURNING {ROLLOUT_COLUMNS}",
                params,
            ).fetchall()
        # RETURNING gives no order guarantee; the contract is oldest first.
        return [rollout_from_row(row) for row in sorted(rows, key=lambda row: row["pk"])]

    def start_rollout(self, rollout_id: str) -> Rollout:
        with self._write() as conn:
            row = _rollout_row(conn, rollout_id)
            if row["status"] == RolloutStatus.RUNNING:
                return rollout_from_row(row)  # started by an earlier call or a claim; starting is idempotent
            check_transition(row, RolloutStatus.RUNNING)
            return self._update(conn, rollout_id, status=RolloutStatus.RUNNING.value, started_at=now())

    def finish_rollout(
        self,
        rollout_id: str,
        outcome: Outcome,
        reward: float,
        *,
        error: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        outcome = Outcome(outcome)
        status = status_for_outcome(outcome)
        with self._write() as conn:
            row = _rollout_row(conn, rollout_id)
            check_transition(row, status)
            changes: dict[str, Any] = {
                "status": status.value,
                "outcome": outcome.value,
                "reward": float(reward),
                "finished_at": now(),
                "metadata": dump_json({**load_json(row["metadata"]), **(metadata or {})}),
            }
            if error is not None:
                changes["error"] = error
            return self._update(conn, rollout_id, **changes)

    def requeue_rollout(self, rollout_id: str, *, error: str | None = None) -> Rollout:
        with self._write() as conn:
            row = _rollout_row(conn, rollout_id)
            check_transition(row, RolloutStatus.QUEUED)
            changes: dict[str, Any] = {
                "status": RolloutStatus.QUEUED.value,
                "attempt": row["attempt"] + 1,
                "worker_id": None,
            }
            if error is not None:
                changes["error"] = error
            return self._update(conn, rollout_id, **changes)

    def cancel_rollout(self, rollout_id: str) -> Rollout:
        with self._write() as conn:
            check_transition(_rollout_row(conn, rollout_id), RolloutStatus.CANCELLED)
            return self._update(conn, rollout_id, status=RolloutStatus.CANCELLED.value, finished_at=now())

    def set_rollout_flags(self, rollout_id: str, flags: Sequence[str]) -> None:
        with self._write() as conn:
            _rollout_row(conn, rollout_id)
            self._update(conn, rollout_id, flags=dump_json(list(flags)))

    def update_rollout_metadata(self, rollout_id: str, metadata: dict[str, Any]) -> Rollout:
        with self._write() as conn:
            merged = {**load_json(_rollout_row(conn, rollout_id)["metadata"]), **metadata}
            return self._update(conn, rollout_id, metadata=dump_json(merged))

    @staticmethod
    def _update(conn: sqlite3.Connection, rollout_id: str, **changes: Any) -> Rollout:
        # Column names come from this module only, never from callers.
        assignments = ", ".join(f"{column} = ?" for column in changes)
        row = conn.execute(
            f"UPDATE rollouts SET {assignments} WHERE rollout_id = ? RETURNING {ROLLOUT_COLUMNS}",
            [*changes.values(), rollout_id],
        ).fetchone()
        return rollout_from_row(row)

    # -- calls ------------------------------------------------------------------------------------
    def add_call(self, call: Call) -> Call:
        # Encode outside the lock: packing long token lists is the slow part.
        row = call_to_row(call.model_copy(update={"call_id": call.call_id or uuid.uuid4().hex}))
        with self._write() as conn:
            if not conn.execute("SELECT 1 FROM rollouts WHERE rollout_id = ?", (call.rollout_id,)).fetchone():
                raise NotFound(f"rollout {call.rollout_id!r} not found")
            # Under BEGIN IMMEDIATE no other writer can insert between this read and the insert.
            sql = "SELECT COALESCE(MAX(seq) + 1, 0) FROM calls WHERE rollout_id = ?"
            row["seq"] = conn.execute(sql, (call.rollout_id,)).fetchone()[0]
            _insert(conn, "calls", row)
        return call.model_copy(update={"seq": row["seq"], "call_id": row["call_id"]})

    def list_calls(self, rollout_id: str, *, attempt: int | None = None) -> list[Call]:
        where, params = sql_where("?", rollout_id=rollout_id, attempt=attempt)
        with self._locked() as conn:
            rows = conn.execute(f"SELECT * FROM calls{where} ORDER BY seq", params).fetchall()
        return [call_from_row(row) for row in rows]

    def count_calls(self, rollout_id: str | None = None) -> int:
        where, params = sql_where("?", rollout_id=rollout_id)
        with self._locked() as conn:
            return conn.execute(f"SELECT COUNT(*) FROM calls{where}", params).fetchone()[0]

    # -- policy versions --------------------------------------------------------------------------
    def add_policy_version(self, version: PolicyVersion) -> None:
        with self._write() as conn:
            row = {**version.model_dump(), "metadata": dump_json(version.metadata)}
            upsert = ", ".join(f"{column} = excluded.{column}" for column in row if column != "version")
            _insert(conn, "policy_versions", row, f"ON CONFLICT (version) DO UPDATE SET {upsert}")

    def latest_policy_version(self) -> PolicyVersion | None:
        with self._locked() as conn:
            row = conn.execute("SELECT * FROM policy_versions ORDER BY version DESC LIMIT 1").fetchone()
        return None if row is None else policy_version_from_row(row)

    def list_policy_versions(self) -> list[PolicyVersion]:
        with self._locked() as conn:
            return [
                policy_version_from_row(row)
                for row in conn.execute("SELECT * FROM policy_versions ORDER BY version")
            ]

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


# -- helpers: SQL ----------------------------------------------------------------------------------


def _insert(conn: sqlite3.Connection, table: str, row: dict[str, Any], conflict: str = "") -> None:
    columns = ", ".join(row)
    placeholders = ", ".join(f":{column}" for column in row)
    conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({placeholders}) {conflict}", row)


def _fetch_one(
    conn: sqlite3.Connection, sql: str, params: tuple[Any, ...], kind: str, key: str
) -> sqlite3.Row:
    row = conn.execute(sql, params).fetchone()
    if row is None:
        raise NotFound(f"{kind} {key!r} not found")
    return row


def _rollout_row(conn: sqlite3.Connection, rollout_id: str) -> sqlite3.Row:
    sql = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?"
    return _fetch_one(conn, sql, (rollout_id,), "rollout", rollout_id)
