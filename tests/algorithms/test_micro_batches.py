"""Step totals and packing a step's samples into micro-batches by token budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harnessrl.algorithms import pack_micro_batches, step_totals
from harnessrl.errors import ConfigError, InvalidBatch
from harnessrl.trajectory import Sample


def sample(rid: str, i: int, n: int, loss: int) -> Sample:
    return Sample(rollout_id=rid, input_ids=[0] * n, loss_mask=[0] * (n - loss) + [1] * loss,
                  behaviour_logprobs=[0.0] * n, spans=[], sample_index=i)  # fmt: skip


lengths = st.lists(st.tuples(st.integers(0, 4), st.integers(1, 30)), min_size=1, max_size=20)


@given(lengths, st.integers(30, 80))
def test_packing_respects_budget_and_keeps_every_sample_once(spec, budget):
    samples = [sample(f"r{r}", i, n, 1) for i, (r, n) in enumerate(spec)]
    bins = pack_micro_batches(samples, budget)
    assert all(sum(len(s) for s in b) <= budget for b in bins)
    flat = [id(s) for b in bins for s in b]
    assert sorted(flat) == sorted(id(s) for s in samples)
    # first-fit decreasing never needs more than 2x the lower bound (here: +1 slack for rounding)
    assert len(bins) <= 2 * -(-sum(len(s) for s in samples) // budget) + 1
    assert pack_micro_batches(samples, budget) == bins  # deterministic


def test_sample_longer_than_budget_is_a_config_error():
    with pytest.raises(ConfigError):
        pack_micro_batches([sample("a", 0, 10, 1)], 5)


def test_step_totals_count_per_rollout_and_sample():
    samples = [sample("a", 0, 5, 2), sample("b", 0, 5, 3), sample("a", 1, 5, 4), sample("c", 0, 3, 0)]
    totals = step_totals(samples)
    assert totals.rollout_ids == ("a", "b", "c")
    assert totals.rollout_token_counts_R == (6, 3, 0)
    assert totals.sample_token_counts_S == (2, 3, 4, 0)
    assert (totals.num_rollouts, totals.num_samples, totals.num_loss_tokens) == (2, 3, 9)
    assert totals.rollout_index(samples[2]) == 0 and totals.sample_index(samples[2]) == 2
    with pytest.raises(InvalidBatch):
        step_totals([sample("a", 0, 5, 2), sample("a", 0, 5, 2)])
