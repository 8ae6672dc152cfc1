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
- A ``calls`` row is a delta on earlier calls of its rollout attempt (``store.chains`` says what
  each column holds and how a base is chosen); ``calls_from_rows`` folds a rollout's rows back
  into whole ``Call`` records in one pass.
"""

from __future__ import annotations

import json
import math
import re
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from harnessrl.errors import BadRequest, Conflict, HarnessRLError, InvalidTransition
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
from harnessrl.token_ids import int32_bytes


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


# What a TEXT column cannot take from a caller: NUL (PostgreSQL refuses it) and lone surrogates
# (neither driver can encode them as UTF-8; ``os.listdir`` gives them for a file name that is not).
_UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """Free text (an error message, which may quote policy output or name a file the policy made)
    as every backend stores it: a NUL becomes the four characters ``\\x00`` and a lone surrogate
    its escape (``\\udcff``, as ``backslashreplace`` writes it). The same text on every backend,
    and the write that carries it always succeeds."""
    return _UNSTORABLE_TEXT.sub(_escape_unstorable, text)


def _escape_unstorable(match: re.Match[str]) -> str:
    char = match.group()
    return "\\x00" if char == "\x00" else f"\\u{ord(char):04x}"


def is_storable_key(value: str) -> bool:
    """Whether every backend can store and look up ``value`` as it is (no NUL, no lone surrogate)."""
    return _UNSTORABLE_TEXT.search(value) is None


def check_keys(**fields: str | None) -> None:
    """``BadRequest`` naming the first field whose text no backend can store or look up as given
    (a NUL or a lone surrogate). For names and ids (rollout, run, task, group, worker, a call's
    ``finish_reason``): altering one would make it name something else, so it is refused, the same
    on every backend, before any driver sees it."""
    for field, value in fields.items():
        if isinstance(value, str) and not is_storable_key(value):
            shown = value if len(value) <= 80 else value[:80] + "..."
            raise BadRequest(
                f"{field} must not contain NUL or lone surrogate characters, got {shown!r}", param=field
            )


#: The integers a column holds on every backend (SQLite's INTEGER, PostgreSQL's BIGINT): 64-bit.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def check_ints(**fields: int | None) -> None:
    """``BadRequest`` naming the first field whose integer no backend can store or compare (past 64
    bits): SQLite's driver raises ``OverflowError`` for it and PostgreSQL ``bigint out of range``, or
    answers a filter with nothing; the same on every backend instead, before any driver sees it."""
    for field, value in fields.items():
        if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            raise BadRequest(
                f"{field} must be an integer in -2**63..2**63-1 (64-bit), got {value}", param=field
            )


def dump_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def dump_call_json(value: Any) -> str:
    """Compact JSON of a call's request or response: what every model call writes, so orjson (~10x
    ``json.dumps``), falling back to ``dump_json`` for what orjson refuses (integers past 64 bits,
    lone surrogates, non-string keys). A non-finite float, which JSON cannot carry, is written as
    ``null``: what migration 3 made of the ones older rows held. Non-ASCII text is written as UTF-8
    rather than ``\\u`` escapes; both read back the same."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return dump_json(_finite(value))


