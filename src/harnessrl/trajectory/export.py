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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from harnessrl.errors import ConfigError, InvalidSampleFile
from harnessrl.trajectory.samples import Sample, SampledSpan

FORMAT = "harnessrl.samples/v1"


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
    ``loss_mask`` entry other than 0 or 1, a span outside the sample's tokens."""
    if not isinstance(row, dict):
        raise InvalidSampleFile(f"a sample row must be an object, got {type(row).__name__}")
    if row.get("format") != FORMAT:
        raise InvalidSampleFile(f"not a {FORMAT} row (format={row.get('format')!r})")
    try:
        sample = Sample(
            rollout_id=row["rollout_id"],
            input_ids=[int(x) for x in row["input_ids"]],
            loss_mask=[int(x) for x in row["loss_mask"]],
            behaviour_logprobs=[float(x) for x in row["behaviour_logprobs"]],
            spans=[
                SampledSpan(int(s["start"]), int(s["end"]), int(s["policy_version"]), int(s["call_seq"]))
                for s in row["spans"]
            ],
            reward=row.get("reward"),
            group_id=row.get("group_id"),
            task_id=row.get("task_id"),
            step=row.get("step"),
            sample_index=int(row.get("sample_index") or 0),
            advantage=row.get("advantage"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidSampleFile(f"malformed sample row: {exc}") from exc
    n = len(sample.input_ids)
    if len(sample.loss_mask) != n or len(sample.behaviour_logprobs) != n:
        raise InvalidSampleFile("input_ids, loss_mask and behaviour_logprobs must have one entry per token")
    if any(m not in (0, 1) for m in sample.loss_mask):
        raise InvalidSampleFile(
            f"loss_mask entries must be 0 or 1, got {sorted(set(sample.loss_mask) - {0, 1})}"
        )
    for span in sample.spans:
        if not 0 <= span.start <= span.end <= n:
            raise InvalidSampleFile(
                f"span [{span.start}, {span.end}) (call {span.call_seq}) is outside the sample's {n} tokens"
            )
    if not isinstance(sample.rollout_id, str):
        raise InvalidSampleFile(f"rollout_id must be a string, got {sample.rollout_id!r}")
    for name in ("group_id", "task_id"):
        value = getattr(sample, name)
        if value is not None and not isinstance(value, str):
            raise InvalidSampleFile(f"{name} must be a string or null, got {value!r}")
    for name in ("reward", "advantage"):
        value = getattr(sample, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InvalidSampleFile(f"{name} must be a number or null, got {value!r}")
    if sample.step is not None and (isinstance(sample.step, bool) or not isinstance(sample.step, int)):
        raise InvalidSampleFile(f"step must be an integer or null, got {sample.step!r}")
    return sample


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
    """Write ``samples`` to ``path`` (``.jsonl``, ``.jsonl.gz`` or ``.parquet``); returns the path."""
    path = Path(path)
    rows = (sample_to_row(s) for s in samples)
    if path.suffix == ".parquet":
        pa = _pyarrow()
        table = pa.Table.from_pylist(list(rows), schema=_arrow_schema(pa))
        pa.parquet.write_table(table, path)
    elif path.name.endswith((".jsonl", ".jsonl.gz")):
        try:
            with _open_text(path, "w") as f:
                for index, row in enumerate(rows):
                    f.write(_strict_json(row, index) + "\n")
        except InvalidSampleFile:
            path.unlink(missing_ok=True)  # not a file that reads back as fewer samples than were given
            raise
    else:
        raise InvalidSampleFile(f"unknown sample file type {path.name!r}: use .jsonl, .jsonl.gz or .parquet")
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
        pa = _pyarrow()
        index = 0
        for batch in pa.parquet.ParquetFile(path).iter_batches():
            for row in batch.to_pylist():
                yield _parse(row, path, f"row {index}")
                index += 1
    elif path.name.endswith((".jsonl", ".jsonl.gz")):
        with _open_text(path, "r") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InvalidSampleFile(f"{path} line {number}: not JSON: {exc}") from exc
                yield _parse(row, path, f"line {number}")
    else:
        raise InvalidSampleFile(f"unknown sample file type {path.name!r}: use .jsonl, .jsonl.gz or .parquet")


def _parse(row: Any, path: Path, where: str) -> Sample:
    """``row_to_sample``, its error naming the file and the row's place in it."""
    try:
        return row_to_sample(row)
    except InvalidSampleFile as exc:
        raise InvalidSampleFile(f"{path} {where}: {exc}") from exc


def read_samples(path: str | Path) -> list[Sample]:
    """Read a file written by ``write_samples`` (or by anyone following the v1 schema)."""
    return list(iter_samples(path))
