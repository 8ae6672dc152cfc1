"""Schema versions and the in-place migrations between them, for every backend (SQLite, PostgreSQL).

A store records its schema version in its ``meta`` table (key ``schema_version``; version 0 is an
empty database). Opening a store runs ``migrate_sqlite`` / ``migrate_postgres``, which applies the
missing migrations, oldest first, in the caller's one transaction: either the store ends at
``SCHEMA_VERSION`` or nothing changed. A store newer than this code is refused, never touched.

The version stays in ``meta`` (not a table of its own) because that is where every released
harnessrl reads it: an older harnessrl opening a store this code migrated sees the higher number
and refuses, instead of writing rows the new schema does not expect.

To change the schema: append a ``Migration`` (both dialects) and bump ``SCHEMA_VERSION``. Never
edit an old one: a store at that version already ran it. A migration may instead (or also) repair
data: its ``repair`` runs after its statements, in the same transaction. Scripts are split on ``;``, so a statement
must not contain one (no triggers or function bodies); the statements run one by one because
SQLite's ``executescript`` would commit the caller's transaction first. A change SQLite cannot make
in place (a column's default or constraint) rebuilds the table in its dialect, in that transaction
(migration 8); the two dialects must still end with the same columns.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from harnessrl.errors import HarnessRLError, UpstreamError
from harnessrl.store.chains import CHAIN_COLUMNS_V4, AttemptChains, PackedCall, place, split_request
from harnessrl.store.codecs import dump_json, json_safe

SCHEMA_VERSION = 9


@dataclass(frozen=True, slots=True)
class Migration:
    version: int  # the schema version a store has after this migration
    summary: str
    sqlite: str
    postgres: str
    # A data repair run after the statements: ``repair(conn, dialect, param)``.
    repair: Callable[[Any, str, str], None] | None = None


# Version 1 as first released (SQLite only then); frozen. The PostgreSQL dialect mirrors it column
# for column: BIGINT where SQLite's INTEGER is 64-bit, DOUBLE PRECISION for REAL (both float64, so
# round trips are exact), BYTEA for BLOB. JSON stays TEXT on PostgreSQL too: JSONB would reorder
# keys, drop duplicates and reject "\u0000", and a call's request must come back as it was sent.
_V1_SQLITE = """
CREATE TABLE runs (
    pk          INTEGER PRIMARY KEY,
    run_id      TEXT NOT NULL UNIQUE,
    config      TEXT NOT NULL,
    status      TEXT NOT NULL,
    created_at  REAL NOT NULL
);
CREATE TABLE tasks (
    pk       INTEGER PRIMARY KEY,
    task_id  TEXT NOT NULL UNIQUE,
    run_id   TEXT,
    split    TEXT NOT NULL,
    data     TEXT NOT NULL
);
CREATE INDEX tasks_run_split ON tasks (run_id, split);
-- run_id / task_id are loose references on purpose: the gateway's control API may create
-- rollouts for ad-hoc evaluation without a run or a task row.
CREATE TABLE rollouts (
    pk           INTEGER PRIMARY KEY,  -- creation order
    rollout_id   TEXT NOT NULL UNIQUE,
    api_key      TEXT NOT NULL UNIQUE,
    run_id       TEXT,
    task_id      TEXT,
    task         TEXT NOT NULL,
    group_id     TEXT,
    step         INTEGER,
    status       TEXT NOT NULL,
    outcome      TEXT,
    reward       REAL,
    attempt      INTEGER NOT NULL,
    worker_id    TEXT,
    error        TEXT,
    flags        TEXT NOT NULL,
    metadata     TEXT NOT NULL,
    created_at   REAL NOT NULL,
    started_at   REAL,
    finished_at  REAL
);
CREATE INDEX rollouts_status ON rollouts (status, pk);
CREATE INDEX rollouts_run ON rollouts (run_id, status);
CREATE INDEX rollouts_step ON rollouts (step);
CREATE INDEX rollouts_group ON rollouts (group_id);
CREATE TABLE calls (
    call_id             TEXT PRIMARY KEY,
    rollout_id          TEXT NOT NULL REFERENCES rollouts (rollout_id) ON DELETE CASCADE,
    seq                 INTEGER NOT NULL,
    attempt             INTEGER NOT NULL,
    api                 TEXT NOT NULL,
    request             TEXT NOT NULL,
    response            TEXT NOT NULL,
    prompt_token_ids    BLOB NOT NULL,
    response_token_ids  BLOB NOT NULL,
    response_logprobs   BLOB NOT NULL,
    policy_version      INTEGER NOT NULL,
    finish_reason       TEXT NOT NULL,
    usage               TEXT,
    started_at          REAL NOT NULL,
    first_token_at      REAL,
    finished_at         REAL,
    UNIQUE (rollout_id, seq)  -- also the index list_calls and seq assignment use
);
CREATE TABLE policy_versions (
    version     INTEGER PRIMARY KEY,
    step        INTEGER,
    checkpoint  TEXT,
    created_at  REAL NOT NULL,
    metadata    TEXT NOT NULL
);
"""

_V1_POSTGRES = """
CREATE TABLE runs (
    pk          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      TEXT NOT NULL UNIQUE,
    config      TEXT NOT NULL,
    status      TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL
);
CREATE TABLE tasks (
    pk       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id  TEXT NOT NULL UNIQUE,
    run_id   TEXT,
    split    TEXT NOT NULL,
    data     TEXT NOT NULL
);
CREATE INDEX tasks_run_split ON tasks (run_id, split);
CREATE TABLE rollouts (
    pk           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_id   TEXT NOT NULL UNIQUE,
    api_key      TEXT NOT NULL UNIQUE,
    run_id       TEXT,
    task_id      TEXT,
    task         TEXT NOT NULL,
    group_id     TEXT,
    step         BIGINT,
    status       TEXT NOT NULL,
    outcome      TEXT,
    reward       DOUBLE PRECISION,
    attempt      BIGINT NOT NULL,
    worker_id    TEXT,
    error        TEXT,
    flags        TEXT NOT NULL,
    metadata     TEXT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    started_at   DOUBLE PRECISION,
    finished_at  DOUBLE PRECISION
);
CREATE INDEX rollouts_status ON rollouts (status, pk);
CREATE INDEX rollouts_run ON rollouts (run_id, status);
CREATE INDEX rollouts_step ON rollouts (step);
CREATE INDEX rollouts_group ON rollouts (group_id);
CREATE TABLE calls (
    call_id             TEXT PRIMARY KEY,
    rollout_id          TEXT NOT NULL REFERENCES rollouts (rollout_id) ON DELETE CASCADE,
    seq                 BIGINT NOT NULL,
    attempt             BIGINT NOT NULL,
    api                 TEXT NOT NULL,
    request             TEXT NOT NULL,
    response            TEXT NOT NULL,
    prompt_token_ids    BYTEA NOT NULL,
    response_token_ids  BYTEA NOT NULL,
    response_logprobs   BYTEA NOT NULL,
    policy_version      BIGINT NOT NULL,
    finish_reason       TEXT NOT NULL,
    usage               TEXT,
    started_at          DOUBLE PRECISION NOT NULL,
    first_token_at      DOUBLE PRECISION,
    finished_at         DOUBLE PRECISION,
    UNIQUE (rollout_id, seq)
);
CREATE TABLE policy_versions (
    version     BIGINT PRIMARY KEY,
    step        BIGINT,
    checkpoint  TEXT,
    created_at  DOUBLE PRECISION NOT NULL,
    metadata    TEXT NOT NULL
);
"""

# Version 2: a run's claim (``status = 'queued' AND run_id = ? ORDER BY pk LIMIT n``, every
# controller poll) reads its first n entries from this index instead of walking the primary key past
# every other run's rollouts. Measured on PostgreSQL 15 with 200k rollouts of 200 runs, the newest run's claim
# of 8: 84 ms (a pkey scan filtering 199k rows) -> 0.12 ms (an index range scan). SQLite's old index
# already ended in the rowid (pk), so only PostgreSQL gains; both run it to keep the schemas alike.
_V2_RUN_CLAIM_INDEX = """
DROP INDEX rollouts_run;
CREATE INDEX rollouts_run ON rollouts (run_id, status, pk)
"""

# Version 3: rows written before the gateway's boundary was strict (issue 19) may hold what JSON
# cannot carry: lone surrogates (``"\ud800"`` escapes) or NaN/Infinity inside the JSON columns, and
# an infinite or NaN reward. Reads already show them as placeholders; this rewrites them once.
_JSON_COLUMNS = {  # table: (its key, its JSON columns)
    "runs": ("pk", ("config",)),
    "tasks": ("pk", ("data",)),
    "rollouts": ("pk", ("task", "flags", "metadata")),
    "calls": ("call_id", ("request", "response", "usage")),
    "policy_versions": ("version", ("metadata",)),
}
# What the suspect rows' text contains (json.dumps writes a lone surrogate as an escape, since it
# escapes all non-ASCII; valid pairs match too and are left as they are).
_SUSPECT = [f"\\ud{c}" for c in "89abcdef"] + ["NaN", "Infinity"]
_NOT_FINITE = {
    "sqlite": "reward IN (9e999, -9e999)",  # SQLite keeps NaN as NULL; 9e999 reads as infinity
    "postgres": "reward IN ('Infinity'::float8, '-Infinity'::float8, 'NaN'::float8)",
}
#: The flag a repaired rollout gets: its stored reward was not a number and is now null.
REWARD_REPAIRED_FLAG = "reward_not_finite"


def _cell(row: Any, index: int, name: str) -> Any:
    return row[name] if isinstance(row, dict) else row[index]


#: Rows ``_rows_in_batches`` reads at a time: a call row of versions 1-3 holds its whole request.
_REPAIR_BATCH = 64


def _rows_in_batches(
    conn: Any, table: str, key: str, columns: Sequence[str], wanted: str, values: list[Any], param: str
) -> Iterator[Any]:
    """The rows of ``table`` matching ``wanted`` (key first, then ``columns``), read ``_REPAIR_BATCH``
    at a time in key order. Read at once, a big store's every call holding an emoji (its escaped
    surrogate pair matches) was in memory with its whole request."""
    last: list[Any] = []  # the key the previous batch ended at
    while True:
        after = f" AND {key} > {param}" if last else ""
        rows = conn.execute(
            f"SELECT {key}, {', '.join(columns)} FROM {table} WHERE ({wanted}){after} "
            f"ORDER BY {key} LIMIT {_REPAIR_BATCH}",
            [*values, *last],
        ).fetchall()
        yield from rows
        if len(rows) < _REPAIR_BATCH:
            return
        last = [_cell(rows[-1], 0, key)]
        del rows


def _repair_unrepresentable(conn: Any, dialect: str, param: str) -> None:
    """Rewrite what strict JSON cannot carry: lone surrogates become U+FFFD and non-finite numbers
    inside JSON become null; a non-finite reward becomes null and the rollout is flagged."""
    # LIKE: PostgreSQL's default escape character is the backslash (so it is doubled), SQLite has none.
    patterns = [p.replace("\\", "\\\\") if dialect == "postgres" else p for p in _SUSPECT]
    for table, (key, columns) in _JSON_COLUMNS.items():
        wanted = " OR ".join(f"{col} LIKE {param}" for col in columns for _ in patterns)
        values = [f"%{p}%" for _ in columns for p in patterns]
        for row in _rows_in_batches(conn, table, key, columns, wanted, values, param):
            updates: dict[str, str] = {}
            for i, col in enumerate(columns, start=1):
                text = _cell(row, i, col)
                if text is None:
                    continue
                fixed = dump_json(json_safe(json.loads(text), lambda _: None))
                if fixed != text:
                    updates[col] = fixed
            if updates:
                assignments = ", ".join(f"{col} = {param}" for col in updates)
                conn.execute(
                    f"UPDATE {table} SET {assignments} WHERE {key} = {param}",
                    [*updates.values(), _cell(row, 0, key)],
                )
    rows = conn.execute(f"SELECT pk, flags FROM rollouts WHERE {_NOT_FINITE[dialect]}").fetchall()
    for row in rows:
        flags = json.loads(_cell(row, 1, "flags") or "[]")
        if REWARD_REPAIRED_FLAG not in flags:
            flags.append(REWARD_REPAIRED_FLAG)
        conn.execute(
            f"UPDATE rollouts SET reward = NULL, flags = {param} WHERE pk = {param}",
            [dump_json(flags), _cell(row, 0, "pk")],
        )


# Version 4: calls stored as deltas on their chain (issue 22; ``chains`` describes the columns).
# Until now every row held its whole prompt and whole request, so a rollout cost O(calls x context).
# The new columns are added, then ``_chain_stored_calls`` rewrites each rollout's rows in place
# with the encoder new writes use. ``prompt_len``'s default only lets it be added to a filled table.
_V4_SQLITE = """
ALTER TABLE calls ADD COLUMN prompt_base_seq INTEGER;
ALTER TABLE calls ADD COLUMN prompt_len INTEGER NOT NULL DEFAULT 0;
ALTER TABLE calls ADD COLUMN request_key TEXT;
ALTER TABLE calls ADD COLUMN request_items TEXT;
ALTER TABLE calls ADD COLUMN request_base_seq INTEGER
"""
_V4_POSTGRES = _V4_SQLITE.replace("INTEGER", "BIGINT")


def _chain_stored_calls(conn: Any, dialect: str, param: str) -> None:
    """Rewrite every call row (each whole, as versions 1-3 stored them) as a delta on the earlier
    calls of its rollout attempt, one rollout at a time (memory: one rollout's rows)."""
    rollouts = [_cell(row, 0, "rollout_id") for row in conn.execute("SELECT DISTINCT rollout_id FROM calls")]
    assignments = ", ".join(f"{column} = {param}" for column in CHAIN_COLUMNS_V4)
    update = f"UPDATE calls SET {assignments} WHERE call_id = {param}"
    for rollout_id in rollouts:
        rows = conn.execute(
            "SELECT call_id, seq, attempt, request, prompt_token_ids, response_token_ids FROM calls "
            f"WHERE rollout_id = {param} ORDER BY seq",
            (rollout_id,),
        ).fetchall()
        by_attempt: dict[int, AttemptChains] = {}
        for row in rows:
            call_id, seq, attempt = (
                _cell(row, i, name) for i, name in enumerate(("call_id", "seq", "attempt"))
            )
            key, frame, items = split_request(json.loads(_cell(row, 3, "request")))
            prompt, response = (
                bytes(_cell(row, 4, "prompt_token_ids")),
                bytes(_cell(row, 5, "response_token_ids")),
            )
            chains = by_attempt.get(attempt) or AttemptChains(attempt, seq - 1)
            packed = PackedCall({}, prompt, response, key, frame, items)
            new, by_attempt[attempt] = place(packed, seq, chains, partial=False)  # schema 4's columns
            conn.execute(update, [*(new[column] for column in CHAIN_COLUMNS_V4), call_id])


# Version 5: a request may be stored on the leading items of a longer call (``chains``): Claude
# Code edits its newest message on every call (``cache_control`` moves on), so no earlier request
# was ever a whole prefix and every one was stored whole. NULL, as in every existing row, is "all".
_V5_SQLITE = "ALTER TABLE calls ADD COLUMN request_base_items INTEGER"
_V5_POSTGRES = _V5_SQLITE.replace("INTEGER", "BIGINT")


# Version 6: what harnesses asked of the tools the gateway serves (the retriever) and what they got,
# per rollout and attempt (``schemas.ToolRequest``), read beside the calls in the dashboard's trace.
_V6_SQLITE = """
CREATE TABLE tool_requests (
    pk           INTEGER PRIMARY KEY,  -- arrival order
    rollout_id   TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    tool         TEXT NOT NULL,
    request      TEXT NOT NULL,
    response     TEXT NOT NULL,
    started_at   REAL NOT NULL,
    finished_at  REAL NOT NULL
);
CREATE INDEX tool_requests_rollout ON tool_requests (rollout_id, attempt, pk)
"""
_V6_POSTGRES = (
    _V6_SQLITE.replace("INTEGER PRIMARY KEY", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY")
    .replace("INTEGER NOT NULL", "BIGINT NOT NULL")
    .replace("REAL", "DOUBLE PRECISION")
)


# Version 7: the gate every gateway sharing the store agrees on (one row: paused, the live policy
# version, a command counter) and one heartbeat row per gateway process (``store.gate``).
_V7_SQLITE = """
CREATE TABLE gate (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    paused          INTEGER NOT NULL,
    policy_version  INTEGER,
    command         INTEGER NOT NULL,
    updated_at      REAL NOT NULL
);
INSERT INTO gate (id, paused, policy_version, command, updated_at) VALUES (1, 0, NULL, 0, 0);
CREATE TABLE gateways (
    gateway_id      TEXT PRIMARY KEY,
    url             TEXT NOT NULL,
    command         INTEGER NOT NULL,
    paused          INTEGER NOT NULL,
    quiet           INTEGER NOT NULL,
    in_flight       INTEGER NOT NULL,
    waiting         INTEGER NOT NULL,
    policy_version  INTEGER NOT NULL,
    lease_until     REAL NOT NULL,
    started_at      REAL NOT NULL
)
"""
_V7_POSTGRES = """
CREATE TABLE gate (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    paused          INTEGER NOT NULL,
    policy_version  BIGINT,
    command         BIGINT NOT NULL,
    updated_at      DOUBLE PRECISION NOT NULL
);
INSERT INTO gate (id, paused, policy_version, command, updated_at) VALUES (1, 0, NULL, 0, 0);
CREATE TABLE gateways (
    gateway_id      TEXT PRIMARY KEY,
    url             TEXT NOT NULL,
    command         BIGINT NOT NULL,
    paused          INTEGER NOT NULL,
    quiet           INTEGER NOT NULL,
    in_flight       INTEGER NOT NULL,
    waiting         INTEGER NOT NULL,
    policy_version  BIGINT NOT NULL,
    lease_until     DOUBLE PRECISION NOT NULL,
    started_at      DOUBLE PRECISION NOT NULL
)
"""


# Version 8: ``calls.prompt_len`` loses the default migration 4 gave it, so a gateway of an older
# harnessrl (schema 1-3) still running when a newer process migrated the store can no longer record
# a call in the old shape: its insert, which leaves ``prompt_len`` out, now fails at once in that
# process (its call refused, the harness told) instead of storing a row that says 0 tokens, which
# every later read and write of the rollout refused as damage. A column's default cannot be
# dropped in place in SQLite: the table is rebuilt (same columns in the same order, same
# constraints, every row copied, in the migration's one transaction); PostgreSQL drops it. Rows
# such a gateway wrote before (every chain column NULL, ``prompt_len`` 0 for a prompt that has
# tokens: whole calls, as versions 1-3 stored them) get their prompt's length. Triggers could refuse
# the old shape too, but ``statements`` splits scripts on ``;``, which a trigger's body holds.
_REPAIR_OLD_SHAPE = """
UPDATE calls SET prompt_len = LENGTH(prompt_token_ids) / 4
WHERE prompt_len = 0 AND LENGTH(prompt_token_ids) > 0 AND prompt_base_seq IS NULL
    AND request_key IS NULL AND request_items IS NULL AND request_base_seq IS NULL
    AND request_base_items IS NULL
"""
_CALLS_V8_COLUMNS = (
    "call_id, rollout_id, seq, attempt, api, request, response, prompt_token_ids, response_token_ids, "
    "response_logprobs, policy_version, finish_reason, usage, started_at, first_token_at, finished_at, "
    "prompt_base_seq, prompt_len, request_key, request_items, request_base_seq, request_base_items"
)
_V8_SQLITE = f"""
CREATE TABLE calls_v8 (
    call_id             TEXT PRIMARY KEY,
    rollout_id          TEXT NOT NULL REFERENCES rollouts (rollout_id) ON DELETE CASCADE,
    seq                 INTEGER NOT NULL,
    attempt             INTEGER NOT NULL,
    api                 TEXT NOT NULL,
    request             TEXT NOT NULL,
    response            TEXT NOT NULL,
    prompt_token_ids    BLOB NOT NULL,
    response_token_ids  BLOB NOT NULL,
    response_logprobs   BLOB NOT NULL,
    policy_version      INTEGER NOT NULL,
    finish_reason       TEXT NOT NULL,
    usage               TEXT,
    started_at          REAL NOT NULL,
    first_token_at      REAL,
    finished_at         REAL,
    prompt_base_seq     INTEGER,
    prompt_len          INTEGER NOT NULL,
    request_key         TEXT,
    request_items       TEXT,
    request_base_seq    INTEGER,
    request_base_items  INTEGER,
    UNIQUE (rollout_id, seq)
);
INSERT INTO calls_v8 ({_CALLS_V8_COLUMNS}) SELECT {_CALLS_V8_COLUMNS} FROM calls;
DROP TABLE calls;
ALTER TABLE calls_v8 RENAME TO calls;
{_REPAIR_OLD_SHAPE}
"""
_V8_POSTGRES = f"""
ALTER TABLE calls ALTER COLUMN prompt_len DROP DEFAULT;
{_REPAIR_OLD_SHAPE}
"""

# Version 9: one gate per name (``gateway.gate``: a run's own), not one per store, so two runs sharing
# a store no longer pause, reopen and version each other's gateways. ``gate`` is rebuilt keyed by
# ``name`` (its one row becomes the gate ``default``, which every gateway of an older config serves);
# ``gateways`` names each row's gate (``default`` for the rows there). A gateway of an older
# harnessrl still running reads ``gate WHERE id = 1``, which is gone: its reads and commands fail
# loudly instead of following a gate nobody commands any more.
_V9_SQLITE = """
CREATE TABLE gate_v9 (
    name            TEXT NOT NULL PRIMARY KEY,
    paused          INTEGER NOT NULL,
    policy_version  INTEGER,
    command         INTEGER NOT NULL,
    updated_at      REAL NOT NULL
);
INSERT INTO gate_v9 (name, paused, policy_version, command, updated_at)
    SELECT 'default', paused, policy_version, command, updated_at FROM gate;
DROP TABLE gate;
ALTER TABLE gate_v9 RENAME TO gate;
ALTER TABLE gateways ADD COLUMN gate TEXT NOT NULL DEFAULT 'default';
CREATE INDEX gateways_gate ON gateways (gate)
"""
_V9_POSTGRES = (
    _V9_SQLITE.replace("policy_version  INTEGER", "policy_version  BIGINT")
    .replace("command         INTEGER", "command         BIGINT")
    .replace("REAL", "DOUBLE PRECISION")
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema", _V1_SQLITE, _V1_POSTGRES),
    Migration(
        2, "rollouts_run index ends in pk (ordered claims per run)", _V2_RUN_CLAIM_INDEX, _V2_RUN_CLAIM_INDEX
    ),
    Migration(
        3,
        "repair lone surrogates and non-finite numbers stored before the strict boundary",
        "",
        "",
        repair=_repair_unrepresentable,
    ),
    Migration(
        4,
        "calls stored as deltas on their chain (linear bytes per rollout)",
        _V4_SQLITE,
        _V4_POSTGRES,
        repair=_chain_stored_calls,
    ),
    Migration(
        5,
        "a request may be stored on the leading items of a longer call",
        _V5_SQLITE,
        _V5_POSTGRES,
    ),
    Migration(6, "tool_requests: what harnesses asked of gateway-served tools", _V6_SQLITE, _V6_POSTGRES),
    Migration(
        7, "gate and gateways: pause state and membership shared through the store", _V7_SQLITE, _V7_POSTGRES
    ),
    Migration(
        8,
        "calls.prompt_len without a default: an older harnessrl's call in the old shape is refused",
        _V8_SQLITE,
        _V8_POSTGRES,
    ),
    Migration(9, "one gate per name (a run's own), gateways' rows naming theirs", _V9_SQLITE, _V9_POSTGRES),
)
assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))


