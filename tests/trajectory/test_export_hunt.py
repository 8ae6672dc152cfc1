"""Reading a JSONL sample file whose line holds an integer of more than 4,300 digits (Python's limit on
converting one): ``InvalidSampleFile`` naming the file and line, as for any line that is not a row,
never the bare ``ValueError`` json raises for it."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from harnessrl.errors import InvalidSampleFile
from harnessrl.trajectory import FORMAT, Sample, SampledSpan, read_samples, write_samples


def sample(rollout_id: str) -> Sample:
    return Sample(
        rollout_id=rollout_id,
        input_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        behaviour_logprobs=[0.0, -0.25, -0.5],
        spans=[SampledSpan(1, 3, 0, 0)],
        sample_index=0,
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
@pytest.mark.parametrize("field", ["input_ids", "behaviour_logprobs", "step"])
def test_an_integer_too_long_to_read_is_an_invalid_sample_file_naming_its_line(
    tmp_path: Path, suffix: str, field: str
) -> None:
    path = write_samples(tmp_path / f"s{suffix}", [sample("r0"), sample("r1")])
    opener = gzip.open if suffix.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert [s.rollout_id for s in read_samples(path)] == ["r0", "r1"]  # the control: it reads whole
    huge = "9" * 5000
    row = json.loads(lines[1])
    assert row["format"] == FORMAT
    text = json.dumps(row)
    if field == "step":
        text = text.replace('"step": null', f'"step": {huge}')
    else:
        text = text.replace(f'"{field}": [', f'"{field}": [{huge}, ', 1)
    assert huge in text
    lines[1] = text
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(InvalidSampleFile, match=re.escape(str(path)) + " line 2: a number too long to read"):
        read_samples(path)


@pytest.mark.parametrize("column", ["timestamp-ms", "timestamp-us", "date32"], ids=lambda c: c)
def test_a_parquet_value_no_python_object_holds_is_an_invalid_sample_file(
    tmp_path: Path, column: str
) -> None:
    """A Parquet file (of another writer) whose date or timestamp column lies past year 9999: pyarrow's
    conversion raised a bare OverflowError out of ``read_samples``."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    typ, value = {
        "timestamp-ms": (pa.timestamp("ms"), 2**60),
        "timestamp-us": (pa.timestamp("us"), 2**62),
        "date32": (pa.date32(), 2**31 - 1),
    }[column]
    good = write_samples(tmp_path / "good.parquet", [sample("r0")])
    table = pq.read_table(good)
    assert [s.rollout_id for s in read_samples(good)] == ["r0"]  # the control: the file read whole
    path = tmp_path / "foreign.parquet"
    pq.write_table(table.append_column("created", pa.array([value], type=typ)), path)
    with pytest.raises(
        InvalidSampleFile, match=re.escape(str(path)) + r" row 0 or after: not readable Parquet data"
    ):
        read_samples(path)
