"""The framework-neutral sample export: JSONL (plain and gzip) and Parquet round trips."""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harnessrl.errors import InvalidSampleFile
from harnessrl.trajectory import FORMAT, Sample, SampledSpan, iter_samples, read_samples, write_samples
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


def without(field: str) -> str:
    return json.dumps({k: v for k, v in sample_to_row(one_token_sample()).items() if k != field})


SPAN = {"start": 0, "end": 1, "policy_version": 0, "call_seq": 0}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (with_fields(loss_mask=[0.5]), r"loss_mask must be a list of integers, got 0\.5 at index 0"),
        (with_fields(loss_mask=[True]), "loss_mask must be a list of integers, got True"),
        (with_fields(input_ids=[1.9]), r"input_ids must be a list of token ids .*, got 1\.9"),
        (with_fields(input_ids=["1"]), "input_ids must be a list of token ids .*, got '1'"),
        (with_fields(input_ids=[True]), "input_ids must be a list of token ids .*, got True"),
        (with_fields(input_ids="5"), "input_ids must be a list of token ids .*, got '5'"),
        # Read back fine before, then failed (or indexed out of range) on the trainer's device.
        (with_fields(input_ids=[-7]), "input_ids must be a list of token ids .*, got -7"),
        (with_fields(input_ids=[2**70]), "input_ids must be a list of token ids .*, got 1180591620717411303424"),
        (with_fields(behaviour_logprobs=["-0.5"]), "behaviour_logprobs must be a list of numbers"),
        (with_fields(behaviour_logprobs=[False]), "behaviour_logprobs must be a list of numbers"),
        (GOOD_ROW.replace("-0.5", "1" + "0" * 400), "behaviour_logprobs"),
        (with_fields(sample_index=1.7), r"sample_index must be a non-negative integer, got 1\.7"),
        (with_fields(sample_index=-1), "sample_index must be a non-negative integer, got -1"),
        (without("sample_index"), "missing field 'sample_index'"),
        (with_fields(spans=[{**SPAN, "start": 0.9}]), "span 0 must be an object of integers"),
        (with_fields(spans=[{**SPAN, "policy_version": "7"}]), "span 0 must be an object of integers"),
        (with_fields(spans=[{**SPAN, "call_seq": None}]), "span 0 must be an object of integers"),
        (with_fields(step=True), "step must be an integer"),
        (with_fields(reward=False), "reward must be a number"),
    ],
    ids=[
        "mask-half", "mask-bool", "id-float", "id-string", "id-bool", "ids-string", "id-negative",
        "id-huge", "logprob-string",
        "logprob-bool", "logprob-huge-int", "index-float", "index-negative", "index-missing",
        "span-start-float", "span-version-string", "span-seq-null", "step-bool", "reward-bool",
    ],
)  # fmt: skip
def test_a_value_of_the_wrong_type_is_refused_not_converted(tmp_path: Path, line: str, reason: str) -> None:
    """Types are checked before anything is converted: the reader turned a loss_mask of 0.5 into 0
    (a trained token silently dropped), token IDs 1.9, "1" and true into 1, a sample_index of 1.7
    into 1 and a missing one into 0, a span start of 0.9 into 0 and a policy_version "7" into 7."""
    path = tmp_path / "step.jsonl"
    path.write_text(f"{GOOD_ROW}\n{line}\n")
    with pytest.raises(InvalidSampleFile, match=rf"step\.jsonl line 2: .*{reason}"):
        read_samples(path)


def test_a_value_in_an_error_is_shown_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "step.jsonl"
    path.write_text(with_fields(rollout_id=[[[[[[["deep"]]]]]]] + [0] * 100_000) + "\n")
    with pytest.raises(InvalidSampleFile, match="rollout_id must be a string") as raised:
        read_samples(path)
    assert len(str(raised.value)) < 300