def pending(found: int, *, target: int = SCHEMA_VERSION, where: str = "store") -> tuple[Migration, ...]:
    """The migrations that take a store at version ``found`` to ``target``, oldest first.
    Refuses a store newer than this code."""
    if found > SCHEMA_VERSION:
        raise HarnessRLError(
            f"{where} has schema version {found}, newer than this harnessrl understands "
            f"({SCHEMA_VERSION}); upgrade harnessrl to open it"
        )
    if not 0 <= target <= SCHEMA_VERSION:
        raise ValueError(f"target schema version must be in 0..{SCHEMA_VERSION}, got {target}")
    return MIGRATIONS[found:target] if found < target else ()


def statements(script: str) -> list[str]:
    """A script's statements, ``--`` comments dropped (so a ``;`` in a comment cannot split one)."""
    lines = [line.split("--", 1)[0] for line in script.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def migrate_sqlite(conn: Any, *, target: int = SCHEMA_VERSION, where: str = "store") -> int:
    """Bring a SQLite database to ``target``; returns the version it had. The caller holds a
    write transaction (``BEGIN IMMEDIATE``), so two processes opening a fresh file at once cannot
    both migrate it."""
    return _migrate(conn, "sqlite", "?", target=target, where=where)


# pg_advisory_xact_lock key for migrations (any constant; advisory locks are per database).
_PG_MIGRATION_LOCK = 0x6872_6C5F_6D69_67  # "hrl_mig"


class MigrationLocked(UpstreamError):
    """A store open waited ``lock_timeout_s`` for the migration lock, or for a table a migration
    alters, and gave up; the message names the sessions holding locks there."""


def migrate_postgres(
    conn: Any, *, target: int = SCHEMA_VERSION, where: str = "store", lock_timeout_s: float | None = None
) -> int:
    """Bring a PostgreSQL database to ``target``; returns the version it had. Runs in the
    caller's transaction (PostgreSQL's DDL is transactional) after taking an advisory lock that
    serializes processes opening the same database at once; the lock ends with the transaction.

    ``lock_timeout_s``: how long each lock may be waited for (the advisory lock, a table's), then
    ``MigrationLocked``. Without it a migration stuck behind another session's long transaction
    held the advisory lock forever, and every process opening the store waited behind it.
    """
    import psycopg

    if lock_timeout_s is not None:
        lock_ms = f"{max(1, int(lock_timeout_s * 1000))}ms"
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (lock_ms,))  # this transaction only
    try:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_MIGRATION_LOCK,))
        return _migrate(conn, "postgres", "%s", target=target, where=where)
    except psycopg.errors.LockNotAvailable:
        conn.rollback()
        raise MigrationLocked(
            f"{where}: gave up after {lock_timeout_s:g} s waiting for a lock to migrate its schema; "
            f"{_lock_holders(conn)}; end that transaction (or wait for it) and open the store again"
        ) from None


