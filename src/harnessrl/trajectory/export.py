"""A framework-neutral export of a step's samples: JSONL always, Parquet when pyarrow is installed.

One row per sample; the schema (``harnessrl.samples/v1``) is documented in ``docs/export-format.md``.
The format is chosen by the file suffix: ``.jsonl`` (optionally ``.jsonl.gz``) or ``.parquet``.
Floats are stored as float64 so a write/read round trip is exact.

JSONL is strict JSON, so that any reader (orjson, Rust's serde_json, a trainer in another language)
can parse it: a sample holding a NaN or an infinity (a reward, an advantage, a logprob) is refused
there, naming the sample, rather than written as the ``NaN`` / ``Infinity`` tokens only Python's
``json`` reads. Parquet stores float64 and keeps them exactly.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import reprlib
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from harnessrl.errors import ConfigError, InvalidSampleFile
from harnessrl.trajectory.samples import Sample, SampledSpan, loss_token_outside_spans

FORMAT = "harnessrl.samples/v1"

# Values quoted in error messages come from the file: shown cut short (a row may hold a million
# tokens, or lists nested thousands deep).
_shown = reprlib.Repr()
_shown.maxlevel, _shown.maxlist, _shown.maxdict, _shown.maxstring, _shown.maxother = 3, 6, 6, 60, 60


def sample_to_row(sample: Sample) -> dict[str, Any]:
    """The export row of one sample (plain JSON types)."""
    return {
        "format": FORMAT,
        "rollout_id": sample.rollout_id,
        "group_id": sample.group_id,
        "task_id": sample.task_id,
        "step": sample.step,
        "sample_index": sample.sample_index,
        "reward": sample.reward,
        "advantage": sample.advantage,
        "input_ids": list(sample.input_ids),
        "loss_mask": list(sample.loss_mask),
        "behaviour_logprobs": [float(x) for x in sample.behaviour_logprobs],
        "spans": [
            {"start": s.start, "end": s.end, "policy_version": s.policy_version, "call_seq": s.call_seq}
            for s in sample.spans
        ],
    }


def row_to_sample(row: Any) -> Sample:
    """Parse one export row; raises ``InvalidSampleFile`` on an unknown format or a malformed row:
    not an object, a field missing or of the wrong type, per-token lists of different lengths, a
    ``loss_mask`` entry other than 0 or 1, a span outside the sample's tokens.

    Types are checked before anything is converted: converting first turned a ``loss_mask`` of 0.5
    into 0 (a trained token silently dropped), token IDs 1.9, ``"1"`` and ``true`` into 1 and a
    missing ``sample_index`` into 0. Integers must be JSON integers (not booleans, not ``1.0``);
    numbers may be integers or floats.
    """
    if not isinstance(row, dict):
        raise InvalidSampleFile(f"a sample row must be an object, got {type(row).__name__}")
    if row.get("format") != FORMAT:
        raise InvalidSampleFile(f"not a {FORMAT} row (format={_shown.repr(row.get('format'))})")
    # A token id indexes the embedding: a negative one (or one no int64 tensor holds) read back fine
    # and failed, or indexed out of range, only on the trainer's device.
    input_ids = _list_of(row, "input_ids", _is_token_id, "token ids (integers from 0 to 2**63 - 1)")
    loss_mask = _list_of(row, "loss_mask", _is_int, "integers")
    try:
        behaviour_logprobs = [float(x) for x in _list_of(row, "behaviour_logprobs", _is_number, "numbers")]
    except OverflowError as exc:  # a JSON integer of hundreds of digits
        raise InvalidSampleFile(f"malformed sample row: behaviour_logprobs: {exc}") from exc
    spans = [_span(entry, index) for index, entry in enumerate(_list_of(row, "spans", None, "objects"))]
    n = len(input_ids)
    if len(loss_mask) != n or len(behaviour_logprobs) != n:
        raise InvalidSampleFile("input_ids, loss_mask and behaviour_logprobs must have one entry per token")
    if any(m not in (0, 1) for m in loss_mask):
        raise InvalidSampleFile(f"loss_mask entries must be 0 or 1, got {sorted(set(loss_mask) - {0, 1})}")
    for span in spans:
        if not 0 <= span.start <= span.end <= n:
            raise InvalidSampleFile(
                f"span [{span.start}, {span.end}) (call {span.call_seq}) is outside the sample's {n} tokens"
            )
    # Read as is, such a token (tool output, template glue) was trained as if the policy had sampled
    # it, with behaviour log-prob 0.0.
    outside = loss_token_outside_spans(loss_mask, spans)
    if outside is not None:
        raise InvalidSampleFile(
            f"loss_mask[{outside}] is 1 but no span holds token {outside}: only sampled tokens are trained"
        )
    rollout_id = _required(row, "rollout_id")
    if not isinstance(rollout_id, str):
        raise InvalidSampleFile(f"rollout_id must be a string, got {_shown.repr(rollout_id)}")
    for name in ("group_id", "task_id"):
        value = row.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidSampleFile(f"{name} must be a string or null, got {_shown.repr(value)}")
    for name in ("reward", "advantage"):
        value = row.get(name)
        if value is not None and not _is_number(value):
            raise InvalidSampleFile(f"{name} must be a number or null, got {_shown.repr(value)}")
    step = row.get("step")
    if step is not None and not _is_int(step):
        raise InvalidSampleFile(f"step must be an integer or null, got {_shown.repr(step)}")
    sample_index = _required(row, "sample_index")
    if not _is_int(sample_index) or sample_index < 0:
        raise InvalidSampleFile(
            f"sample_index must be a non-negative integer, got {_shown.repr(sample_index)}"
        )
    return Sample(
        rollout_id=rollout_id,
        input_ids=input_ids,
        loss_mask=loss_mask,
        behaviour_logprobs=behaviour_logprobs,
        spans=spans,
        reward=row.get("reward"),
        group_id=row.get("group_id"),
        task_id=row.get("task_id"),
        step=step,
        sample_index=sample_index,
        advantage=row.get("advantage"),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # bool is an int subclass


def _is_token_id(value: Any) -> bool:
    return _is_int(value) and 0 <= value < 2**63


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _required(row: dict[str, Any], name: str) -> Any:
    if name not in row:
        raise InvalidSampleFile(f"malformed sample row: missing field {name!r}")
    return row[name]


def _list_of(row: dict[str, Any], name: str, valid: Callable[[Any], bool] | None, kind: str) -> list[Any]:
    """Field ``name`` of ``row``: a list whose entries all pass ``valid`` (any, if ``None``)."""
    values = _required(row, name)
    if not isinstance(values, list):
        raise InvalidSampleFile(
            f"malformed sample row: {name} must be a list of {kind}, got {_shown.repr(values)}"
        )
    if valid is not None:
        for index, value in enumerate(values):
            if not valid(value):
                raise InvalidSampleFile(
                    f"malformed sample row: {name} must be a list of {kind}, "
                    f"got {_shown.repr(value)} at index {index}"
                )
    return values


_SPAN_FIELDS = ("start", "end", "policy_version", "call_seq")


def _span(entry: Any, index: int) -> SampledSpan:
    if not isinstance(entry, dict) or not all(_is_int(entry.get(name)) for name in _SPAN_FIELDS):
        raise InvalidSampleFile(
            f"malformed sample row: span {index} must be an object of integers "
            f"{', '.join(_SPAN_FIELDS)}, got {_shown.repr(entry)}"
        )
    return SampledSpan(*(entry[name] for name in _SPAN_FIELDS))


def _open_text(path: Path, mode: str) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return path.open(mode, encoding="utf-8")


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise ConfigError("Parquet export needs pyarrow: pip install 'harnessrl[export]'") from exc
    return pyarrow


def _arrow_schema(pa: Any) -> Any:
    span = pa.struct(
        [("start", pa.int64()), ("end", pa.int64()), ("policy_version", pa.int64()), ("call_seq", pa.int64())]
    )
    return pa.schema(
        [
            ("format", pa.string()),
            ("rollout_id", pa.string()),
            ("group_id", pa.string()),
            ("task_id", pa.string()),
            ("step", pa.int64()),
            ("sample_index", pa.int64()),
            ("reward", pa.float64()),
            ("advantage", pa.float64()),
            ("input_ids", pa.list_(pa.int64())),
            ("loss_mask", pa.list_(pa.int8())),
            ("behaviour_logprobs", pa.list_(pa.float64())),
            ("spans", pa.list_(span)),
        ]
    )


def write_samples(path: str | Path, samples: Iterable[Sample]) -> Path:
    """Write ``samples`` to ``path`` (``.jsonl``, ``.jsonl.gz`` or ``.parquet``); returns the path.

    The file is written beside ``path`` under a temporary name and renamed onto it once whole: a
    refused sample or a crash part-way leaves ``path`` as it was (absent, or the file it held), never
    a file that reads back as fewer samples than were given."""
    path = Path(path)
    rows = (sample_to_row(s) for s in samples)
    if path.suffix == ".parquet":
        pa = _pyarrow()

        def write(to: Path) -> None:
            table = pa.Table.from_pylist(list(rows), schema=_arrow_schema(pa))
            pa.parquet.write_table(table, to)

    elif path.name.endswith((".jsonl", ".jsonl.gz")):

        def write(to: Path) -> None:
            with _open_text(to, "w") as f:
                for index, row in enumerate(rows):
                    f.write(_strict_json(row, index) + "\n")

    else:
        raise InvalidSampleFile(f"unknown sample file type {path.name!r}: use .jsonl, .jsonl.gz or .parquet")
    # Same folder (a rename within one file system), and a name ending in ``path``'s (which picks gzip).
    partial = path.with_name(f".partial-{uuid.uuid4().hex}.{path.name}")
    try:
        write(partial)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def _strict_json(row: dict[str, Any], index: int) -> str:
    """``row`` as strict JSON (no ``NaN`` / ``Infinity`` tokens); ``InvalidSampleFile`` naming the
    sample and its fields that hold a non-finite number otherwise."""
    try:
        return json.dumps(row, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        fields = [name for name in ("reward", "advantage") if _non_finite(row[name])]
        fields += ["behaviour_logprobs"] if any(_non_finite(x) for x in row["behaviour_logprobs"]) else []
        raise InvalidSampleFile(
            f"sample {index} (rollout {row['rollout_id']!r}, sample_index {row['sample_index']}) has a "
            f"non-finite number in {', '.join(fields) or 'a field'}, which JSONL (strict JSON) cannot "
            "hold: write .parquet to keep it, or fix the sample"
        ) from exc


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def iter_samples(path: str | Path) -> Iterator[Sample]:
    """Read samples back one at a time (see ``read_samples``)."""
    path = Path(path)
    if path.suffix == ".parquet":
        yield from _parquet_samples(path)
    elif path.name.endswith((".jsonl", ".jsonl.gz")):
        yield from _jsonl_samples(path)
    else:
        raise InvalidSampleFile(f"unknown sample file type {path.name!r}: use .jsonl, .jsonl.gz or .parquet")


# What reading a damaged file raises below us: a gzip stream cut short (EOFError), not gzip at all or
# failing its CRC (BadGzipFile), corrupt deflate data (zlib.error). Each becomes InvalidSampleFile.
_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


def _jsonl_samples(path: Path) -> Iterator[Sample]:
    # Bytes, decoded line by line: a decoding error then names its exact line, where a text stream
    # decodes ahead in chunks.
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        number = 0
        while True:
            try:
                raw = f.readline()
            except _GZIP_ERRORS as exc:
                raise InvalidSampleFile(f"{path} line {number + 1}: not readable gzip data: {exc!r}") from exc
            if not raw:
                return
            number += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidSampleFile(f"{path} line {number}: not UTF-8 text: {exc}") from exc
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidSampleFile(f"{path} line {number}: not JSON: {exc}") from exc
            except ValueError as exc:  # an integer of over 4,300 digits (sys.get_int_max_str_digits)
                raise InvalidSampleFile(f"{path} line {number}: a number too long to read: {exc}") from exc
            except RecursionError as exc:  # arrays or objects nested thousands deep
                raise InvalidSampleFile(f"{path} line {number}: JSON nested too deeply to be a row") from exc
            yield _parse(row, path, f"line {number}")


# A Parquet file is iterated like JSONL, a few samples at a time. It converted 65,536 rows (a whole
# step, usually) to Python objects to give the first sample and decoded its whole row group (the
# file) in Arrow: 600 samples of 2k tokens took 97 MB of Python objects and 74 MB of Arrow memory
# (now 2.6 and 7.4 MB); a step of 10k samples of 16k tokens, over 10 GB.
_PARQUET_ROWS = 16
_PARQUET_BUFFER = 1 << 20


def _parquet_samples(path: Path) -> Iterator[Sample]:
    pa = _pyarrow()
    # What pyarrow raises on bytes it cannot decode; UnicodeDecodeError for a column name or a
    # string value that is not UTF-8; OverflowError and ValueError for a value no Python object
    # holds (a date or timestamp column past year 9999, which escaped as itself).
    undecodable = (pa.ArrowException, OSError, UnicodeDecodeError, OverflowError, ValueError)
    index = 0
    try:
        parquet = pa.parquet.ParquetFile(path, pre_buffer=False, buffer_size=_PARQUET_BUFFER)
        batches = iter(parquet.iter_batches(batch_size=_PARQUET_ROWS))
    except undecodable as exc:
        if _system_error(exc):
            raise
        raise InvalidSampleFile(f"{path}: not readable Parquet data: {exc}") from exc
    while True:
        try:
            batch = next(batches, None)
            rows = [] if batch is None else batch.to_pylist()
        except undecodable as exc:
            if _system_error(exc):
                raise
            raise InvalidSampleFile(f"{path} row {index} or after: not readable Parquet data: {exc}") from exc
        if batch is None:
            return
        for row in rows:
            yield _parse(row, path, f"row {index}")
            index += 1


def _system_error(exc: Exception) -> bool:
    """Whether ``exc`` is the system's (no such file, no permission, a failing disk), which stays as
    it is, rather than pyarrow's word for data it cannot decode: ``ArrowInvalid``, or an ``OSError``
    without an ``errno``."""
    return isinstance(exc, OSError) and exc.errno is not None


def _parse(row: Any, path: Path, where: str) -> Sample:
    """``row_to_sample``, its error naming the file and the row's place in it."""
    try:
        return row_to_sample(row)
    except InvalidSampleFile as exc:
        raise InvalidSampleFile(f"{path} {where}: {exc}") from exc


def read_samples(path: str | Path) -> list[Sample]:
    """Read a file written by ``write_samples`` (or by anyone following the v1 schema)."""
    return list(iter_samples(path))