def jsonl_gz(tmp_path: Path) -> Path:
    return write_samples(tmp_path / "step.jsonl.gz", [one_token_sample(f"r{i}") for i in range(200)])


def damaged_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """A damaged file of each kind, and what the reader's error must say about where."""
    files: dict[str, tuple[Path, str]] = {}
    whole = jsonl_gz(tmp_path).read_bytes()
    (tmp_path / "truncated.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    files["truncated-gzip"] = (tmp_path / "truncated.jsonl.gz", r" line \d+: not readable gzip data")
    (tmp_path / "plain.jsonl.gz").write_text(GOOD_ROW + "\n")
    files["not-gzip"] = (tmp_path / "plain.jsonl.gz", " line 1: not readable gzip data")
    (tmp_path / "latin1.jsonl").write_bytes(
        GOOD_ROW.encode() + b"\n" + GOOD_ROW.encode().replace(b'"r1"', b'"caf\xe9"')  # Latin-1, not UTF-8
    )
    files["not-utf8"] = (tmp_path / "latin1.jsonl", " line 2: not UTF-8 text")
    (tmp_path / "nested.jsonl").write_text(GOOD_ROW + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    files["nested-json"] = (tmp_path / "nested.jsonl", " line 2: JSON nested too deeply")
    (tmp_path / "garbage.parquet").write_bytes(b"not parquet at all\n" * 10)
    files["garbage-parquet"] = (tmp_path / "garbage.parquet", ": not readable Parquet data")
    whole = write_samples(
        tmp_path / "whole.parquet", [one_token_sample(f"r{i}") for i in range(50)]
    ).read_bytes()
    (tmp_path / "truncated.parquet").write_bytes(whole[: len(whole) // 2])
    files["truncated-parquet"] = (tmp_path / "truncated.parquet", ": not readable Parquet data")
    return files


@pytest.mark.parametrize(
    "kind", ["truncated-gzip", "not-gzip", "not-utf8", "nested-json", "garbage-parquet", "truncated-parquet"]
)
def test_a_damaged_file_is_an_invalid_sample_file_naming_it(tmp_path: Path, kind: str) -> None:
    """The reader raised EOFError, BadGzipFile, UnicodeDecodeError, RecursionError or ArrowInvalid:
    a caller catching the documented InvalidSampleFile saw none of them."""
    path, where = damaged_files(tmp_path)[kind]
    with pytest.raises(InvalidSampleFile, match=re.escape(str(path)) + where):
        read_samples(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".parquet"])
def test_a_missing_file_stays_file_not_found(tmp_path: Path, suffix: str) -> None:
    with pytest.raises(FileNotFoundError):
        read_samples(tmp_path / f"absent{suffix}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cut=st.integers(0, 10_000),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=3),
)
def test_a_damaged_jsonl_gz_reads_or_is_an_invalid_sample_file(tmp_path: Path, cut: int, flips) -> None:
    """Any truncation or corrupted bytes of a gzipped JSONL file: the samples, or InvalidSampleFile."""
    data = bytearray(jsonl_gz(tmp_path).read_bytes())
    for at, mask in flips:
        data[at % len(data)] ^= mask
    path = tmp_path / "damaged.jsonl.gz"
    path.write_bytes(bytes(data[: cut % (len(data) + 1)]))
    with contextlib.suppress(InvalidSampleFile):
        read_samples(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_refused_write_leaves_the_file_already_there_as_it_was(tmp_path: Path, suffix: str) -> None:
    """Refusing a batch (a NaN JSONL cannot hold) deleted the file the path held before."""
    path = tmp_path / f"step{suffix}"
    before = [one_token_sample("r-old")]
    write_samples(path, before)
    bad = one_token_sample("r-bad")
    bad.reward = math.nan
    with pytest.raises(InvalidSampleFile, match="r-bad"):
        write_samples(path, [one_token_sample("r-new"), bad])
    assert read_samples(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # nothing half-written beside it


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".parquet"])
def test_a_write_that_fails_part_way_leaves_no_file_that_reads_back_short(
    tmp_path: Path, suffix: str
) -> None:
    """The samples come from the caller's iterable, which may fail after some were written: a JSONL
    file of the ones before stayed and read back as a shorter batch, without an error."""

    def produce():
        yield one_token_sample("r-1")
        yield one_token_sample("r-2")
        raise RuntimeError("the producer failed")

    path = tmp_path / f"step{suffix}"
    with pytest.raises(RuntimeError, match="the producer failed"):
        write_samples(path, produce())
    assert list(tmp_path.iterdir()) == []

    write_samples(path, [one_token_sample("r-old")])
    with pytest.raises(RuntimeError, match="the producer failed"):
        write_samples(path, produce())
    assert [s.rollout_id for s in read_samples(path)] == ["r-old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_row_training_a_token_no_span_sampled_is_refused(tmp_path: Path, suffix: str) -> None:
    """``loss_mask`` 1 on a tool-output token (between two responses) read back as a sample that
    trained that token as if the policy had sampled it, against a behaviour log-prob of 0.0. A 0
    inside a span (a sampled token left untrained on purpose) still reads."""
    from harnessrl.schemas import Call, Rollout
    from harnessrl.trajectory import build_rollout_samples

    first = Call(
        rollout_id="r",
        seq=0,
        prompt_token_ids=[1, 2],
        response_token_ids=[3, 4],
        response_logprobs=[-0.5, -0.25],
    )
    tool = [50, 51]  # tool output: context, never sampled
    second = Call(
        rollout_id="r",
        seq=1,
        prompt_token_ids=[1, 2, 3, 4, *tool],
        response_token_ids=[5],
        response_logprobs=[-1.0],
    )
    rollout = Rollout(rollout_id="r", api_key="k", reward=1.0)
    (sample,) = build_rollout_samples(rollout, [first, second]).samples
    assert sample.loss_mask == [0, 0, 1, 1, 0, 0, 1]
    good = write_samples(tmp_path / f"good{suffix}", [sample])
    assert read_samples(good) == [sample]

    sample.loss_mask = [0, 0, 1, 1, 0, 1, 1]  # token 5 is tool output
    with pytest.raises(InvalidSampleFile, match=r"loss_mask\[5\] is 1 but no span holds token 5"):
        read_samples(write_samples(tmp_path / f"tool{suffix}", [sample]))
    sample.loss_mask = [0, 0, 1, 0, 0, 0, 1]  # a sampled token left untrained: allowed
    assert read_samples(write_samples(tmp_path / f"untrained{suffix}", [sample])) == [sample]


def test_iterating_a_parquet_file_holds_a_few_samples_not_the_file(tmp_path: Path) -> None:
    """``iter_samples`` gives a Parquet file's samples one at a time, as it does a JSONL file's: it
    converted 65,536 rows (a whole step, usually) to Python objects to give the first one.
    Measured by the Python memory allocated to read the first sample, not by time."""
    import tracemalloc

    n_tokens = 1000
    many = [
        Sample(
            rollout_id=f"r{i}",
            input_ids=list(range(1000 + i, 1000 + i + n_tokens)),
            loss_mask=[0] * 10 + [1] * (n_tokens - 10),
            behaviour_logprobs=[0.0] * 10 + [-0.5] * (n_tokens - 10),
            spans=[SampledSpan(10, n_tokens, 0, 0)],
        )
        for i in range(400)
    ]
    path = write_samples(tmp_path / "step.parquet", many)
    tracemalloc.start()
    try:
        samples_read = iter_samples(path)
        first = next(samples_read)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert first == many[0]
    assert list(samples_read) == many[1:]  # and the rest, in order
    # the whole file as Python objects is ~30 MB; a few rows of it, about 1
    assert peak < 6_000_000, peak
