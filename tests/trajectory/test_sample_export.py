"""The framework-neutral sample export: JSONL (plain and gzip) and Parquet round trips."""

from __future__ import annotations

import json
import math
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harnessrl.errors import InvalidSampleFile
from harnessrl.trajectory import FORMAT, Sample, SampledSpan, read_samples, write_samples
from harnessrl.trajectory.export import row_to_sample, sample_to_row


@st.composite
def samples(draw):
    n_prompt = draw(st.integers(1, 5))
    n_resp = draw(st.integers(1, 5))
    n = n_prompt + n_resp
    return Sample(
        rollout_id=draw(st.text(min_size=1, max_size=8)),
        input_ids=draw(st.lists(st.integers(0, 200_000), min_size=n, max_size=n)),
        loss_mask=[0] * n_prompt + [1] * n_resp,
        behaviour_logprobs=[0.0] * n_prompt
        + draw(st.lists(st.floats(-50, 0, allow_nan=False), min_size=n_resp, max_size=n_resp)),
        spans=[SampledSpan(n_prompt, n, draw(st.integers(0, 9)), draw(st.integers(0, 99)))],
        reward=draw(st.one_of(st.none(), st.floats(-1, 1))),
        group_id=draw(st.one_of(st.none(), st.text(max_size=5))),
        task_id=draw(st.one_of(st.none(), st.text(max_size=5))),
        step=draw(st.one_of(st.none(), st.integers(0, 1000))),
        sample_index=draw(st.integers(0, 5)),
        advantage=draw(st.one_of(st.none(), st.floats(-5, 5))),
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".parquet"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(samples(), max_size=4))
def test_round_trip_is_exact(tmp_path, suffix, batch):
    path = write_samples(tmp_path / f"step{suffix}", batch)
    assert read_samples(path) == batch


def test_jsonl_row_is_documented_shape(tmp_path):
    sample = Sample(
        rollout_id="r1",
        input_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        behaviour_logprobs=[0.0, -0.5, -0.25],
        spans=[SampledSpan(1, 3, 7, 0)],
        reward=1.0,
        group_id="g",
        advantage=0.5,
    )
    path = write_samples(tmp_path / "s.jsonl", [sample])
    row = json.loads(path.read_text().splitlines()[0])
    assert row["format"] == FORMAT
    assert row["spans"] == [{"start": 1, "end": 3, "policy_version": 7, "call_seq": 0}]
    assert set(row) == {
        "format", "rollout_id", "group_id", "task_id", "step", "sample_index", "reward", "advantage",
        "input_ids", "loss_mask", "behaviour_logprobs", "spans",
    }  # fmt: skip


def test_unknown_suffix_and_bad_rows_are_rejected(tmp_path):
    with pytest.raises(InvalidSampleFile):
        write_samples(tmp_path / "s.csv", [])
    (tmp_path / "bad.jsonl").write_text(json.dumps({"format": "other"}) + "\n")
    with pytest.raises(InvalidSampleFile):
        read_samples(tmp_path / "bad.jsonl")
    (tmp_path / "short.jsonl").write_text(
        json.dumps({"format": FORMAT, "rollout_id": "r", "input_ids": [1, 2], "loss_mask": [0],
                    "behaviour_logprobs": [0.0, 0.0], "spans": []}) + "\n"
    )  # fmt: skip
    with pytest.raises(InvalidSampleFile):
        read_samples(tmp_path / "short.jsonl")


def test_documented_example_row_parses():
    doc = (Path(__file__).parents[2] / "docs" / "export-format.md").read_text()
    line = doc.split("```json\n")[1].split("\n")[0]
    sample = row_to_sample(json.loads(line))
    assert sample.input_ids[sample.spans[1].start : sample.spans[1].end] == [8, 9]
    assert sample_to_row(sample) == json.loads(line)


def one_token_sample(rollout_id: str = "r1", **fields: object) -> Sample:
    fields = {"reward": 1.0, "advantage": 0.5, **fields}
    return Sample(
        rollout_id=rollout_id, input_ids=[5], loss_mask=[1], behaviour_logprobs=[-0.5],
        spans=[SampledSpan(0, 1, 0, 0)], **fields,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("field", ["reward", "advantage", "behaviour_logprobs"])
def test_jsonl_refuses_a_number_strict_json_cannot_hold_and_parquet_keeps_it(
    tmp_path: Path, field: str, value: float
) -> None:
    """JSONL is for any reader, and strict ones (orjson, serde_json) reject ``NaN`` / ``Infinity``
    tokens: such a sample is refused naming it and the field, and no partial file is left that would
    read back as fewer samples. Parquet holds float64 and keeps the value exactly."""
    bad = one_token_sample("r-bad", sample_index=2)
    if field == "behaviour_logprobs":
        bad.behaviour_logprobs = [value]
    else:
        setattr(bad, field, value)
    path = tmp_path / "step.jsonl"
    with pytest.raises(
        InvalidSampleFile, match=rf"sample 1 \(rollout 'r-bad', sample_index 2\).* in {field}\b"
    ):
        write_samples(path, [one_token_sample(), bad])
    assert not path.exists()

    [back] = read_samples(write_samples(tmp_path / "step.parquet", [bad]))
    kept = back.behaviour_logprobs[0] if field == "behaviour_logprobs" else getattr(back, field)
    assert repr(kept) == repr(value)  # nan == nan is False; repr tells nan, inf and -inf apart


def test_jsonl_is_strict_json_a_strict_reader_parses(tmp_path: Path) -> None:
    path = write_samples(tmp_path / "step.jsonl", [one_token_sample(), one_token_sample("r2", reward=-0.0)])
    assert [orjson.loads(line)["rollout_id"] for line in path.read_text().splitlines()] == ["r1", "r2"]


GOOD_ROW = json.dumps(sample_to_row(one_token_sample()))


def with_fields(**fields: object) -> str:
    return json.dumps({**sample_to_row(one_token_sample()), **fields})


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("[1, 2]", "must be an object, got list"),
        ("null", "must be an object, got NoneType"),
        ('"a string"', "must be an object, got str"),
        ('{"format": "harnessrl.samples/v1", ', "not JSON"),
        (with_fields(loss_mask=[7]), "loss_mask entries must be 0 or 1"),
        (with_fields(spans=[{"start": 5, "end": 99, "policy_version": 0, "call_seq": 0}]), r"span \[5, 99\)"),
        (with_fields(spans=[{"start": 1, "end": 0, "policy_version": 0, "call_seq": 0}]), r"span \[1, 0\)"),
        (with_fields(spans=[[0, 1, 0, 0]]), "malformed sample row"),
        (with_fields(reward="high"), "reward must be a number"),
        (with_fields(step="7"), "step must be an integer"),
        (with_fields(rollout_id=7), "rollout_id must be a string"),
    ],
    ids=[
        "list",
        "null",
        "string",
        "not-json",
        "mask-7",
        "span-past-end",
        "span-backwards",
        "span-not-object",
        "reward-string",
        "step-string",
        "rollout-id-int",
    ],
)
def test_a_malformed_row_is_an_invalid_sample_file_naming_its_line(
    tmp_path: Path, line: str, reason: str
) -> None:
    """The reader's one error for a file not in the format (it raised AttributeError or
    JSONDecodeError, or accepted a mask of 7 and a span past the sample's end), with where it is."""
    path = tmp_path / "step.jsonl"
    path.write_text(f"{GOOD_ROW}\n\n{line}\n")
    with pytest.raises(InvalidSampleFile, match=rf"step\.jsonl line 3: .*{reason}"):
        read_samples(path)
