"""Records <-> rows for every SQL backend (SQLite, PostgreSQL): column encodings, the rollout
column list, WHERE clauses from filters, and the lifecycle check made on a row.

Rows come back as ``sqlite3.Row`` or psycopg ``dict_row`` dicts; both are read by column name.

Encoding choices (why):
- JSON columns are TEXT written with ``ensure_ascii=True``: lone surrogates in a harness's request
  body would otherwise fail UTF-8 encoding at bind time, and PostgreSQL's JSONB would reorder keys
  and reject ``\\u0000``; TEXT gives back exactly what was stored.
- Token IDs are little-endian int32 bytes and logprobs little-endian float64 bytes (``array``), in
  a BLOB / BYTEA: 4x/2x smaller than JSON text, decoded by C code, and float64 round-trips every
  Python float bit for bit (``-0.0``, ``inf`` and ``nan`` included), which JSON text does not guarantee.
"""

from __future__ import annotations

import json
import math
import re
import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from harnessrl.errors import BadRequest, InvalidTransition
from harnessrl.schemas import (
    ROLLOUT_TRANSITIONS,
    Call,
    PolicyVersion,
    Rollout,
    RolloutStatus,
    Run,
    Task,
    Usage,
)


class Row(Protocol):
    """A ``sqlite3.Row`` or a psycopg ``dict_row``: read by column name only."""

    def keys(self) -> Any: ...

    def __getitem__(self, key: str) -> Any: ...


# What a store selects for a ``Rollout``; ``pk`` (creation order) is for sorting, not part of the record.
ROLLOUT_COLUMNS = (
    "pk, rollout_id, api_key, run_id, task_id, task, group_id, step, status, outcome, reward, attempt, "
    "worker_id, error, flags, metadata, created_at, started_at, finished_at"
)


# -- codecs ---------------------------------------------------------------------------------------

_BIG_ENDIAN = sys.byteorder == "big"


_SURROGATE = re.compile("[\ud800-\udfff]")


def json_safe(value: Any, non_finite: Callable[[float], Any]) -> Any:
    """``value`` with what strict JSON cannot carry replaced: a lone surrogate (in a key or a string)
    by U+FFFD, a non-finite float by ``non_finite(value)``. Rows written before the gateway's
    boundary was strict may hold either; reads show them this way and migration 3 repairs them."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, float) and not math.isfinite(value):
        return non_finite(value)
    if isinstance(value, dict):
        return {json_safe(k, non_finite): json_safe(v, non_finite) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v, non_finite) for v in value]
    return value


def dump_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def load_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def pack_ints(values: Sequence[int]) -> bytes:
    # struct packs a 16 k-token prompt about twice as fast as array("i", ...) (every call of a
    # rollout stores its whole prompt), and "<" makes it little-endian on every machine.
    try:
        return struct.pack(f"<{len(values)}i", *values)
    except struct.error as exc:
        if all(isinstance(v, int) for v in values):
            raise BadRequest("token ids must fit in int32") from exc
        raise TypeError(f"token ids must be integers: {exc}") from exc


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


def run_from_row(row: Row) -> Run:
    return Run(
        run_id=row["run_id"],
        config=load_json(row["config"]),
        status=row["status"],
        created_at=row["created_at"],
    )


def task_from_row(row: Row) -> Task:
    return Task(task_id=row["task_id"], run_id=row["run_id"], split=row["split"], data=load_json(row["data"]))


def rollout_from_row(row: Row) -> Rollout:
    # .keys(): iterating a sqlite3.Row gives its values, not its column names.
    fields = {key: row[key] for key in row.keys() if key != "pk"}  # noqa: SIM118
    for key in ("task", "flags", "metadata"):
        fields[key] = load_json(fields[key])
    return Rollout.model_validate(fields)


def _usage(stored: dict[str, Any]) -> Usage:
    # Fields a newer writer added are left out, so an older reader of a shared store still reads it.
    return Usage(**{key: value for key, value in stored.items() if key in Usage.model_fields})


def call_from_row(row: Row) -> Call:
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
        usage=None if usage is None else _usage(usage),
        started_at=row["started_at"],
        first_token_at=row["first_token_at"],
        finished_at=row["finished_at"],
    )


def policy_version_from_row(row: Row) -> PolicyVersion:
    return PolicyVersion(
        version=row["version"],
        step=row["step"],
        checkpoint=row["checkpoint"],
        created_at=row["created_at"],
        metadata=load_json(row["metadata"]),
    )


# -- SQL shared by the stores ----------------------------------------------------------------------


def sql_where(mark: str, **filters: Any) -> tuple[str, list[Any]]:
    """A WHERE clause over the non-None filters, with ``mark`` as the placeholder (``?`` or ``%s``);
    a sequence (of statuses) becomes ``IN (...)``, an empty one matches nothing."""
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in filters.items():
        if value is None:
            continue
        # A single RolloutStatus is a str (itself a Sequence), so test for str first.
        if isinstance(value, Sequence) and not isinstance(value, str):
            values = [str(v) for v in value]
            clauses.append(f"{column} IN ({', '.join([mark] * len(values))})" if values else "FALSE")
            params += values
        else:
            clauses.append(f"{column} = {mark}")
            params.append(str(value) if isinstance(value, RolloutStatus) else value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def check_transition(row: Row, to: RolloutStatus) -> None:
    """Raise ``InvalidTransition`` unless the rollout in ``row`` may move to ``to``."""
    current = RolloutStatus(row["status"])
    if to not in ROLLOUT_TRANSITIONS[current]:
        raise InvalidTransition(f"rollout {row['rollout_id']!r} cannot go from {current.value} to {to.value}")