#: Other sessions of this database holding the migration lock or a lock on one of its tables, the
#: longest-running transaction first, with the sessions each one waits on (``pg_blocking_pids``).
_LOCK_HOLDERS = """
SELECT a.pid, a.usename, a.application_name, a.client_addr::text, a.state,
       a.xact_start::text, left(a.query, 120), pg_blocking_pids(a.pid)
FROM pg_stat_activity a
WHERE a.pid <> pg_backend_pid() AND a.datname = current_database() AND a.pid IN (
    SELECT l.pid FROM pg_locks l WHERE l.granted AND (
        (l.locktype = 'advisory' AND l.classid::bigint = %s AND l.objid::bigint = %s AND l.objsubid = 1)
        OR (l.locktype = 'relation' AND l.relation IN (
            SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')))))
ORDER BY a.xact_start NULLS LAST
LIMIT 5
"""


def _lock_holders(conn: Any) -> str:
    """Who holds the locks a migration waits for, as PostgreSQL tells (``pg_stat_activity`` shows
    other users' queries only to a superuser or a member of ``pg_read_all_stats``)."""
    key = (_PG_MIGRATION_LOCK >> 32, _PG_MIGRATION_LOCK & 0xFFFF_FFFF)
    try:
        rows = conn.execute(_LOCK_HOLDERS, key).fetchall()
        conn.rollback()
    except Exception as exc:  # best effort: the timeout is the error to report
        return f"the sessions holding them could not be listed ({exc})"
    if not rows:
        return "no session holds them any more (try again)"
    return "held by: " + "; ".join(_describe_session(_cells(row)) for row in rows)


