"""``DashboardData``: the dashboard's read-only queries on a run's SQLite store.

The dashboard never writes: it opens the store file with ``mode=ro`` (a fresh connection per query,
so threads never share one), and pages the rollouts table with SQL ``LIMIT``/``OFFSET`` plus one
aggregate query over the page's calls, so a page costs the same with 100 or 100k rollouts. Filters
the ``Store`` protocol lacks (outcome, flagged) and per-rollout call statistics need SQL, which is
why this module reads the SQLite schema directly instead of going through ``Store``. Calls are
stored as deltas on earlier calls (``store.chains``): they are decoded with ``codecs.calls_from_rows``,
a whole rollout at a time, and a store of an older schema (which only a read-write open migrates)
is refused with a message rather than misread.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.errors import ConfigError, NotFound
from harnessrl.schemas import Call, Rollout, Run, ToolRequest
from harnessrl.store.codecs import calls_from_rows, rollout_from_row, run_from_row
from harnessrl.store.migrations import SCHEMA_VERSION

_ROLLOUT_COLUMNS = (
    "pk, rollout_id, api_key, run_id, task_id, task, group_id, step, status, outcome, reward, attempt, "
    "worker_id, error, flags, metadata, created_at, started_at, finished_at"
)


@dataclass(frozen=True, slots=True)
class RolloutFilter:
    """The rollouts table's filters; ``None`` (or ``False`` for ``flagged``) means no filter."""

    run_id: str | None = None
    status: str | None = None
    outcome: str | None = None
    step: int | None = None
    group_id: str | None = None
    flagged: bool = False
    flag: str | None = None  # one audit rule: the rollouts it flagged
    kind: str | None = None  # "train" or "eval" (held-out): the trainer's metadata["kind"]
    result: str | None = None  # "solved" (reward >= 1), "partial", "unsolved" (reward <= 0)
    order: str = "newest"  # one of ORDERS

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for column in ("run_id", "status", "outcome", "group_id"):
            value = getattr(self, column)
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if self.step is not None:
            # A step past SQLite's 64-bit integers cannot be bound (OverflowError) and no stored
            # step equals it: the filter matches nothing, as any other step no rollout has does.
            in_range = _SQLITE_MIN_INT <= self.step <= _SQLITE_MAX_INT
            clauses.append("step = ?" if in_range else "0")
            params += [self.step] if in_range else []
        if self.flagged:
            clauses.append("flags != '[]'")
        if self.flag is not None:
            clauses.append("EXISTS (SELECT 1 FROM json_each(flags) WHERE json_each.value = ?)")
            params.append(self.flag)
        if self.kind is not None:
            clauses.append("json_extract(metadata, '$.kind') = ?")
            params.append(self.kind)
        if self.result in RESULTS:
            clauses.append(RESULTS[self.result])
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params

    def order_by(self) -> str:
        return ORDERS.get(self.order, ORDERS["newest"])


#: SQLite's INTEGER range (64-bit signed).
_SQLITE_MIN_INT, _SQLITE_MAX_INT = -(2**63), 2**63 - 1
#: The table's result filter, by reward (what a badge shows), as SQL.
RESULTS = {"solved": "reward >= 1", "partial": "reward > 0 AND reward < 1", "unsolved": "reward <= 0"}
#: The table's sort orders (created: the store's insertion order, which is creation order);
#: rollouts without a reward, or not finished (no duration), sort last.
_DURATION = "(finished_at - started_at)"
ORDERS = {
    "newest": "pk DESC",
    "oldest": "pk",
    "reward_desc": "reward IS NULL, reward DESC, pk DESC",
    "reward_asc": "reward IS NULL, reward ASC, pk DESC",
    "duration_desc": f"{_DURATION} IS NULL, {_DURATION} DESC, pk DESC",
    "duration_asc": f"{_DURATION} IS NULL, {_DURATION} ASC, pk DESC",
}


@dataclass(slots=True)
class RolloutRow:
    """One line of the rollouts table: the rollout plus statistics over its calls."""

    rollout: Rollout
    calls: int = 0
    prompt_tokens: int = 0  # tokens of the last call's prompt (the context the harness built)
    sampled_tokens: int = 0  # tokens the policy sampled over all calls
    policy_versions: list[int] = field(default_factory=list)
    samples: int = 0  # filled by the caller, which builds samples from the calls

    @property
    def duration_s(self) -> float | None:
        r = self.rollout
        return None if r.started_at is None or r.finished_at is None else r.finished_at - r.started_at


