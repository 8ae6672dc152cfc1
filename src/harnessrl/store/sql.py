"""``SQLStore``: the ``Store`` methods both SQL backends share.

SQLite and PostgreSQL run the same statements; they differ only in the parameter placeholder, in
how a transaction takes its locks, and in a few clauses. A backend subclass supplies those:

- ``_read()`` / ``_write()``: context managers giving a connection inside one transaction. A write
  transaction must make its read-modify-write safe against other processes: SQLite takes the
  database's write lock up front (``BEGIN IMMEDIATE``); PostgreSQL locks the rows it reads
  (``ROW_LOCK`` = ``FOR UPDATE``).
- ``PARAM`` (``?`` or ``%s``), ``named(column)`` (``:column`` or ``%(column)s``), ``ROW_LOCK``,
  ``CLAIM_LOCK`` (PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so concurrent claimers skip each other's
  rows), ``NO_LIMIT`` (SQLite needs ``LIMIT -1`` before an ``OFFSET``; PostgreSQL takes NULL), and
  ``_executemany``.

Rows are read by column name (``sqlite3.Row`` and psycopg's ``dict_row`` both allow it); column and
table names in SQL text come from this module and ``codecs`` only, never from callers.

Calls are stored as deltas on earlier calls of their rollout attempt (``chains``): a write picks its
bases from the store's memory of each rollout's chains (``ChainCache``), rebuilt from the attempt's
rows whenever it does not account for the rollout's newest call; reads fold rows back whole.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from harnessrl.errors import BadRequest, Conflict, NotFound, UpstreamError
from harnessrl.schemas import (
    Call,
    Outcome,
    PolicyVersion,
    Rollout,
    RolloutStatus,
    Run,
    Task,
    ToolRequest,
    now,
    status_for_outcome,
)
from harnessrl.store.base import DROPPED_CALLS_KEY, RolloutEnded
from harnessrl.store.chains import (
    AttemptChains,
    ChainCache,
    EncodedItems,
    PackedCall,
    chains_from_rows,
    pack_call,
    place,
)
from harnessrl.store.codecs import (
    ROLLOUT_COLUMNS,
    RolloutUnreadable,
    calls_from_rows,
    check_ints,
    check_keys,
    check_transition,
    dump_json,
    is_storable_key,
    load_json,
    policy_version_from_row,
    rollout_from_row,
    rollout_json,
    rollout_to_row,
    run_from_row,
    sql_where,
    storable_text,
    task_from_row,
)
from harnessrl.store.gate import GateRows

StatusFilter = RolloutStatus | Sequence[RolloutStatus] | None

log = logging.getLogger("harnessrl.store")

#: What a call's write reads of its rollout's row (under the write lock): whether it may take calls.
_TERMINAL = tuple(s.value for s in (RolloutStatus.FINISHED, RolloutStatus.FAILED, RolloutStatus.CANCELLED))


# What rebuilding a rollout attempt's chains reads of its rows.
_CHAIN_ROW_COLUMNS = (
    "rollout_id, seq, prompt_token_ids, prompt_base_seq, prompt_len, response_token_ids, "
    "request, request_key, request_items, request_base_seq, request_base_items"
)


def _check_attempt(row: Any, attempt: int | None) -> None:
    """``RolloutEnded`` when ``attempt`` (the caller's, if it names one) is not the rollout's current
    attempt: a requeue superseded it, and what it reports must not end the attempt after it."""
    if attempt is not None and row["attempt"] != attempt:
        raise RolloutEnded(
            f"rollout {row['rollout_id']!r} attempt {attempt} was superseded (it is at attempt "
            f"{row['attempt']}, {row['status']})"
        )


def _tool_request(row: Any) -> ToolRequest:
    """A ``tool_requests`` row; a ``Conflict`` naming the rollout, attempt and column if it is damaged
    (it raised ``JSONDecodeError``: a 500 on the control API)."""
    fields = {key: row[key] for key in ("rollout_id", "attempt", "tool", "started_at", "finished_at")}
    for column in ("request", "response"):
        try:
            fields[column] = load_json(row[column])
        except (ValueError, RecursionError) as exc:
            raise Conflict(
                f"rollout {row['rollout_id']} attempt {row['attempt']}: a tool request's {column} column "
                f"cannot be read (a damaged row): {type(exc).__name__}: {exc}"[:500]
            ) from exc
    try:
        return ToolRequest(**fields)
    except ValueError as exc:  # pydantic's ValidationError: a column of the wrong type
        raise Conflict(
            f"rollout {row['rollout_id']} attempt {row['attempt']}: a tool request row cannot be read "
            f"(a damaged row): {type(exc).__name__}: {exc}"[:500]
        ) from exc


def new_rollout_key() -> str:
    """A fresh rollout key: one for each attempt of a rollout (``create_rollout``, ``requeue_rollout``)."""
    return "hrl-" + secrets.token_urlsafe(24)


class SQLStore(GateRows):
    PARAM: str
    ROW_LOCK: str
    CLAIM_LOCK: str
    NO_LIMIT: Any
    #: Whether a call's write may read its rollout's row and next ``seq`` in one statement: where the
    #: write transaction holds its lock before its first read (SQLite's ``BEGIN IMMEDIATE``). Not in
    #: PostgreSQL, where one statement would count the calls in a snapshot taken before it waited
    #: for the row lock, and two writers of one rollout would take the same ``seq``.
    SEQ_WITH_LOCK = False
    #: Memory for the chains of recently written rollouts (``chains.ChainCache``), per store.
    CHAIN_CACHE_BYTES = 64 * 2**20

    def __init__(self) -> None:
        self._chains = ChainCache(self.CHAIN_CACHE_BYTES)
        self._insert_sql: dict[tuple[str, tuple[str, ...], str], str] = {}  # (table, columns, conflict)
        self._end_watchers: list[Callable[[str], None]] = []
        self._watchers_lock = threading.Lock()
        # worker id -> the times of its claims whose COMMIT got no answer (``claim_rollouts``)
        self._lost_claims: dict[str, list[float]] = {}
        self._lost_claims_lock = threading.Lock()
        self._last_claim_at = 0.0

    # -- what a backend supplies ------------------------------------------------------------------
    def _read(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _write(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def named(self, column: str) -> str:
        raise NotImplementedError

    def _executemany(self, conn: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def _is_duplicate_call_id(self, exc: Exception) -> bool:
        """Whether ``exc`` (the driver's) says a ``calls`` row with this ``call_id`` exists."""
        raise NotImplementedError

    def _recorded_seqs(self, rollout_id: str, call_ids: Sequence[str]) -> dict[str, int]:
        """After a write of calls raised ``UpstreamError``: the ``seq`` of each of ``call_ids`` that is
        stored all the same (the server committed, but its answer to COMMIT was lost), once the write's
        transaction has ended; ``{}`` when none is, or when that cannot be known. ``rollout_id``: a
        rollout that write locked. This base: ``{}``, for a backend that never raises
        ``UpstreamError`` (SQLite: a COMMIT that raised did not commit)."""
        return {}

    def _recorded_tool_request(self, rollout_id: str, pk: int) -> bool:
        """After ``add_tool_request``'s write raised ``UpstreamError``: whether its row (``pk``, as the
        INSERT returned it) is stored all the same, as ``_recorded_seqs``. This base: False."""
        return False

    # -- runs -------------------------------------------------------------------------------------
    def create_run(self, run_id: str, config: dict[str, Any] | None = None) -> Run:
        check_keys(run_id=run_id)
        run = Run(run_id=run_id, config=config or {})
        p = self.PARAM
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO runs (run_id, config, status, created_at) VALUES ({p}, {p}, {p}, {p}) "
                "ON CONFLICT (run_id) DO NOTHING",
                (run.run_id, dump_json(run.config), run.status, run.created_at),
            )
            return run_from_row(self._run_row(conn, run_id))

    def get_run(self, run_id: str) -> Run:
        with self._read() as conn:
            return run_from_row(self._run_row(conn, run_id))

    def list_runs(self) -> list[Run]:
        with self._read() as conn:
            return [run_from_row(row) for row in conn.execute("SELECT * FROM runs ORDER BY pk")]

    def set_run_status(self, run_id: str, status: str) -> None:
        check_keys(run_id=run_id, status=status)
        p = self.PARAM
        with self._write() as conn:
            if (
                conn.execute(f"UPDATE runs SET status = {p} WHERE run_id = {p}", (status, run_id)).rowcount
                == 0
            ):
                raise NotFound(f"run {run_id!r} not found")

    # -- tasks ------------------------------------------------------------------------------------
    def add_tasks(self, tasks: Sequence[Task]) -> None:
        if not tasks:
            return
        for t in tasks:
            check_keys(task_id=t.task_id, run_id=t.run_id, split=t.split)
        p = self.PARAM
        with self._write() as conn:
            self._executemany(
                conn,
                f"INSERT INTO tasks (task_id, run_id, split, data) VALUES ({p}, {p}, {p}, {p}) "
                "ON CONFLICT (task_id) DO NOTHING",
                [(t.task_id, t.run_id, t.split, dump_json(t.data)) for t in tasks],
            )

    def get_task(self, task_id: str) -> Task:
        with self._read() as conn:
            sql = f"SELECT * FROM tasks WHERE task_id = {self.PARAM}"
            return task_from_row(self._fetch_one(conn, sql, (task_id,), "task", task_id))

    def list_tasks(self, run_id: str | None = None, split: str | None = None) -> list[Task]:
        where, params = sql_where(self.PARAM, run_id=run_id, split=split)
        with self._read() as conn:
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
        check_keys(rollout_id=rollout_id, run_id=run_id, task_id=task_id, group_id=group_id)
        check_ints(step=step)
        rollout = Rollout(
            rollout_id=rollout_id or uuid.uuid4().hex,
            api_key=new_rollout_key(),
            run_id=run_id,
            task_id=task_id,
            task=task or {},
            group_id=group_id,
            step=step,
            metadata=metadata or {},
        )
        with self._write() as conn:
            # ON CONFLICT DO NOTHING makes a repeated create (a retried HTTP request, or a
            # concurrent one) a no-op, so the caller gets back the key the first create issued.
            self._insert(conn, "rollouts", rollout_to_row(rollout), "ON CONFLICT (rollout_id) DO NOTHING")
            return rollout_from_row(self._rollout_row(conn, rollout.rollout_id))

    def get_rollout(self, rollout_id: str) -> Rollout:
        with self._read() as conn:
            return rollout_from_row(self._rollout_row(conn, rollout_id, lock=False))

    def get_rollout_by_key(self, api_key: str) -> Rollout:
        if not is_storable_key(api_key):  # no key holds such text (and the drivers could not send it)
            raise NotFound("no rollout has this api key")
        with self._read() as conn:
            row = conn.execute(self._rollout_by_key_sql(), (api_key,)).fetchone()
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
        for name, value in (("limit", limit), ("offset", offset)):  # SQLite would take -1 for "none"
            if value is not None and value < 0:
                raise BadRequest(f"{name} must be a number >= 0, got {value}", param=name)
            check_ints(**{name: value})
        p = self.PARAM
        where, params = sql_where(p, run_id=run_id, status=status, step=step, group_id=group_id)
        params += [self.NO_LIMIT if limit is None else limit, offset]
        sql = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts{where} ORDER BY pk LIMIT {p} OFFSET {p}"
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        # One damaged row (``RolloutUnreadable``) must not hide every other: it is left out and
        # logged; ``get_rollout`` of its id raises, naming the damage.
        rollouts = []
        for row in rows:
            try:
                rollouts.append(rollout_from_row(row))
            except RolloutUnreadable as exc:
                log.warning("%s: left out of the listing", exc)
        return rollouts

    def count_rollouts(
        self, *, run_id: str | None = None, status: StatusFilter = None, step: int | None = None
    ) -> int:
        where, params = sql_where(self.PARAM, run_id=run_id, status=status, step=step)
        with self._read() as conn:
            return self._scalar(conn, f"SELECT COUNT(*) AS n FROM rollouts{where}", params)

    #: Claims whose COMMIT got no answer remembered per worker (``claim_rollouts``), newest kept.
    LOST_CLAIMS_KEPT = 16

    def claim_rollouts(self, worker_id: str, limit: int, *, run_id: str | None = None) -> list[Rollout]:
        """``Store.claim_rollouts``. A claim whose connection broke at its COMMIT (PostgreSQL) may have
        been committed all the same: its rollouts would stay running for this worker with nothing
        running them. Such a claim raises ``UpstreamError`` as any other, and this worker's next claim
        hands its rollouts out first (found by the claim's time, which every row it took holds)."""
        if limit <= 0:
            return []
        check_keys(worker_id=worker_id, run_id=run_id)
        check_ints(limit=limit)
        claimed_at = self._claim_time()
        lost = self._take_lost_claims(worker_id)
        claimed: list[Rollout] = []
        damaged: list[str] = []
        committing = False
        try:
            with self._write() as conn:
                rows = self._reclaim(conn, worker_id, lost, claimed_at, limit)
                reclaimed = len(rows)
                if reclaimed < limit:
                    rows += self._claim_queued(conn, worker_id, limit - reclaimed, claimed_at, run_id)
                # RETURNING gives no order guarantee; the contract is oldest first.
                for row in sorted(rows, key=lambda row: row["pk"]):
                    try:
                        claimed.append(rollout_from_row(row))
                    except RolloutUnreadable as exc:
                        # No harness can run a rollout whose row cannot be read: it ends as an
                        # infrastructure failure naming the damage, in this transaction, so the rest
                        # of the claim is handed out and the next claim does not take it again.
                        log.warning("%s: it fails instead of being claimed", exc)
                        self._fail_damaged(conn, row["pk"], exc)
                        damaged.append(row["rollout_id"])
                committing = True
        except BaseException as exc:
            # Only a COMMIT can have been carried out unanswered: a transaction that broke before it
            # is rolled back by the server. The lost claims not handed out are looked for again.
            unanswered = committing and isinstance(exc, UpstreamError)
            self._remember_lost_claims(worker_id, [*lost, claimed_at] if unanswered else lost)
            raise
        if lost and reclaimed == limit:  # the lost claims may hold more: looked for again next time
            self._remember_lost_claims(worker_id, lost)
        for rollout_id in damaged:
            self._announce_end(rollout_id)
        return claimed

    def _claim_queued(
        self, conn: Any, worker_id: str, limit: int, claimed_at: float, run_id: str | None
    ) -> list[Any]:
        """Up to ``limit`` queued rollouts (oldest first, of ``run_id`` if given) made running for
        ``worker_id`` at ``claimed_at``; their rows."""
        p = self.PARAM
        run_filter = "" if run_id is None else f" AND run_id = {p}"
        params: list[Any] = [worker_id, claimed_at, *([] if run_id is None else [run_id]), limit]
        return conn.execute(
            f"UPDATE rollouts SET status = 'running', worker_id = {p}, started_at = {p} WHERE pk IN "
            f"(SELECT pk FROM rollouts WHERE status = 'queued'{run_filter} ORDER BY pk LIMIT {p}"
            f"{self.CLAIM_LOCK}) RETURNING {ROLLOUT_COLUMNS}",
            params,
        ).fetchall()

    def _reclaim(
        self, conn: Any, worker_id: str, lost: Sequence[float], claimed_at: float, limit: int
    ) -> list[Any]:
        """The rows (up to ``limit``, oldest first) that this worker's claims at the times ``lost``
        made running although their COMMIT got no answer, still running for it: claimed again now."""
        if not lost:
            return []
        p = self.PARAM
        times = ", ".join([p] * len(lost))
        return conn.execute(
            f"UPDATE rollouts SET started_at = {p} WHERE pk IN (SELECT pk FROM rollouts WHERE "
            f"worker_id = {p} AND status = 'running' AND started_at IN ({times}) ORDER BY pk LIMIT {p}"
            f"{self.ROW_LOCK}) RETURNING {ROLLOUT_COLUMNS}",
            [claimed_at, worker_id, *lost, limit],
        ).fetchall()

    def _claim_time(self) -> float:
        """Now, later than every earlier claim through this store: a claim's time names its rows
        (``_reclaim``), so two claims (two threads) must never share one."""
        with self._lost_claims_lock:
            self._last_claim_at = max(now(), self._last_claim_at + 1e-6)
            return self._last_claim_at

    def _take_lost_claims(self, worker_id: str) -> list[float]:
        with self._lost_claims_lock:
            return self._lost_claims.pop(worker_id, [])

    def _remember_lost_claims(self, worker_id: str, times: Sequence[float]) -> None:
        if not times:
            return
        with self._lost_claims_lock:
            kept = [*self._lost_claims.get(worker_id, []), *times]
            self._lost_claims[worker_id] = kept[-self.LOST_CLAIMS_KEPT :]

    def fail_unreadable_rollout(self, rollout_id: str, *, attempt: int | None = None) -> bool:
        """End a queued or running rollout whose row cannot be read (``RolloutUnreadable``) as an
        infrastructure failure: status ``failed``, outcome ``infra_failure``, no worker, the damage as
        its ``error`` (as ``claim_rollouts`` ends one). The one end such a row can take: every other
        write merges into a JSON column or returns the row, and raises. This one writes plain columns
        only and decodes nothing it writes, so the damaged columns stay as they are.

        Whether it ended the rollout: False, and nothing written, for a row that reads whole (end it
        the usual way), one that already ended, or one no longer at ``attempt`` (a requeue superseded
        it). ``NotFound`` for an unknown id."""
        with self._write() as conn:
            row = self._rollout_row(conn, rollout_id)
            if row["status"] in _TERMINAL or (attempt is not None and row["attempt"] != attempt):
                return False
            try:
                rollout_from_row(row)
            except RolloutUnreadable as exc:
                log.warning("%s: it ends failed (infra_failure)", exc)
                self._fail_damaged(conn, row["pk"], exc)
            else:
                return False
        self._announce_end(rollout_id)
        return True

    def _fail_damaged(self, conn: Any, pk: int, damage: RolloutUnreadable) -> None:
        """In ``conn``'s write: the rollout row ``pk`` ends failed (``infra_failure``) naming ``damage``."""
        p = self.PARAM
        conn.execute(
            f"UPDATE rollouts SET status = {p}, outcome = {p}, worker_id = NULL, "
            f"finished_at = {p}, error = {p} WHERE pk = {p}",
            [RolloutStatus.FAILED.value, Outcome.INFRA_FAILURE.value, now(), storable_text(str(damage)), pk],
        )

    def start_rollout(self, rollout_id: str, *, attempt: int | None = None) -> Rollout:
        with self._write() as conn:
            row = self._rollout_row(conn, rollout_id)
            _check_attempt(row, attempt)
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
        attempt: int | None = None,
    ) -> Rollout:
        outcome = Outcome(outcome)
        status = status_for_outcome(outcome)
        if not math.isfinite(reward):  # as the control API refuses it; SQLite would store NaN as NULL
            raise BadRequest(f"reward must be a finite number, got {reward!r}")
        with self._write() as conn:
            row = self._rollout_row(conn, rollout_id)
            _check_attempt(row, attempt)
            check_transition(row, status)
            changes: dict[str, Any] = {
                "status": status.value,
                "outcome": outcome.value,
                "reward": float(reward),
                "finished_at": now(),
                "metadata": dump_json({**rollout_json(row, "metadata"), **(metadata or {})}),
            }
            if error is not None:
                changes["error"] = storable_text(error)
            ended = self._update(conn, rollout_id, **changes)
        self._announce_end(rollout_id)
        return ended

    def void_rollout(
        self, rollout_id: str, *, flag: str, error: str, metadata: dict[str, Any] | None = None
    ) -> Rollout:
        with self._write() as conn:
            row = self._rollout_row(conn, rollout_id)
            flags = rollout_json(row, "flags")
            changes: dict[str, Any] = {}
            if metadata is not None:
                changes["metadata"] = dump_json(metadata)
            voided = self._update(
                conn,
                rollout_id,
                status=RolloutStatus.FINISHED.value,
                outcome=Outcome.POLICY_FAILURE.value,
                reward=0.0,
                error=storable_text(error),
                flags=dump_json([*flags, flag] if flag not in flags else flags),
                **changes,
            )
        self._announce_end(rollout_id)
        return voided

    def requeue_rollout(
        self, rollout_id: str, *, error: str | None = None, attempt: int | None = None
    ) -> Rollout:
        with self._write() as conn:
            row = self._rollout_row(conn, rollout_id)
            _check_attempt(row, attempt)
            check_transition(row, RolloutStatus.QUEUED)
            changes: dict[str, Any] = {
                "status": RolloutStatus.QUEUED.value,
                "attempt": row["attempt"] + 1,
                "worker_id": None,
                # A key opens one attempt: the harness of the attempt that ended (a pod that outlived
                # its controller, a process a restarted trainer never saw) is refused from now on,
                # instead of starting the queued rollout under the new attempt with no worker to run it.
                "api_key": new_rollout_key(),
            }
            if error is not None:
                changes["error"] = storable_text(error)
            requeued = self._update(conn, rollout_id, **changes)
        self._announce_end(rollout_id)  # the attempt ended: its calls in flight will not be recorded
        return requeued

    def cancel_rollout(self, rollout_id: str, *, attempt: int | None = None) -> Rollout:
        with self._write() as conn:
            row = self._rollout_row(conn, rollout_id)
            _check_attempt(row, attempt)
            check_transition(row, RolloutStatus.CANCELLED)
            cancelled = self._update(
                conn, rollout_id, status=RolloutStatus.CANCELLED.value, finished_at=now()
            )
        self._announce_end(rollout_id)
        return cancelled

    def watch_rollout_ends(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(rollout_id)`` after each commit that ends a rollout or one of its attempts
        (finish, cancel, requeue) made through this store object; returns the function that stops it.

        In-process only: a gateway sharing this object with the controller (``local_stack``) cancels
        the calls still generating for the rollout at once. Writes by other processes are not seen;
        ``add_call`` refuses their late calls all the same (``RolloutEnded``). Callbacks run on the
        writer's thread and must not block; one that raises is logged and skipped.
        """
        with self._watchers_lock:
            self._end_watchers.append(callback)

        def stop() -> None:
            with self._watchers_lock:
                if callback in self._end_watchers:
                    self._end_watchers.remove(callback)

        return stop

    def _announce_end(self, rollout_id: str) -> None:
        with self._watchers_lock:
            watchers = list(self._end_watchers)
        for callback in watchers:
            try:
                callback(rollout_id)
            except Exception:  # noqa: BLE001 - a watcher's failure must not fail the committed write
                log.exception("a rollout-end watcher failed for rollout %s", rollout_id)

    def count_dropped_call(self, rollout_id: str, reason: str) -> Rollout:
        with self._write() as conn:
            metadata = rollout_json(self._rollout_row(conn, rollout_id), "metadata")
            counts = metadata.get(DROPPED_CALLS_KEY)
            counts = dict(counts) if isinstance(counts, dict) else {}
            counts[reason] = int(counts.get(reason, 0)) + 1
            metadata[DROPPED_CALLS_KEY] = counts
            return self._update(conn, rollout_id, metadata=dump_json(metadata))

    def set_rollout_flags(self, rollout_id: str, flags: Sequence[str]) -> None:
        check_keys(rollout_id=rollout_id)
        p = self.PARAM
        with self._write() as conn:
            sql = f"UPDATE rollouts SET flags = {p} WHERE rollout_id = {p}"
            if conn.execute(sql, (dump_json(list(flags)), rollout_id)).rowcount == 0:
                raise NotFound(f"rollout {rollout_id!r} not found")

    def update_rollout_metadata(self, rollout_id: str, metadata: dict[str, Any]) -> Rollout:
        with self._write() as conn:
            merged = {**rollout_json(self._rollout_row(conn, rollout_id), "metadata"), **metadata}
            return self._update(conn, rollout_id, metadata=dump_json(merged))

    # -- calls ------------------------------------------------------------------------------------
    def add_call(self, call: Call, encoded: EncodedItems | None = None) -> Call:
        packed = pack_call(call, encoded)  # before the transaction: packing is the slow part
        return self._add_packed(call, packed, self._write())

    def _add_packed(self, call: Call, packed: PackedCall, transaction: AbstractContextManager[Any]) -> Call:
        """Write one packed call in ``transaction`` (its connection, committed when the block ends)."""
        written: dict[str, AttemptChains] = {}
        try:
            with transaction as conn:
                row = self._add_call_row(conn, packed, written)
        except UpstreamError:
            # The connection broke around the COMMIT: a call the server recorded is returned, so the
            # gateway answers it (an error would leave a recorded call no harness received).
            call_id = packed.columns["call_id"]
            seqs = self._recorded_seqs(packed.columns["rollout_id"], [call_id])
            if call_id not in seqs:
                raise
            row = {"seq": seqs[call_id], "call_id": call_id}
        self._chains.put(written)  # committed: these rows may now be bases
        return call.model_copy(update={"seq": row["seq"], "call_id": row["call_id"]})

    def add_calls(
        self, calls: Sequence[Call], encoded: Sequence[EncodedItems | None] | None = None
    ) -> list[Call | Exception]:
        """``add_call`` for several calls in one transaction (group commit); one result per call.

        A call that cannot be added (unknown rollout, token ids past int32) gets its exception in
        its place and is rolled back alone (a savepoint); the others are committed. If the commit
        itself fails, it raises: then none was added (a connection that broke after the server
        committed is no failure: the calls are returned as stored). Calls of one rollout get consecutive ``seq``
        numbers in list order (a later one may be stored on an earlier one). Rows are locked in
        rollout-id order, so two writers' batches (several gateways on one PostgreSQL) cannot
        deadlock on each other's rollout locks.
        """
        results: list[Call | Exception] = []
        packed: list[PackedCall | None] = []
        hints = encoded if encoded is not None else [None] * len(calls)
        for call, hint in zip(calls, hints, strict=True):  # encode outside the transaction, as add_call does
            try:
                packed.append(pack_call(call, hint))
                results.append(call)
            except Exception as exc:  # noqa: BLE001 - this call's own failure, reported in its place
                packed.append(None)
                results.append(exc)
        by_rollout = sorted(range(len(calls)), key=lambda i: calls[i].rollout_id)  # stable
        written: dict[str, AttemptChains] = {}
        try:
            self._write_batch(calls, packed, by_rollout, results, written)
        except UpstreamError:
            if not self._recover_batch(calls, packed, results):  # as ``_add_packed``
                raise
        self._chains.put(written)
        return results

    def _write_batch(
        self,
        calls: Sequence[Call],
        packed: Sequence[PackedCall | None],
        order: Sequence[int],
        results: list[Call | Exception],
        written: dict[str, AttemptChains],
    ) -> None:
        """``add_calls``' transaction: each packed call in ``order`` under its own savepoint, its
        result (stored call or exception) put in ``results``."""
        with self._write() as conn:
            for i in order:
                call, one = calls[i], packed[i]
                if one is None:
                    continue
                conn.execute("SAVEPOINT harnessrl_call")
                try:
                    row = self._add_call_row(conn, one, written)
                except Exception as exc:  # noqa: BLE001 - as above
                    conn.execute("ROLLBACK TO SAVEPOINT harnessrl_call")
                    results[i] = exc
                else:
                    results[i] = call.model_copy(update={"seq": row["seq"], "call_id": row["call_id"]})
                conn.execute("RELEASE SAVEPOINT harnessrl_call")

    def _recover_batch(
        self, calls: Sequence[Call], packed: Sequence[PackedCall | None], results: list[Call | Exception]
    ) -> bool:
        """After ``add_calls``' transaction raised ``UpstreamError``: whether it committed all the same
        (its calls then in ``results`` with their stored ``seq``; one transaction: all or none)."""
        ids = {
            i: one.columns["call_id"]
            for i, one in enumerate(packed)
            if one is not None and not isinstance(results[i], Exception)
        }
        if not ids:
            return False
        locked = packed[next(iter(ids))]
        assert locked is not None
        seqs = self._recorded_seqs(locked.columns["rollout_id"], list(ids.values()))
        if not seqs:
            return False
        for i, call_id in ids.items():
            if call_id in seqs:
                results[i] = calls[i].model_copy(update={"seq": seqs[call_id], "call_id": call_id})
            else:  # not reached before the commit failed: so it was not committed either
                results[i] = UpstreamError(f"call {call_id!r} was not recorded: the store's connection broke")
        return True

    def _add_call_row(
        self, conn: Any, packed: PackedCall, written: dict[str, AttemptChains]
    ) -> dict[str, Any]:
        """Insert one packed call inside a write transaction; returns its row (``seq`` set).

        ``written``: the chains this transaction left per rollout (read before the cache, updated
        only once the row is in), for the cache once the transaction commits.
        """
        p = self.PARAM
        rollout_id, attempt = packed.columns["rollout_id"], packed.columns["attempt"]
        # The write transaction (SQLite: the database lock; PostgreSQL: the rollout's row lock)
        # serializes this rollout's writers until commit, so MAX(seq) counts the previous call
        # and a rollout's calls get 0, 1, 2, ... in commit order, whichever process wrote them.
        next_seq = f"SELECT COALESCE(MAX(seq) + 1, 0) AS n FROM calls WHERE rollout_id = {p}"
        if self.SEQ_WITH_LOCK:  # one statement: the rollout's row (none: no such rollout) and its next seq
            locked = f"SELECT ({next_seq}) AS n, status, attempt FROM rollouts WHERE rollout_id = {p}"
            row = conn.execute(locked, (rollout_id, rollout_id)).fetchone()
        else:
            locked = f"SELECT status, attempt FROM rollouts WHERE rollout_id = {p}{self.ROW_LOCK}"
            row = conn.execute(locked, (rollout_id,)).fetchone()
        if row is None:
            raise NotFound(f"rollout {rollout_id!r} not found")
        # Read under the same lock as the finish that ends the rollout: a call is either recorded
        # before the end (and read by whoever ends it after) or refused, never recorded after it.
        if row["status"] in _TERMINAL or attempt < row["attempt"]:
            raise RolloutEnded(
                f"rollout {rollout_id!r} attempt {attempt} has ended ({row['status']}, attempt "
                f"{row['attempt']}); it takes no more calls"
            )
        seq = row["n"] if self.SEQ_WITH_LOCK else self._scalar(conn, next_seq, (rollout_id,))
        chains = written.get(rollout_id) or self._chains.get(rollout_id)
        if seq == 0:  # the rollout's first call: nothing to be stored on
            chains = AttemptChains(attempt, -1)
        elif chains is None or not chains.continues(attempt, seq):
            chains = self._load_chains(conn, rollout_id, attempt, seq)
        row, after = place(packed, seq, chains)
        try:
            self._insert(conn, "calls", row)
        except Exception as exc:
            if self._is_duplicate_call_id(exc):  # the driver's own error, alike on every backend
                raise Conflict(
                    f"call_id {row['call_id']!r} is already recorded: a call is added once"
                ) from exc
            raise
        written[rollout_id] = after
        return row

    def _load_chains(self, conn: Any, rollout_id: str, attempt: int, seq: int) -> AttemptChains:
        """The attempt's chains from its rows (all before ``seq``: the rollout is locked)."""
        p = self.PARAM
        rows = conn.execute(
            f"SELECT {_CHAIN_ROW_COLUMNS} FROM calls WHERE rollout_id = {p} AND attempt = {p} ORDER BY seq",
            (rollout_id, attempt),
        )
        return chains_from_rows(rows, attempt, seq - 1)

    def list_calls(self, rollout_id: str, *, attempt: int | None = None) -> list[Call]:
        where, params = sql_where(self.PARAM, rollout_id=rollout_id, attempt=attempt)
        with self._read() as conn:
            rows = conn.execute(f"SELECT * FROM calls{where} ORDER BY seq", params).fetchall()
        return calls_from_rows(rows)  # one pass: a row's bases are earlier rows of its attempt

    def count_calls(self, rollout_id: str | None = None) -> int:
        where, params = sql_where(self.PARAM, rollout_id=rollout_id)
        with self._read() as conn:
            return self._scalar(conn, f"SELECT COUNT(*) AS n FROM calls{where}", params)

    # -- policy versions --------------------------------------------------------------------------
    def add_policy_version(self, version: PolicyVersion) -> None:
        check_keys(checkpoint=version.checkpoint)
        check_ints(version=version.version, step=version.step)
        with self._write() as conn:
            row = {**version.model_dump(), "metadata": dump_json(version.metadata)}
            upsert = ", ".join(f"{column} = excluded.{column}" for column in row if column != "version")
            self._insert(conn, "policy_versions", row, f"ON CONFLICT (version) DO UPDATE SET {upsert}")

    def latest_policy_version(self) -> PolicyVersion | None:
        with self._read() as conn:
            row = conn.execute("SELECT * FROM policy_versions ORDER BY version DESC LIMIT 1").fetchone()
        return None if row is None else policy_version_from_row(row)

    def list_policy_versions(self) -> list[PolicyVersion]:
        with self._read() as conn:
            return [
                policy_version_from_row(row)
                for row in conn.execute("SELECT * FROM policy_versions ORDER BY version")
            ]

    # -- tool requests ----------------------------------------------------------------------------
    def add_tool_request(self, request: ToolRequest) -> None:
        """As ``add_call``: ``RolloutEnded`` if the rollout ended or ``request.attempt`` is older than
        its attempt, decided under the lock the ending write takes (a search still running when its
        rollout ended is refused, never recorded after the end); ``NotFound`` for an unknown rollout."""
        check_keys(rollout_id=request.rollout_id, tool=request.tool)
        check_ints(attempt=request.attempt)
        row = request.model_dump()
        row["request"], row["response"] = dump_json(request.request), dump_json(request.response)
        inserted: list[int] = []  # the row's pk, known before the COMMIT whose answer may be lost
        try:
            with self._write() as conn:
                # SQLite: the write transaction holds the database lock; PostgreSQL: the row lock, to commit.
                sql = f"SELECT status, attempt FROM rollouts WHERE rollout_id = {self.PARAM}{self.ROW_LOCK}"
                rollout = self._fetch_one(conn, sql, (request.rollout_id,), "rollout", request.rollout_id)
                if rollout["status"] in _TERMINAL or request.attempt < rollout["attempt"]:
                    raise RolloutEnded(
                        f"rollout {request.rollout_id!r} attempt {request.attempt} has ended "
                        f"({rollout['status']}, attempt {rollout['attempt']}); it takes no more tool requests"
                    )
                inserted.append(self._insert(conn, "tool_requests", row, "RETURNING pk").fetchone()["pk"])
        except UpstreamError:
            # As ``_add_packed``: a request the server recorded is no failure. Raising would make the
            # search answer an error for a stored search, which the attempt's next search then finds
            # counted against ``retrieval.max_searches_per_rollout`` beside its own.
            if not inserted or not self._recorded_tool_request(request.rollout_id, inserted[0]):
                raise

    def list_tool_requests(self, rollout_id: str, *, attempt: int | None = None) -> list[ToolRequest]:
        where, params = sql_where(self.PARAM, rollout_id=rollout_id, attempt=attempt)
        with self._read() as conn:
            rows = conn.execute(f"SELECT * FROM tool_requests{where} ORDER BY pk", params).fetchall()
        return [_tool_request(row) for row in rows]

    def count_tool_requests(self, rollout_id: str, *, attempt: int | None = None) -> int:
        where, params = sql_where(self.PARAM, rollout_id=rollout_id, attempt=attempt)
        with self._read() as conn:
            return int(conn.execute(f"SELECT COUNT(*) AS n FROM tool_requests{where}", params).fetchone()["n"])

    # -- helpers ----------------------------------------------------------------------------------
    def _insert(self, conn: Any, table: str, row: dict[str, Any], conflict: str = "") -> Any:
        """INSERT ``row``; returns the cursor (``conflict``: a clause after VALUES, e.g. RETURNING)."""
        key = (table, tuple(row), conflict)
        sql = self._insert_sql.get(key)
        if sql is None:  # every call writes a row: its statement's text is made once per column set
            columns = ", ".join(row)
            placeholders = ", ".join(self.named(column) for column in row)
            sql = self._insert_sql[key] = (
                f"INSERT INTO {table} ({columns}) VALUES ({placeholders}) {conflict}"
            )
        return conn.execute(sql, row)

    def _update(self, conn: Any, rollout_id: str, **changes: Any) -> Rollout:
        p = self.PARAM
        assignments = ", ".join(f"{column} = {p}" for column in changes)
        row = conn.execute(
            f"UPDATE rollouts SET {assignments} WHERE rollout_id = {p} RETURNING {ROLLOUT_COLUMNS}",
            [*changes.values(), rollout_id],
        ).fetchone()
        assert row is not None  # callers read the row in this transaction
        return rollout_from_row(row)

    @staticmethod
    def _scalar(conn: Any, sql: str, params: Sequence[Any]) -> int:
        row = conn.execute(sql, params).fetchone()
        assert row is not None
        return row["n"]

    @staticmethod
    def _fetch_one(conn: Any, sql: str, params: tuple[Any, ...], kind: str, key: str) -> Any:
        check_keys(**{f"{kind}_id": key})
        row = conn.execute(sql, params).fetchone()
        if row is None:
            raise NotFound(f"{kind} {key!r} not found")
        return row

    def _run_row(self, conn: Any, run_id: str) -> Any:
        sql = f"SELECT * FROM runs WHERE run_id = {self.PARAM}"
        return self._fetch_one(conn, sql, (run_id,), "run", run_id)

    def _rollout_by_key_sql(self) -> str:
        return f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE api_key = {self.PARAM}"

    def _rollout_row(self, conn: Any, rollout_id: str, *, lock: bool = True) -> Any:
        # Inside a write, the row lock (PostgreSQL) holds the row until commit, so a
        # read-modify-write cannot act on a stale status.
        sql = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = {self.PARAM}"
        return self._fetch_one(
            conn, sql + (self.ROW_LOCK if lock else ""), (rollout_id,), "rollout", rollout_id
        )
