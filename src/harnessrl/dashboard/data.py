"""``DashboardData``: the dashboard's read-only queries on a run's SQLite store.

The dashboard never writes: it opens the store file with ``mode=ro`` (a fresh connection per query,
so threads never share one), and pages the rollouts table with SQL ``LIMIT``/``OFFSET`` plus one
aggregate query over the page's calls, so a page costs the same with 100 or 100k rollouts. Filters
the ``Store`` protocol lacks (outcome, flagged) and per-rollout call statistics need SQL, which is
why this module reads the SQLite schema directly instead of going through ``Store``. Calls are
stored as deltas on earlier calls (``store.chains``): they are decoded with ``codecs.calls_from_rows``,
a whole rollout at a time, and a store of an older schema (which only a read-write open migrates)
is refused with a message rather than misread.

The rollouts table's sample counts read no tokens: each call row names the earlier call its prompt
extends (``prompt_base_seq``), and ``dashboard.sample_counts`` follows those bases. A trace page
decodes its one rollout's calls and builds the samples exactly.

SQLite's errors stop here (one boundary): a store file gone since the dashboard started (a run
folder moved away) is ``NotFound``, any other failure to read it ``UpstreamError``; a file that is
no SQLite store at all is refused at start with ``ConfigError``. A call row that cannot be decoded
(a disk or a bad writer damaged it: ``codecs`` refuses to guess) costs only its attempt's calls:
``each_call`` decodes one attempt at a time, one call at a time (``dashboard.trace_calls`` keeps
what a page shows), and the trace and compare pages name each attempt they could not read beside
what they can. A rollout row whose JSON columns (task, flags,
metadata) cannot be decoded is shown with those columns empty and the damage named in its
``metadata[DAMAGED_ROW_KEY]`` (it failed the whole rollouts table); a row that cannot be made a
rollout even so (a damaged ``status`` or ``attempt``) is ``DamagedRollout`` (an ``UpstreamError``),
naming it, and is left out of the rollouts table (logged; it failed the whole table too) and named
beside the other rollout of a compare (it failed the compare with a 503). A run whose config cannot
be decoded is shown with the damage as its config.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.dashboard.sample_counts import CallLink, count_samples
from harnessrl.errors import ConfigError, NotFound, UpstreamError
from harnessrl.schemas import Call, Rollout, Run, ToolRequest
from harnessrl.store.codecs import (
    calls_from_rows,
    iter_calls_from_rows,
    load_json,
    rollout_from_row,
    run_from_row,
)
from harnessrl.store.damage import DAMAGED_ROW
from harnessrl.store.migrations import SCHEMA_VERSION

log = logging.getLogger(__name__)

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
        # json_valid first: SQLite's JSON functions raise on a damaged row, which failed the page.
        if self.flag is not None:
            clauses.append(f"EXISTS (SELECT 1 FROM json_each({_VALID_FLAGS}) WHERE json_each.value = ?)")
            params.append(self.flag)
        if self.kind is not None:
            clauses.append("CASE WHEN json_valid(metadata) THEN json_extract(metadata, '$.kind') END = ?")
            params.append(self.kind)
        if self.result in RESULTS:
            clauses.append(RESULTS[self.result])
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params

    def order_by(self) -> str:
        return ORDERS.get(self.order, ORDERS["newest"])


#: A rollout's flags for SQLite's JSON functions, which raise on a damaged (not JSON) value: none then.
_VALID_FLAGS = "CASE WHEN json_valid(rollouts.flags) THEN rollouts.flags ELSE '[]' END"
#: A call column read for the table's statistics, as an integer or NULL: SQLite stores whatever a
#: writer gave a column (``{}``: the column).
_INT = "CASE WHEN typeof({0}) = 'integer' THEN {0} END"
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
    samples: int = 0  # chains of the final attempt's calls (``sample_counts``): what a trace builds

    @property
    def duration_s(self) -> float | None:
        r = self.rollout
        return None if r.started_at is None or r.finished_at is None else r.finished_at - r.started_at


#: The most tool requests a trace reads (in arrival order); the rest are counted, never loaded.
MAX_TOOL_REQUESTS = 1_000
#: A tool request's request or response JSON longer than this is not parsed (the page says so).
MAX_TOOL_JSON_CHARS = 256 * 1024


#: ``metadata`` key of a rollout as the dashboard read it when its row's JSON columns were damaged:
#: column -> what decoding it raised (the column is shown empty). Never written to the store.
DAMAGED_ROW_KEY = "damaged_record"
#: The JSON columns of a rollout row and what each holds.
_ROLLOUT_JSON = (("task", dict), ("flags", list), ("metadata", dict))


class DamagedRollout(UpstreamError):
    """A rollout row that cannot be made a rollout even with its JSON columns set aside (a damaged
    ``status`` or ``attempt``). An ``UpstreamError`` (a trace page of it is a 503 naming the damage);
    a compare shows the other rollout beside it."""


def read_rollout(row: sqlite3.Row) -> Rollout:
    """``rollout_from_row``, or for a row whose JSON columns were damaged, the rollout with those
    columns empty and the damage named in ``metadata[DAMAGED_ROW_KEY]``."""
    try:
        return rollout_from_row(row)
    except DAMAGED_ROW:
        pass
    fields = {key: row[key] for key in row.keys() if key != "pk"}  # noqa: SIM118
    damage: dict[str, str] = {}
    for column, kind in _ROLLOUT_JSON:
        try:
            value = load_json(fields[column])
        except DAMAGED_ROW as exc:
            value, damage[column] = None, f"{type(exc).__name__}: {exc}"[:300]
        if not isinstance(value, kind):
            damage.setdefault(column, f"not a JSON {kind.__name__}")
            value = kind()
        fields[column] = value
    fields["metadata"] = {**fields["metadata"], DAMAGED_ROW_KEY: damage}
    try:
        return Rollout.model_validate(fields)
    except DAMAGED_ROW as exc:
        raise DamagedRollout(
            f"rollout {fields.get('rollout_id')!r}: its row in the store is damaged and cannot be read: "
            f"{type(exc).__name__}: {exc}"[:1000]
        ) from exc


def read_run(row: sqlite3.Row) -> Run:
    """``run_from_row``, or for a row whose config was damaged, the run with its config replaced by
    ``{DAMAGED_ROW_KEY: {"config": what decoding it raised}}`` (it failed the runs page and the table)."""
    try:
        return run_from_row(row)
    except DAMAGED_ROW as exc:
        damage = {"config": f"{type(exc).__name__}: {exc}"[:300]}
    return Run(
        run_id=row["run_id"],
        config={DAMAGED_ROW_KEY: damage},
        status=row["status"],
        created_at=row["created_at"],
    )


@dataclass(frozen=True, slots=True)
class ToolRequests:
    """The first ``MAX_TOOL_REQUESTS`` tool requests of a rollout, and how many it has in all."""

    shown: list[ToolRequest]
    total: int


class DashboardData:
    """Read-only access to one SQLite store file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise NotFound(f"store file {str(self.path)!r} does not exist")
        try:
            found = self.schema_version()
        except UpstreamError as exc:  # not a database at all, or one SQLite cannot read
            raise ConfigError(
                f"{str(self.path)!r} is not a readable harnessrl store: {exc.__cause__}"
            ) from exc
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
        try:
            return 0 if row is None else int(row[0])
        except (TypeError, ValueError) as exc:  # a damaged meta row: a traceback at start, a 500 after
            raise ConfigError(
                f"{str(self.path)!r} is not a readable harnessrl store: its schema_version is {row[0]!r}"[
                    :1000
                ]
            ) from exc

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = None
        try:
            conn = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False
            )
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout = 5000")
            yield conn
        except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise  # a query of ours is wrong: a bug, not the store's state
        except sqlite3.Error as exc:
            raise self._unreadable(exc) from exc
        finally:
            if conn is not None:
                conn.close()

    def _unreadable(self, exc: sqlite3.Error) -> NotFound | UpstreamError:
        if not self.path.is_file():
            return NotFound(f"store file {str(self.path)!r} is gone (was its run folder moved?)")
        return UpstreamError(f"store file {str(self.path)!r} cannot be read: {exc}")

    # -- runs ---------------------------------------------------------------------------------------
    def list_runs(self) -> list[Run]:
        with self._connect() as conn:
            return [read_run(row) for row in conn.execute("SELECT * FROM runs ORDER BY pk")]

    def get_run(self, run_id: str) -> Run:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"run {run_id!r} not found")
        return read_run(row)

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
            rows = []
            for row in conn.execute(sql, [*params, limit, offset]):
                try:
                    rows.append(RolloutRow(read_rollout(row)))
                except UpstreamError as exc:  # one damaged row must not hide the page (it was a 503)
                    log.warning("%s: left out of the rollouts table", exc)
            if rows:
                self._add_call_stats(conn, rows)
                self._add_sample_counts(conn, rows)
        return rows

    @staticmethod
    def _add_sample_counts(conn: sqlite3.Connection, rows: list[RolloutRow]) -> None:
        """Each row's sample count from its calls' chain columns: no prompt, response or request is
        read or decoded, only each call's seq, attempt, base and sampled-token count."""
        by_id = {row.rollout.rollout_id: row for row in rows}
        marks = ", ".join("?" * len(by_id))
        # Integers only (``_INT``): a damaged row's text in these columns failed the whole table (a
        # seq that is no number, which the count could not order, leaves its row out of the count).
        sql = (
            f"SELECT rollout_id, seq, attempt, {_INT.format('prompt_base_seq')} AS prompt_base_seq, "
            f"LENGTH(response_token_ids) / 4 AS sampled, {_INT.format('prompt_len')} AS prompt_len "
            f"FROM calls WHERE rollout_id IN ({marks}) AND typeof(seq) = 'integer' ORDER BY rollout_id, seq"
        )
        links: dict[str, list[CallLink]] = {rollout_id: [] for rollout_id in by_id}
        for rec in conn.execute(sql, list(by_id)):
            links[rec["rollout_id"]].append(
                CallLink(
                    rec["seq"],
                    rec["attempt"],
                    rec["prompt_base_seq"],
                    rec["sampled"] or 0,
                    rec["prompt_len"] or 0,
                )
            )
        caps = _sample_token_caps(conn)
        for rollout_id, row in by_id.items():
            cap = caps.get(row.rollout.run_id) if row.rollout.run_id is not None else None
            row.samples = count_samples(row.rollout, links[rollout_id], max_sample_tokens=cap)

    @staticmethod
    def _add_call_stats(conn: sqlite3.Connection, rows: list[RolloutRow]) -> None:
        by_id = {row.rollout.rollout_id: row for row in rows}
        marks = ", ".join("?" * len(by_id))
        # Token counts without decoding: response blobs are whole (int32 each), and a prompt (a
        # delta on an earlier call) has its whole length in prompt_len.
        # Integers only (``_INT``): a damaged call row's text or real in these columns was a 500 for
        # the whole table; its call is still counted.
        sql = (
            "SELECT rollout_id, COUNT(*) AS n, SUM(LENGTH(response_token_ids)) / 4 AS sampled, "
            f"GROUP_CONCAT(DISTINCT {_INT.format('policy_version')}) AS versions, "
            f"(SELECT {_INT.format('c2.prompt_len')} FROM calls c2 WHERE c2.rollout_id = calls.rollout_id "
            " ORDER BY c2.seq DESC LIMIT 1) AS last_prompt "
            f"FROM calls WHERE rollout_id IN ({marks}) GROUP BY rollout_id"
        )
        for rec in conn.execute(sql, list(by_id)):
            row = by_id[rec["rollout_id"]]
            row.calls, row.sampled_tokens = rec["n"], rec["sampled"] or 0
            row.prompt_tokens = rec["last_prompt"] or 0
            row.policy_versions = sorted(int(v) for v in str(rec["versions"] or "").split(",") if v)

    def sample_token_caps(self) -> dict[str, int]:
        """Each run's ``trainer.max_sample_tokens`` (runs without one are left out): the trainer drops
        a call longer than it, so a trace and the table build their samples with it too."""
        with self._connect() as conn:
            return _sample_token_caps(conn)

    def list_flags(self) -> list[str]:
        """The audit rules that flagged at least one rollout (the table's flag filter offers these)."""
        sql = (
            f"SELECT DISTINCT json_each.value FROM rollouts, json_each({_VALID_FLAGS}) "
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
        return read_rollout(row)

    def list_calls(self, rollout_id: str) -> list[Call]:
        """Every call of the rollout; raises if a row cannot be decoded (pages use ``each_call``)."""
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM calls WHERE rollout_id = ? ORDER BY seq", (rollout_id,))
            return calls_from_rows(rows.fetchall())

    def call_attempts(self, rollout_id: str) -> list[Any]:
        """The attempts the rollout's calls belong to, in the order their first calls were made."""
        sql = "SELECT attempt FROM calls WHERE rollout_id = ? GROUP BY attempt ORDER BY MIN(seq)"
        with self._connect() as conn:
            return [row[0] for row in conn.execute(sql, (rollout_id,))]

    def each_call(self, rollout_id: str, attempt: Any, visit: Callable[[Call], None]) -> None:
        """Decode one attempt's calls in ``seq`` order, handing each to ``visit`` and keeping only the
        calls later rows are deltas on (``codecs.unfold_rows``' ``last_use``): decoded all at once, a
        rollout of 1,000 calls of 40 k tokens held every prompt whole (2 GB for one trace page).
        A damaged row raises what decoding it raises (one of ``DAMAGED_ROW``), after ``visit`` saw
        the calls before it."""
        where = "WHERE rollout_id = ? AND attempt IS ?"
        with self._connect() as conn:
            last_use: dict[Any, Any] = {}
            for seq, *bases in conn.execute(
                f"SELECT seq, prompt_base_seq, request_base_seq FROM calls {where} ORDER BY seq",
                (rollout_id, attempt),
            ):
                for base in bases:
                    if base is not None:
                        last_use[base] = seq  # rows come in seq order: the last one wins
            rows = conn.execute(f"SELECT * FROM calls {where} ORDER BY seq", (rollout_id, attempt))
            for call in iter_calls_from_rows(rows, last_use=last_use):
                visit(call)

    def list_tool_requests(self, rollout_id: str, *, limit: int = MAX_TOOL_REQUESTS) -> ToolRequests:
        """The rollout's first ``limit`` searches and what they returned, in arrival order, and how
        many it made. A harness decides how many it makes and a corpus how much each returns, so both
        are bounded here: SQL ``LIMIT``, and JSON over ``MAX_TOOL_JSON_CHARS`` is not parsed."""
        cap = MAX_TOOL_JSON_CHARS
        sql = (
            "SELECT rollout_id, attempt, tool, started_at, finished_at, "
            "CASE WHEN LENGTH(request) > ? THEN NULL ELSE request END AS request, LENGTH(request) AS request_len, "
            "CASE WHEN LENGTH(response) > ? THEN NULL ELSE response END AS response, "
            "LENGTH(response) AS response_len "
            "FROM tool_requests WHERE rollout_id = ? ORDER BY pk LIMIT ?"
        )
        with self._connect() as conn:
            total = conn.execute(
                "SELECT COUNT(*) FROM tool_requests WHERE rollout_id = ?", (rollout_id,)
            ).fetchone()[0]
            rows = conn.execute(sql, (cap, cap, rollout_id, limit)).fetchall()
        shown = [request for row in rows if (request := _tool_request(row)) is not None]
        return ToolRequests(shown=shown, total=total)

    def group_rollout_ids(self, group_id: str) -> list[str]:
        sql = "SELECT rollout_id FROM rollouts WHERE group_id = ? ORDER BY pk LIMIT 64"
        with self._connect() as conn:
            return [row[0] for row in conn.execute(sql, (group_id,))]


def _sample_token_caps(conn: sqlite3.Connection) -> dict[str, int]:
    """``run_id -> trainer.max_sample_tokens`` of the runs whose stored config sets it."""
    sql = (
        "SELECT run_id, CASE WHEN json_valid(config) "
        "THEN json_extract(config, '$.trainer.max_sample_tokens') END FROM runs"
    )
    return {run_id: cap for run_id, cap in conn.execute(sql) if isinstance(cap, int) and cap >= 1}


def _tool_request(row: sqlite3.Row) -> ToolRequest | None:
    """A stored tool request, or None for a row that is none (a damaged row's text where a time or
    the attempt is: it failed the whole trace page with a 500). Left out, it is counted among the
    requests not shown."""
    try:
        return ToolRequest(
            rollout_id=row["rollout_id"],
            attempt=row["attempt"],
            tool=row["tool"],
            request=_json_object(row["request"], row["request_len"]),
            response=_json_object(row["response"], row["response_len"]),
            started_at=row["started_at"],
            finished_at=row["finished_at"],
        )
    except DAMAGED_ROW as exc:
        log.warning("a tool request of rollout %r cannot be read, left out: %s", row["rollout_id"], exc)
        return None


def _json_object(text: str | None, length: int) -> dict[str, Any]:
    """A stored request or response: too long to parse (``text`` None) or not an object: a stand-in
    that says so (the timeline shows ``query`` and ``passages``; neither is there then)."""
    if text is None:
        return {"not_shown": f"{length:,} characters of JSON, over the dashboard's {MAX_TOOL_JSON_CHARS:,}"}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting past Python's depth
        return {"not_shown": "not JSON this dashboard can read"}
    return value if isinstance(value, dict) else {"value": value}
