"""``PostgresStore``: the ``Store`` on PostgreSQL, for several gateways, controllers and trainers
on several hosts sharing one database.

Same schema and semantics as ``SQLiteStore`` (see ``migrations.py`` for the DDL); what differs is
how concurrency is made safe, since PostgreSQL has many writers at once instead of one:

- Claims: ``UPDATE ... WHERE pk IN (SELECT ... ORDER BY pk LIMIT n FOR UPDATE SKIP LOCKED)``.
  Each claimer locks the queued rows it takes and skips rows another claimer holds, so two
  claimers never get the same rollout and never wait on each other. A rollout locked by another
  write at that instant (e.g. a call being recorded) is skipped by that claim and taken by a later one.
- Call seqs: ``add_call`` locks the rollout's row (``FOR UPDATE``) before reading ``MAX(seq)`` and
  holds it until the call is committed, so calls of one rollout get 0, 1, 2, ... in commit order
  however many gateway processes write them (under READ COMMITTED each statement sees what the
  previous lock holder committed).
- Status changes and metadata merges read the rollout ``FOR UPDATE`` before deciding, so two
  writers never both act on the same stale status.

Every method is one transaction on a connection from a ``psycopg_pool.ConnectionPool``; the pool
is thread-safe (the gateway and controller call the store from worker threads) and checks a
connection before lending it, so a restarted server costs no failed calls. Durability is the
server's: a method returns after ``COMMIT``, which with PostgreSQL's default
``synchronous_commit=on`` has flushed the WAL.

Connection problems surface as ``UpstreamError`` naming the server (password removed).
"""

from __future__ import annotations

import os
import secrets
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from harnessrl.errors import ConfigError, NotFound, UpstreamError
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
    Row,
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
from harnessrl.store.migrations import migrate_postgres

try:
    import psycopg
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # an optional extra: say how to get it
    raise ConfigError(
        "a postgresql:// store needs psycopg 3 and psycopg-pool: pip install 'harnessrl[postgres]'"
    ) from exc

StatusFilter = RolloutStatus | Sequence[RolloutStatus] | None