def _cells(row: Any) -> tuple[Any, ...]:
    return tuple(row.values()) if isinstance(row, dict) else tuple(row)


def _describe_session(cells: tuple[Any, ...]) -> str:
    pid, user, app, client, state, since, query, waits_on = cells
    text = f"pid {pid} (user {user}, application {app or '-'}, client {client or 'local'}, {state}"
    text += f", transaction since {since}" if since else ""
    text += f", waiting on pids {list(waits_on)}" if waits_on else ""
    return text + f", last query {query!r})"


#: A row when the ``meta`` table exists (where an unqualified ``meta`` resolves), none when it does not.
_META_EXISTS = {
    "sqlite": "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
    "postgres": "SELECT 1 WHERE to_regclass('meta') IS NOT NULL",
}


def _migrate(conn: Any, dialect: str, param: str, *, target: int, where: str) -> int:
    """Apply the pending migrations' ``dialect`` DDL in the caller's transaction and record the version."""
    if conn.execute(_META_EXISTS[dialect]).fetchone() is None:
        # Only where it is missing: CREATE TABLE, even IF NOT EXISTS, needs the right to create tables
        # (PostgreSQL checks it first), which a user who only reads and writes the rows lacks.
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    found = _read_version(conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone())
    todo = pending(found, target=target, where=where)
    for migration in todo:
        for statement in statements(getattr(migration, dialect)):
            conn.execute(statement)
        if migration.repair is not None:
            migration.repair(conn, dialect, param)
    if todo or found == 0:
        conn.execute(
            f"INSERT INTO meta (key, value) VALUES ('schema_version', {param}) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(max(found, target)),),
        )
    return found


def _read_version(row: Any) -> int:
    # Rows are tuples (sqlite3.Row, psycopg's tuple or dict rows); the value is the only column.
    if row is None:
        return 0
    value = row["value"] if isinstance(row, dict) else row[0]
    return int(value)
