"""The SQLite schema, its migrations, and the column and row codecs ``SQLiteStore`` uses.

Kept apart from ``sqlite.py`` so the store module reads as the protocol's behaviour, and so a
migration is a reviewable diff of this file alone.

Encoding choices (why):
- JSON columns are TEXT written with ``ensure_ascii=True``: lone surrogates in a harness's request
  body would otherwise fail UTF-8 encoding at bind time.
- Token IDs are little-endian int32 bytes and logprobs little-endian float64 bytes (``array``):
  4x/2x smaller than JSON text, decoded by C code, and float64 round-trips every Python float
  bit for bit (``-0.0``, ``inf`` and ``nan`` included), which JSON text does not guarantee.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from harnessrl.errors import BadRequest, HarnessRLError
from harnessrl.schemas import Call, PolicyVersion, Rollout, Run, Task, Usage

SCHEMA_VERSION = 1

# MIGRATIONS[i] upgrades a database from schema version i to i + 1; version 0 is an empty file.
# Append a new script (never edit an old one) and bump SCHEMA_VERSION to change the schema.
# Statements are split on ";", so a script must not contain one inside a statement (e.g. a trigger).
MIGRATIONS: list[str] = [
    """
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
    """,
]
assert len(MIGRATIONS) == SCHEMA_VERSION


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the database to ``SCHEMA_VERSION``. The caller holds a write transaction, so two
    processes opening a fresh file at once cannot both run a migration."""
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = int(row[0]) if row else 0
    if version > SCHEMA_VERSION:
        raise HarnessRLError(
            f"store schema version {version} is newer than this harnessrl understands "
            f"({SCHEMA_VERSION}); upgrade harnessrl"
        )
    for script in MIGRATIONS[version:]:
        # executescript would COMMIT our transaction first, so run the statements one by one.
        for statement in script.split(";"):
            if statement.strip():
                conn.execute(statement)
    conn.execute(
        "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (str(SCHEMA_VERSION),),
    )


# -- codecs ---------------------------------------------------------------------------------------

_BIG_ENDIAN = sys.byteorder == "big"


def dump_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def load_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def pack_ints(values: Sequence[int]) -> bytes:
    try:
        arr = array("i", values)
    except OverflowError as exc:
        raise BadRequest("token ids must fit in int32") from exc
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


def unpack_ints(blob: bytes) -> list[int]:
    arr = array("i")
    arr.frombytes(blob)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tolist()


def pack_floats(values: Sequence[float]) -> bytes:
    arr = array("d", values)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


def unpack_floats(blob: bytes) -> list[float]:
    arr = array("d")
    arr.frombytes(blob)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tolist()


assert array("i").itemsize == 4 and array("d").itemsize == 8


# -- records <-> rows -------------------------------------------------------------------------------


def rollout_to_row(rollout: Rollout) -> dict[str, Any]:
    row = rollout.model_dump()
    row.update(status=rollout.status.value, outcome=rollout.outcome and rollout.outcome.value)
    for key in ("task", "flags", "metadata"):
        row[key] = dump_json(row[key])
    return row


def call_to_row(call: Call) -> dict[str, Any]:
    row = call.model_dump(exclude={"prompt_token_ids", "response_token_ids", "response_logprobs"})
    row.update(
        request=dump_json(call.request),
        response=dump_json(call.response),
        usage=None if call.usage is None else dump_json(row["usage"]),
        prompt_token_ids=pack_ints(call.prompt_token_ids),
        response_token_ids=pack_ints(call.response_token_ids),
        response_logprobs=pack_floats(call.response_logprobs),
    )
    return row


# -- rows -> records ---------------------------------------------------------------------------------


def run_from_row(row: sqlite3.Row) -> Run:
    return Run(
        run_id=row["run_id"],
        config=load_json(row["config"]),
        status=row["status"],
        created_at=row["created_at"],
    )


def task_from_row(row: sqlite3.Row) -> Task:
    return Task(task_id=row["task_id"], run_id=row["run_id"], split=row["split"], data=load_json(row["data"]))


def rollout_from_row(row: sqlite3.Row) -> Rollout:
    fields = dict(zip(row.keys(), row, strict=True))
    del fields["pk"]
    for key in ("task", "flags", "metadata"):
        fields[key] = load_json(fields[key])
    return Rollout.model_validate(fields)


def call_from_row(row: sqlite3.Row) -> Call:
    usage = load_json(row["usage"])
    # model_construct skips re-validating long token lists this module wrote itself.
    return Call.model_construct(
        call_id=row["call_id"],
        rollout_id=row["rollout_id"],
        seq=row["seq"],
        attempt=row["attempt"],
        api=row["api"],
        request=load_json(row["request"]),
        response=load_json(row["response"]),
        prompt_token_ids=unpack_ints(row["prompt_token_ids"]),
        response_token_ids=unpack_ints(row["response_token_ids"]),
        response_logprobs=unpack_floats(row["response_logprobs"]),
        policy_version=row["policy_version"],
        finish_reason=row["finish_reason"],
        usage=None if usage is None else Usage(**usage),
        started_at=row["started_at"],
        first_token_at=row["first_token_at"],
        finished_at=row["finished_at"],
    )


def policy_version_from_row(row: sqlite3.Row) -> PolicyVersion:
    return PolicyVersion(
        version=row["version"],
        step=row["step"],
        checkpoint=row["checkpoint"],
        created_at=row["created_at"],
        metadata=load_json(row["metadata"]),
    )
