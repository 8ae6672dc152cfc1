"""``collate`` refuses a hand-built sample whose loss mask trains a token no span sampled.

The trajectory export and verl refuse such a sample (``trajectory.samples.loss_token_outside_spans``);
the native trainer's ``collate`` packed it: a tool-output token (here the ``[7]`` between two calls)
was trained as if the policy had sampled it, against a behaviour log-prob of 0.0 (probability 1),
pushing the policy toward writing what the tool wrote. A mask 0 inside a span (a sampled token left
untrained) stays allowed.
"""

from __future__ import annotations

import pytest

from harnessrl.algorithms import step_totals
from harnessrl.algorithms.losses import collate
from harnessrl.errors import InvalidBatch
from harnessrl.trajectory import Sample, SampledSpan

# prompt [1, 2] | call 0 sampled [3, 4] | tool output [7] | call 1 sampled [5, 6]
SPANS = [SampledSpan(2, 4, 0, 0), SampledSpan(5, 7, 0, 1)]


def two_call_sample(loss_mask: list[int]) -> Sample:
    return Sample(
        rollout_id="r1",
        input_ids=[1, 2, 3, 4, 7, 5, 6],
        loss_mask=loss_mask,
        behaviour_logprobs=[0.0, 0.0, -0.5, -0.6, 0.0, -0.7, -0.8],
        spans=SPANS,
        sample_index=3,
        advantage=1.0,
    )


@pytest.mark.parametrize("packed", [True, False])
def test_a_tool_output_token_in_the_loss_mask_is_refused_naming_sample_and_token(packed):
    tool_trained = two_call_sample([0, 0, 1, 1, 1, 1, 1])
    with pytest.raises(InvalidBatch) as err:
        collate([tool_trained], step_totals([tool_trained]), packed=packed)
    assert str(err.value) == (
        "sample 3 of rollout r1: loss_mask[4] is 1 but no span holds token 4: only sampled tokens are trained"
    )


@pytest.mark.parametrize("packed", [True, False])
def test_controls_spans_trained_whole_or_in_part_collate(packed):
    whole = two_call_sample([0, 0, 1, 1, 0, 1, 1])
    batch = collate([whole], step_totals([whole]), packed=packed)
    assert batch.loss_mask_B_T.tolist() == [[False, False, True, True, False, True, True]]
    part = two_call_sample([0, 0, 0, 1, 0, 1, 0])  # sampled tokens left untrained: allowed
    assert int(collate([part], step_totals([part]), packed=packed).loss_mask_B_T.sum()) == 2