# A forked child opens its own pool and keeps the parent's here, never closing or finalizing it:
# closing would act on connections the parent still uses, and the pool's finalizer would wait on
# worker threads that did not survive the fork. (psycopg itself never closes a connection that
# another process opened.)
_INHERITED_POOLS: list[Any] = []


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class PostgresStore:
    """The ``Store`` protocol on PostgreSQL. ``url`` is a libpq URL (``postgresql://user@host:port/db``);
    the database must exist; its tables are created or migrated on open."""

    def __init__(
        self, url: str, *, min_connections: int = 1, max_connections: int = 8, timeout_s: float = 30.0
    ) -> None:
        if not 1 <= min_connections <= max_connections:
            raise ConfigError("PostgresStore needs 1 <= min_connections <= max_connections")
        self.url = url
        self._min, self._max, self._timeout_s = min_connections, max_connections, timeout_s
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        try:
            # One plain connection for the migration, so a wrong URL or a down server fails here
            # with libpq's own reason (the pool would only time out).
            with psycopg.connect(url, connect_timeout=max(1, int(timeout_s))) as conn:
                migrate_postgres(conn, where=f"store {redact(url)}")
        except psycopg.OperationalError as exc:
            raise UpstreamError(f"cannot use PostgreSQL store {redact(url)}: {exc}".strip()) from exc
        self._pool = self._new_pool()

    def _new_pool(self) -> ConnectionPool:
        return ConnectionPool(
            self.url,
            min_size=self._min,
            max_size=self._max,
            timeout=self._timeout_s,
            kwargs={"row_factory": dict_row},
            check=ConnectionPool.check_connection,
            name=f"harnessrl-store-{os.getpid()}",
            open=True,
        )

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Row]]:
        """One transaction on a pooled connection: committed on success, rolled back on error."""
        if self._pid != os.getpid() and not self._closed:
            # A forked child: its own pool, and a new lock (a parent thread may have held the old
            # one at the fork).
            _INHERITED_POOLS.append(self._pool)
            self._pid, self._lock, self._pool = os.getpid(), threading.Lock(), self._new_pool()
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise UpstreamError(f"PostgreSQL store {redact(self.url)}: {exc}") from exc

    # -- runs -------------------------------------------------------------------------------------
    def create_run(self, run_id: str, config: dict[str, Any] | None = None) -> Run:
        run = Run(run_id=run_id, config=config or {})
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO runs (run_id, config, status, created_at) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (run_id) DO NOTHING",
                (run.run_id, dump_json(run.config), run.status, run.created_at),
            )
            return run_from_row(
                _fetch_one(conn, "SELECT * FROM runs WHERE run_id = %s", (run_id,), "run", run_id)
            )

    def get_run(self, run_id: str) -> Run:
        with self._tx() as conn:
            return run_from_row(
                _fetch_one(conn, "SELECT * FROM runs WHERE run_id = %s", (run_id,), "run", run_id)
            )

    def list_runs(self) -> list[Run]:
        with self._tx() as conn:
            return [run_from_row(row) for row in conn.execute("SELECT * FROM runs ORDER BY pk")]

    def set_run_status(self, run_id: str, status: str) -> None:
        with self._tx() as conn:
            if conn.execute("UPDATE runs SET status = %s WHERE run_id = %s", (status, run_id)).rowcount == 0:
                raise NotFound(f"run {run_id!r} not found")

    # -- tasks ------------------------------------------------------------------------------------
    def add_tasks(self, tasks: Sequence[Task]) -> None:
        if not tasks:
            return
        with self._tx() as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO tasks (task_id, run_id, split, data) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (task_id) DO NOTHING",
                [(t.task_id, t.run_id, t.split, dump_json(t.data)) for t in tasks],
            )

    def get_task(self, task_id: str) -> Task:
        with self._tx() as conn:
            row = _fetch_one(conn, "SELECT * FROM tasks WHERE task_id = %s", (task_id,), "task", task_id)
            return task_from_row(row)

    def list_tasks(self, run_id: str | None = None, split: str | None = None) -> list[Task]:
        where, params = sql_where("%s", run_id=run_id, split=split)
        with self._tx() as conn:
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
        with self._tx() as conn:
            # A concurrent create of the same id waits on ON CONFLICT, then finds the winner's row.
            _insert(conn, "rollouts", rollout_to_row(rollout), "ON CONFLICT (rollout_id) DO NOTHING")
            return rollout_from_row(_rollout_row(conn, rollout.rollout_id))

    def get_rollout(self, rollout_id: str) -> Rollout:
        with self._tx() as conn:
            return rollout_from_row(_rollout_row(conn, rollout_id))

    def get_rollout_by_key(self, api_key: str) -> Rollout:
        with self._tx() as conn:
            row = conn.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE api_key = %s", (api_key,)
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
        where, params = sql_where("%s", run_id=run_id, status=status, step=step, group_id=group_id)
        # LIMIT NULL is no limit in PostgreSQL.
        sql = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts{where} ORDER BY pk LIMIT %s OFFSET %s"
        with self._tx() as conn:
            return [rollout_from_row(row) for row in conn.execute(sql, [*params, limit, offset])]

    def count_rollouts(
        self, *, run_id: str | None = None, status: StatusFilter = None, step: int | None = None
    ) -> int:
        where, params = sql_where("%s", run_id=run_id, status=status, step=step)
        with self._tx() as conn:
            return _scalar(conn, f"SELECT COUNT(*) AS n FROM rollouts{where}", params)

    def claim_rollouts(self, worker_id: str, limit: int, *, run_id: str | None = None) -> list[Rollout]:
        if limit <= 0:
            return []
        run_filter = "" if run_id is None else " AND run_id = %s"
        params: list[Any] = [worker_id, now(), *([] if run_id is None else [run_id]), limit]
        with self._tx() as conn:
            rows = conn.execute(
                "UPDATE rollouts SET status = 'running', worker_id = %s, started_at = %s WHERE pk IN "
                f"(SELECT pk FROM rollouts WHERE status = 'queued'{run_filter} ORDER BY pk LIMIT %s "
                f"FOR UPDATE SKIP LOCKED) RETURNING {ROLLOUT_COLUMNS}",
                params,
            ).fetchall()
        # RETURNING gives no order guarantee; the contract is oldest first.
        return [rollout_from_row(row) for row in sorted(rows, key=lambda row: row["pk"])]

    def start_rollout(self, rollout_id: str) -> Rollout:
        with self._tx() as conn:
            row = _rollout_row(conn, rollout_id, lock=True)
            if row["status"] == RolloutStatus.RUNNING:
                return rollout_from_row(row)  # started by an earlier call or a claim; starting is idempotent
            check_transition(row, RolloutStatus.RUNNING)
            return _update(conn, rollout_id, status=RolloutStatus.RUNNING.value, started_at=now())

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
        with self._tx() as conn:
            row = _rollout_row(conn, rollout_id, lock=True)
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
            return _update(conn, rollout_id, **changes)

    def requeue_rollout(self, rollout_id: str, *, error: str | None = None) -> Rollout:
        with self._tx() as conn:
            row = _rollout_row(conn, rollout_id, lock=True)
            check_transition(row, RolloutStatus.QUEUED)
            changes: dict[str, Any] = {
                "status": RolloutStatus.QUEUED.value,
                "attempt": row["attempt"] + 1,
                "worker_id": None,
            }
            if error is not None:
                changes["error"] = error
            return _update(conn, rollout_id, **changes)

    def cancel_rollout(self, rollout_id: str) -> Rollout:
        with self._tx() as conn:
            check_transition(_rollout_row(conn, rollout_id, lock=True), RolloutStatus.CANCELLED)
            return _update(conn, rollout_id, status=RolloutStatus.CANCELLED.value, finished_at=now())

    def set_rollout_flags(self, rollout_id: str, flags: Sequence[str]) -> None:
        with self._tx() as conn:
            sql = "UPDATE rollouts SET flags = %s WHERE rollout_id = %s"
            if conn.execute(sql, (dump_json(list(flags)), rollout_id)).rowcount == 0:
                raise NotFound(f"rollout {rollout_id!r} not found")

    def update_rollout_metadata(self, rollout_id: str, metadata: dict[str, Any]) -> Rollout:
        with self._tx() as conn:
            merged = {**load_json(_rollout_row(conn, rollout_id, lock=True)["metadata"]), **metadata}
            return _update(conn, rollout_id, metadata=dump_json(merged))

    # -- calls ------------------------------------------------------------------------------------
    def add_call(self, call: Call) -> Call:
        # Encode before taking a connection: packing long token lists is the slow part.
        row = call_to_row(call.model_copy(update={"call_id": call.call_id or uuid.uuid4().hex}))
        with self._tx() as conn:
            # The rollout's row lock serializes its writers until commit, and each statement below
            # reads a fresh snapshot, so MAX(seq) already counts the previous writer's call.
            _rollout_row(conn, call.rollout_id, lock=True)
            sql = "SELECT COALESCE(MAX(seq) + 1, 0) AS n FROM calls WHERE rollout_id = %s"
            row["seq"] = _scalar(conn, sql, (call.rollout_id,))
            _insert(conn, "calls", row)
        return call.model_copy(update={"seq": row["seq"], "call_id": row["call_id"]})

    def list_calls(self, rollout_id: str, *, attempt: int | None = None) -> list[Call]:
        where, params = sql_where("%s", rollout_id=rollout_id, attempt=attempt)
        with self._tx() as conn:
            rows = conn.execute(f"SELECT * FROM calls{where} ORDER BY seq", params).fetchall()
        return [call_from_row(row) for row in rows]

    def count_calls(self, rollout_id: str | None = None) -> int:
        where, params = sql_where("%s", rollout_id=rollout_id)
        with self._tx() as conn:
            return _scalar(conn, f"SELECT COUNT(*) AS n FROM calls{where}", params)

    # -- policy versions --------------------------------------------------------------------------
    def add_policy_version(self, version: PolicyVersion) -> None:
        with self._tx() as conn:
            row = {**version.model_dump(), "metadata": dump_json(version.metadata)}
            upsert = ", ".join(f"{column} = excluded.{column}" for column in row if column != "version")
            _insert(conn, "policy_versions", row, f"ON CONFLICT (version) DO UPDATE SET {upsert}")

    def latest_policy_version(self) -> PolicyVersion | None:
        with self._tx() as conn:
            row = conn.execute("SELECT * FROM policy_versions ORDER BY version DESC LIMIT 1").fetchone()
        return None if row is None else policy_version_from_row(row)

    def list_policy_versions(self) -> list[PolicyVersion]:
        with self._tx() as conn:
            return [
                policy_version_from_row(row)
                for row in conn.execute("SELECT * FROM policy_versions ORDER BY version")
            ]

    # -- lifecycle --------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._pid == os.getpid():  # a forked child leaves the parent's pool alone
                    self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- helpers: SQL ----------------------------------------------------------------------------------