class DashboardData:
    """Read-only access to one SQLite store file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise NotFound(f"store file {str(self.path)!r} does not exist")
        found = self.schema_version()
        if found < SCHEMA_VERSION:
            raise ConfigError(
                f"store {str(self.path)!r} has schema version {found}, this dashboard reads {SCHEMA_VERSION}; "
                "the dashboard opens stores read-only, so migrate it once: python -c "
                f"\"from harnessrl.store.sqlite import SQLiteStore; SQLiteStore('{self.path}').close()\""
            )

    def schema_version(self) -> int:
        with self._connect() as conn:
            try:
                row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            except sqlite3.OperationalError:  # no meta table: an empty or pre-versioning file
                return 0
        return 0 if row is None else int(row[0])

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout = 5000")
        try:
            yield conn
        finally:
            conn.close()

    # -- runs ---------------------------------------------------------------------------------------
    def list_runs(self) -> list[Run]:
        with self._connect() as conn:
            return [run_from_row(row) for row in conn.execute("SELECT * FROM runs ORDER BY pk")]

    def get_run(self, run_id: str) -> Run:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"run {run_id!r} not found")
        return run_from_row(row)

    def run_counts(self, run_id: str) -> dict[str, int]:
        """Rollouts of a run by status."""
        sql = "SELECT status, COUNT(*) FROM rollouts WHERE run_id = ? GROUP BY status"
        with self._connect() as conn:
            return {status: n for status, n in conn.execute(sql, (run_id,))}

    # -- rollouts -----------------------------------------------------------------------------------
    def count_rollouts(self, filters: RolloutFilter) -> int:
        where, params = filters.where()
        with self._connect() as conn:
            return conn.execute(f"SELECT COUNT(*) FROM rollouts{where}", params).fetchone()[0]

    def page_rollouts(self, filters: RolloutFilter, *, limit: int, offset: int) -> list[RolloutRow]:
        """One page of rollouts (``filters.order``: newest first by default) with their call statistics."""
        where, params = filters.where()
        sql = f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts{where} ORDER BY {filters.order_by()} LIMIT ? OFFSET ?"
        with self._connect() as conn:
            rows = [RolloutRow(rollout_from_row(row)) for row in conn.execute(sql, [*params, limit, offset])]
            if rows:
                self._add_call_stats(conn, rows)
        return rows

    @staticmethod
    def _add_call_stats(conn: sqlite3.Connection, rows: list[RolloutRow]) -> None:
        by_id = {row.rollout.rollout_id: row for row in rows}
        marks = ", ".join("?" * len(by_id))
        # Token counts without decoding: response blobs are whole (int32 each), and a prompt (a
        # delta on an earlier call) has its whole length in prompt_len.
        sql = (
            "SELECT rollout_id, COUNT(*) AS n, SUM(LENGTH(response_token_ids)) / 4 AS sampled, "
            "GROUP_CONCAT(DISTINCT policy_version) AS versions, "
            "(SELECT c2.prompt_len FROM calls c2 WHERE c2.rollout_id = calls.rollout_id "
            " ORDER BY c2.seq DESC LIMIT 1) AS last_prompt "
            f"FROM calls WHERE rollout_id IN ({marks}) GROUP BY rollout_id"
        )
        for rec in conn.execute(sql, list(by_id)):
            row = by_id[rec["rollout_id"]]
            row.calls, row.sampled_tokens = rec["n"], rec["sampled"] or 0
            row.prompt_tokens = rec["last_prompt"] or 0
            row.policy_versions = sorted(int(v) for v in str(rec["versions"] or "").split(",") if v)

    def list_flags(self) -> list[str]:
        """The audit rules that flagged at least one rollout (the table's flag filter offers these)."""
        sql = (
            "SELECT DISTINCT json_each.value FROM rollouts, json_each(rollouts.flags) "
            "WHERE rollouts.flags != '[]' ORDER BY 1"
        )
        with self._connect() as conn:
            return [row[0] for row in conn.execute(sql)]

    def get_rollout(self, rollout_id: str) -> Rollout:
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (rollout_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"rollout {rollout_id!r} not found")
        return rollout_from_row(row)

    def list_calls(self, rollout_id: str) -> list[Call]:
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM calls WHERE rollout_id = ? ORDER BY seq", (rollout_id,))
            return calls_from_rows(rows.fetchall())

    def list_tool_requests(self, rollout_id: str) -> list[ToolRequest]:
        """The rollout's searches and what they returned, in arrival order."""
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM tool_requests WHERE rollout_id = ? ORDER BY pk", (rollout_id,))
            return [
                ToolRequest(
                    rollout_id=row["rollout_id"],
                    attempt=row["attempt"],
                    tool=row["tool"],
                    request=json.loads(row["request"]),
                    response=json.loads(row["response"]),
                    started_at=row["started_at"],
                    finished_at=row["finished_at"],
                )
                for row in rows.fetchall()
            ]

    def group_rollout_ids(self, group_id: str) -> list[str]:
        sql = "SELECT rollout_id FROM rollouts WHERE group_id = ? ORDER BY pk LIMIT 64"
        with self._connect() as conn:
            return [row[0] for row in conn.execute(sql, (group_id,))]