def _finite(value: Any) -> Any:
    """``value`` with non-finite floats as ``None`` (what orjson writes for them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def load_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def pack_ints(values: Sequence[int]) -> bytes:
    # struct packs a 16 k-token prompt about twice as fast as array("i", ...), and "<" makes it
    # little-endian everywhere; a gateway's prompt (``TokenIds``) usually has its bytes already.
    try:
        return int32_bytes(values)
    except struct.error as exc:
        if all(isinstance(v, int) for v in values):
            raise BadRequest("token ids must fit in int32") from exc
        raise TypeError(f"token ids must be integers: {exc}") from exc


def unpack_ints(blob: bytes | memoryview) -> list[int]:
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


class RolloutUnreadable(Conflict, ValueError):
    """A rollout row the store cannot decode (a disk or a bad writer damaged it): the store refuses
    to guess what it held. ``rollout_id`` names the row, ``column`` what could not be read (a JSON
    column, or ``"row"`` when the decoded columns do not make a rollout). A ``ValueError`` too, as
    the ``JSONDecodeError`` such a read raised before, for readers that caught that. A ``Conflict``
    (the record's state forbids the request): the gateway answers it 409 ``conflict`` naming the
    damage, not 500 ``internal_error``."""

    def __init__(
        self, rollout_id: str, column: str, cause: BaseException, plain: dict[str, Any] | None = None
    ) -> None:
        self.rollout_id = rollout_id
        self.column = column
        self.plain = plain or {}  # the row's columns that are not JSON, as read (see stand_in)
        shown = f"{type(cause).__name__}: {cause}"[:300]
        super().__init__(f"rollout {rollout_id}: its {column} column cannot be read (a damaged row): {shown}")

    def stand_in(self) -> Rollout | None:
        """The rollout as far as its plain columns tell (status, outcome, reward, attempt, error and
        the rest that is not JSON), with no key and its JSON columns empty: for a reader that only
        needs to know how it ended (``Controller.run_until_done``), never for one that writes or
        runs it. None if those columns do not make a rollout either (the damage is in them)."""
        if not self.plain:
            return None
        try:
            return Rollout.model_validate(
                {**self.plain, "api_key": "", "task": {}, "flags": [], "metadata": {}}
            )
        except _DAMAGED_ROLLOUT:
            return None


#: What decoding a damaged rollout row raises before ``rollout_from_row`` names it: JSON that does
#: not parse (``ValueError``, pydantic's ``ValidationError`` too), JSON nested past Python's depth.
_DAMAGED_ROLLOUT = (ValueError, TypeError, KeyError, AttributeError, RecursionError)


def rollout_json(row: Row, column: str) -> Any:
    """One JSON column of a rollout row (``metadata``: a dict; ``flags``: a list), for a write that
    merges into it: ``RolloutUnreadable`` if it is damaged, so no write builds on a guess."""
    kind = {"metadata": dict, "flags": list, "task": dict}[column]
    try:
        value = load_json(row[column])
    except _DAMAGED_ROLLOUT as exc:
        raise RolloutUnreadable(str(row["rollout_id"]), column, exc) from exc
    if value is None and column == "flags":
        return []
    if not isinstance(value, kind):
        raise RolloutUnreadable(str(row["rollout_id"]), column, TypeError(f"not a JSON {kind.__name__}"))
    return value


#: A rollout row's JSON columns: what a damaged row fails to decode (the rest are plain values).
_JSON_ROLLOUT_COLUMNS = ("task", "flags", "metadata")


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    """A row's columns that are not JSON (``RolloutUnreadable.stand_in``): made only for a damaged
    row, never on the key lookup every model call makes."""
    return {key: value for key, value in fields.items() if key not in _JSON_ROLLOUT_COLUMNS}


def rollout_from_row(row: Row) -> Rollout:
    """The rollout a row holds; ``RolloutUnreadable`` naming the row and column if it is damaged."""
    # .keys(): iterating a sqlite3.Row gives its values, not its column names.
    fields = {key: row[key] for key in row.keys() if key != "pk"}  # noqa: SIM118
    for key in _JSON_ROLLOUT_COLUMNS:
        try:
            fields[key] = load_json(fields[key])
        except _DAMAGED_ROLLOUT as exc:
            raise RolloutUnreadable(str(fields["rollout_id"]), key, exc, _plain(fields)) from exc
    try:
        return Rollout.model_validate(fields)
    except _DAMAGED_ROLLOUT as exc:
        raise RolloutUnreadable(str(fields["rollout_id"]), "row", exc, _plain(fields)) from exc


def usage_from_json(text: str | None) -> Usage | None:
    stored = load_json(text)
    if stored is None:
        return None
    # Fields a newer writer added are left out, so an older reader of a shared store still reads it.
    return Usage(**{key: value for key, value in stored.items() if key in Usage.model_fields})


#: ``request`` of a row whose request frame is its request base's (a request is a JSON object, never null).
SAME_FRAME = "null"


@dataclass(frozen=True, slots=True)
class UnfoldedCall:
    """A stored call's delta-encoded parts made whole again (what a later row's delta extends)."""

    tokens: bytes  # the whole prompt's token IDs then the response's, packed int32
    prompt_bytes: int  # how many of ``tokens``' bytes are the prompt's
    key: str | None  # the request's history key (``messages`` / ``input``), or None
    frame: str  # the request's JSON with its history list set to null (the whole request if no key)
    items: tuple[str, ...]  # the history list's items as JSON texts


def unfold_rows(
    rows: Iterable[Row], *, last_use: Mapping[int, int] | None = None
) -> Iterator[tuple[Row, UnfoldedCall]]:
    """Each ``calls`` row with its whole prompt tokens and request parts, in one pass.

    ``rows``: one rollout's rows (or one attempt's) in ``seq`` order. A row's bases are earlier
    rows of its attempt, so each row is made whole from rows already unfolded: reading a rollout
    costs what it returns, however long its chains are. A base that is not among the earlier rows
    means the store was damaged (or rows were left out): that raises rather than guess.

    ``last_use`` (one rollout's rows): seq -> the last seq whose row names it as a base. A row is
    then kept only until that row is unfolded, so a reader that takes the calls one at a time holds
    a few whole calls, not every one (the dashboard's trace of 1,000 calls of 40 k tokens).
    """
    done: dict[tuple[str, int], UnfoldedCall] = {}
    for row in rows:
        rollout_id, seq = row["rollout_id"], row["seq"]
        prompt = bytes(row["prompt_token_ids"])
        if row["prompt_base_seq"] is not None:
            prompt = _earlier(done, rollout_id, seq, row["prompt_base_seq"]).tokens + prompt
        if len(prompt) != 4 * row["prompt_len"] and not _written_whole(row):
            raise HarnessRLError(
                f"call {rollout_id}/{seq}: its prompt has {len(prompt) // 4} tokens, the row says "
                f"{row['prompt_len']}: the store is damaged"
            )
        frame, items = row["request"], ()
        if row["request_base_seq"] is not None:
            base = _earlier(done, rollout_id, seq, row["request_base_seq"])
            used = row["request_base_items"]
            items = base.items if used is None else base.items[:used]
            if frame == SAME_FRAME:
                frame = base.frame
        elif frame == SAME_FRAME:
            raise HarnessRLError(f"call {rollout_id}/{seq}: its request names no base: the store is damaged")
        if row["request_items"]:  # "" is no new item (a JSON text is never empty)
            items = items + tuple(row["request_items"].split("\n"))
        unfolded = UnfoldedCall(
            prompt + bytes(row["response_token_ids"]), len(prompt), row["request_key"], frame, items
        )
        if last_use is None or seq in last_use:
            done[(rollout_id, seq)] = unfolded
        if last_use is not None:
            for base in {row["prompt_base_seq"], row["request_base_seq"]} - {None}:
                if last_use.get(base) == seq:
                    done.pop((rollout_id, base), None)
        yield row, unfolded


def _written_whole(row: Row) -> bool:
    """Whether ``row`` is a whole call as versions 1-3 stored it, written into a chained store by an
    older harnessrl (its insert names no chain column; ``prompt_len`` had a default until schema 8,
    whose migration repairs such rows): the whole prompt, the whole request. Read as migration 4
    reads such rows, instead of failing the rollout's every read and write."""
    return row["prompt_len"] == 0 and all(
        row[column] is None
        for column in (
            "prompt_base_seq",
            "request_key",
            "request_items",
            "request_base_seq",
            "request_base_items",
        )
    )


def _earlier(done: dict[tuple[str, int], UnfoldedCall], rollout_id: str, seq: int, base: int) -> UnfoldedCall:
    found = done.get((rollout_id, base))
    if found is None or base >= seq:
        raise HarnessRLError(f"call {rollout_id}/{seq}: its base call {base} is not among the rows read")
    return found


def calls_from_rows(rows: Iterable[Row]) -> list[Call]:
    """``calls`` rows of one rollout (all of it, or whole attempts), in ``seq`` order, as ``Call``s
    equal to what was added. The one decoder of call rows: every reader of the table uses it."""
    return [_call(row, unfolded) for row, unfolded in unfold_rows(rows)]


def iter_calls_from_rows(rows: Iterable[Row], *, last_use: Mapping[int, int] | None = None) -> Iterator[Call]:
    """``calls_from_rows`` one call at a time; ``last_use`` as ``unfold_rows`` takes it."""
    for row, unfolded in unfold_rows(rows, last_use=last_use):
        yield _call(row, unfolded)


def call_from_row(row: Row) -> Call:
    """One self-contained row (no base: the first call of an attempt, say); a row that is a delta
    raises: decode a rollout's rows together with ``calls_from_rows``."""
    [call] = calls_from_rows([row])
    return call


class CallUnreadable(Conflict, ValueError):
    """A call row whose columns cannot be decoded (a disk or a bad writer damaged it), naming the
    call (``rollout_id``, ``seq``), its ``attempt`` and the ``column``. A ``ValueError`` too, as the
    ``JSONDecodeError`` such a read raised before, for readers that caught that; a ``Conflict`` as
    ``RolloutUnreadable``: a gateway that reads the rollout's calls to serve a model call (a history
    it had not loaded) answers 409 naming the damage, not a 500 the harness's SDK retries."""

    def __init__(self, row: Row, column: str, cause: BaseException) -> None:
        self.rollout_id, self.seq, self.attempt, self.column = (
            str(row["rollout_id"]),
            row["seq"],
            row["attempt"],
            column,
        )
        shown = f"{type(cause).__name__}: {cause}"[:300]
        super().__init__(
            f"call {self.rollout_id}/{self.seq} (attempt {self.attempt}): its {column} column cannot be "
            f"read (a damaged row): {shown}"
        )


def _call(row: Row, unfolded: UnfoldedCall) -> Call:
    try:
        return _decode_call(row, unfolded)
    except _DAMAGED_ROLLOUT as exc:  # decoded again column by column, only to name the damaged one
        raise CallUnreadable(row, _damaged_column(row, unfolded), exc) from exc


def _damaged_column(row: Row, unfolded: UnfoldedCall) -> str:
    """Which of a call row's columns ``_decode_call`` failed on ("row" if none alone does)."""
    tokens = memoryview(unfolded.tokens)

    def request() -> None:
        frame = json.loads(unfolded.frame)
        if unfolded.key is not None:
            frame[unfolded.key] = json.loads("[" + ",".join(unfolded.items) + "]")

    checks: tuple[tuple[str, Callable[[], object]], ...] = (
        ("request", request),
        ("response", lambda: load_json(row["response"])),
        ("prompt_token_ids", lambda: unpack_ints(tokens[: unfolded.prompt_bytes])),
        ("response_token_ids", lambda: unpack_ints(tokens[unfolded.prompt_bytes :])),
        ("response_logprobs", lambda: unpack_floats(row["response_logprobs"])),
        ("usage", lambda: usage_from_json(row["usage"])),
    )
    for column, check in checks:
        try:
            check()
        except _DAMAGED_ROLLOUT:
            return column
    return "row"


def _decode_call(row: Row, unfolded: UnfoldedCall) -> Call:
    request = json.loads(unfolded.frame)
    if unfolded.key is not None:
        request[unfolded.key] = json.loads("[" + ",".join(unfolded.items) + "]")
    tokens = memoryview(unfolded.tokens)
    # model_construct skips re-validating long token lists this module wrote itself.
    return Call.model_construct(
        call_id=row["call_id"],
        rollout_id=row["rollout_id"],
        seq=row["seq"],
        attempt=row["attempt"],
        api=row["api"],
        request=request,
        response=load_json(row["response"]),
        prompt_token_ids=unpack_ints(tokens[: unfolded.prompt_bytes]),
        response_token_ids=unpack_ints(tokens[unfolded.prompt_bytes :]),
        response_logprobs=unpack_floats(row["response_logprobs"]),
        policy_version=row["policy_version"],
        finish_reason=row["finish_reason"],
        usage=usage_from_json(row["usage"]),
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
            check_keys(**{column: value})
            check_ints(**{column: value})
            clauses.append(f"{column} = {mark}")
            params.append(str(value) if isinstance(value, RolloutStatus) else value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def check_transition(row: Row, to: RolloutStatus) -> None:
    """Raise ``InvalidTransition`` unless the rollout in ``row`` may move to ``to``."""
    current = RolloutStatus(row["status"])
    if to not in ROLLOUT_TRANSITIONS[current]:
        raise InvalidTransition(f"rollout {row['rollout_id']!r} cannot go from {current.value} to {to.value}")