def _insert(conn: psycopg.Connection[Row], table: str, row: dict[str, Any], conflict: str = "") -> None:
    # Column and table names come from this module only, never from callers.
    columns = ", ".join(row)
    placeholders = ", ".join(f"%({column})s" for column in row)
    conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({placeholders}) {conflict}", row)  # type: ignore[arg-type]


def _update(conn: psycopg.Connection[Row], rollout_id: str, **changes: Any) -> Rollout:
    assignments = ", ".join(f"{column} = %s" for column in changes)
    row = conn.execute(
        f"UPDATE rollouts SET {assignments} WHERE rollout_id = %s RETURNING {ROLLOUT_COLUMNS}",  # type: ignore[arg-type]
        [*changes.values(), rollout_id],
    ).fetchone()
    assert row is not None  # callers read the row (FOR UPDATE) in this transaction
    return rollout_from_row(row)


def _scalar(conn: psycopg.Connection[Row], sql: str, params: Sequence[Any]) -> int:
    row = conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row["n"]


def _fetch_one(conn: psycopg.Connection[Row], sql: str, params: tuple[Any, ...], kind: str, key: str) -> Row:
    row = conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
    if row is None:
        raise NotFound(f"{kind} {key!r} not found")
    return row


def _rollout_row(conn: psycopg.Connection[Row], rollout_id: str, *, lock: bool = False) -> Row:
    # FOR UPDATE holds the row until commit, so a read-modify-write cannot act on a stale status.
    sql = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = %s" + (" FOR UPDATE" if lock else "")
    return _fetch_one(conn, sql, (rollout_id,), "rollout", rollout_id)
