"""The framework-neutral sample export: JSONL (plain and gzip) and Parquet round trips."""

from __future__ import annotations

import json
from pathlib import Path

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
