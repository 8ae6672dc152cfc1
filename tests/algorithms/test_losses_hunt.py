"""``collate`` refuses samples its rows would score wrong, naming them.

A sample's first token has nothing before it in the sample to predict it: ``token_logprobs`` gives
position 0 of a row the constant 0, and in a packed row the first token of every later sample is
predicted from the end of the sample before it. The trajectory builder never trains a first token,
but a sample file may hold one (``read_samples`` accepts any 0/1 mask), and ``collate`` packed it:
that token was trained on another sample's context.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harnessrl.algorithms import step_totals
from harnessrl.algorithms.losses import collate
from harnessrl.errors import ConfigError, InvalidBatch
from harnessrl.trajectory import Sample, SampledSpan, read_samples, write_samples


def two_samples() -> list[Sample]:
    first = Sample(
        rollout_id="r1",
        input_ids=[5, 6, 7, 8],
        loss_mask=[0, 0, 1, 1],
        behaviour_logprobs=[0.0, 0.0, -0.5, -0.7],
        spans=[SampledSpan(2, 4, 0, 0)],
        advantage=1.0,
    )
    second = Sample(
        rollout_id="r2",
        input_ids=[9, 10, 11],
        loss_mask=[0, 1, 1],
        behaviour_logprobs=[0.0, -0.2, -0.3],
        spans=[SampledSpan(1, 3, 0, 0)],
        advantage=-1.0,
    )
    return [first, second]


@pytest.mark.parametrize("packed", [True, False])
def test_a_sample_file_whose_first_token_is_trained_is_refused_naming_the_sample(tmp_path, packed):
    first, second = two_samples()
    trained_first = dataclasses.replace(
        second, loss_mask=[1, 1, 1], behaviour_logprobs=[-0.1, -0.2, -0.3], spans=[SampledSpan(0, 3, 0, 0)]
    )
    path = write_samples(tmp_path / "step.jsonl", [first, trained_first])
    samples = read_samples(path)  # the file schema accepts it
    assert samples[1].loss_mask == [1, 1, 1]
    with pytest.raises(InvalidBatch) as err:
        collate(samples, step_totals(samples), packed=packed)
    assert (
        str(err.value)
        == "sample 0 of rollout r2: its first token has loss mask 1, but no token before it predicts it"
    )

    # control: the same file with the first token as context collates, one row per layout
    ok = read_samples(write_samples(tmp_path / "ok.jsonl", two_samples()))
    batch = collate(ok, step_totals(ok), packed=packed)
    assert int(batch.loss_mask_B_T.sum()) == 4
    expected = [[0, 1, 2, 3, 0, 1, 2]] if packed else [[0, 1, 2, 3], [0, 1, 2, 0]]
    assert batch.position_ids_B_T.tolist() == expected


@pytest.mark.parametrize("field", ["loss_mask", "behaviour_logprobs"])
def test_per_token_lists_of_another_length_are_refused_naming_the_sample(field):
    first, second = two_samples()
    shorter = dataclasses.replace(second, **{field: getattr(second, field)[:-1]})
    samples = [first, shorter]
    with pytest.raises(
        InvalidBatch, match=r"^sample 0 of rollout r2: input_ids, loss_mask and behaviour_logprobs"
    ):
        collate(samples, step_totals(samples), packed=True, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_a_dtype_that_is_not_floating_point_is_a_config_error(dtype):
    """``torch.int64`` collated an advantage of 0.5 as 0 and the behaviour log-probs truncated
    toward 0."""
    samples = [dataclasses.replace(s, advantage=0.5) for s in two_samples()]
    with pytest.raises(ConfigError, match=r"^dtype is .*, not a torch floating-point dtype"):
        collate(samples, step_totals(samples), dtype=dtype)
    batch = collate(samples, step_totals(samples), dtype=torch.float64)  # control
    assert float(batch.advantages_B_T[0, 2]) == 0.5
