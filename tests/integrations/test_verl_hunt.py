"""verl conversion: widths and samples verl cannot take are named errors, never tracebacks.

Skipped when verl is not installed, except in CI (``CI=true``), where it must be (as test_verl.py).
"""

from __future__ import annotations

import os

import pytest

try:
    import verl  # noqa: F401
except ImportError as exc:  # not installed, or installed without a dependency it imports
    if os.environ.get("CI") == "true":
        raise
    pytest.skip(
        f"verl is not importable ({exc}); see docs/verl.md for the install line", allow_module_level=True
    )

import torch  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

from harnessrl.algorithms import AlgorithmConfig  # noqa: E402
from harnessrl.errors import ConfigError, InvalidBatch  # noqa: E402
from harnessrl.integrations.verl import harnessrl_ppo_loss, samples_to_dataproto, verl_actor_overrides  # noqa: E402
from harnessrl.trajectory import Sample, SampledSpan  # noqa: E402


def samples() -> list[Sample]:
    """Rollout r1: prompt 3 tokens, response part 5; rollout r2 (its 2nd sample): prompt 2, response 1."""
    long = Sample(
        rollout_id="r1",
        input_ids=[1, 2, 3, 10, 11, 5, 6, 12],
        loss_mask=[0, 0, 0, 1, 1, 0, 0, 1],
        behaviour_logprobs=[0, 0, 0, -0.5, -0.25, 0, 0, -1.0],
        spans=[SampledSpan(3, 5, 0, 0), SampledSpan(7, 8, 0, 1)],
        reward=1.0,
        advantage=0.5,
    )
    short = Sample(
        rollout_id="r2",
        input_ids=[1, 2, 20],
        loss_mask=[0, 0, 1],
        behaviour_logprobs=[0, 0, -2.0],
        spans=[SampledSpan(2, 3, 0, 0)],
        reward=0.0,
        sample_index=1,
        advantage=-0.5,
    )
    return [short, long]


@pytest.mark.parametrize(
    "widths",
    [
        {"response_length": 10.0},  # was a TypeError from torch.full
        {"prompt_length": 3.5},  # was blamed on a sample ("more than prompt_length 3.5")
        {"prompt_length": True},
        {"response_length": 0},
        {"prompt_length": -1},
    ],
)
def test_a_width_that_is_not_a_positive_integer_is_a_config_error_naming_it(widths):
    (name,) = widths
    with pytest.raises(ConfigError, match=rf"^{name} is .*not an integer >= 1"):
        samples_to_dataproto(samples(), **widths)
    # control: the same widths as integers that fit build the batch
    data = samples_to_dataproto(samples(), prompt_length=3, response_length=5)
    assert data.batch["responses"].shape == (2, 5)


@pytest.mark.parametrize(
    ("widths", "message"),
    [
        (
            {"prompt_length": 2},
            "sample 0 of rollout r1: its first prompt has 3 tokens, more than prompt_length 2",
        ),
        (
            {"response_length": 4},
            "sample 0 of rollout r1: its response part has 5 tokens, more than response_length 4",
        ),
    ],
)
def test_a_sample_too_long_for_the_widths_is_named(widths, message):
    with pytest.raises(InvalidBatch) as err:
        samples_to_dataproto(samples(), **widths)
    assert str(err.value) == message


def test_a_sample_without_advantage_is_named():
    short, long = samples()
    long.advantage = None
    with pytest.raises(InvalidBatch) as err:
        samples_to_dataproto([short, long])
    assert str(err.value) == "sample 0 of rollout r1 has no advantage"


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32"])
def test_a_dtype_that_is_not_floating_point_is_a_config_error(dtype):
    """``torch.int64`` built the batch with every advantage 0 (0.5 and -0.5 truncated) and the
    log-probs truncated toward 0: a step that learns nothing, silently."""
    with pytest.raises(ConfigError, match=r"^dtype is .*, not a torch floating-point dtype"):
        samples_to_dataproto(samples(), dtype=dtype)
    # control: a floating dtype keeps the advantages
    data = samples_to_dataproto(samples(), dtype=torch.float64)
    assert data.batch["advantages"][:, 0].tolist() == [-0.5, 0.5]


def test_the_actor_overrides_turn_off_an_entropy_bonus_of_the_base_config():
    """``verl_actor_overrides`` are the verl settings that reproduce harnessrl's loss, which has no
    entropy bonus. Applied over a base config that has one (``entropy_coeff: 0.01``, as many verl
    recipes set), they left it on: verl's ``ppo_loss`` subtracted ``0.01 * entropy`` from the loss."""
    base = {"strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 1, "entropy_coeff": 0.01}
    overrides = {
        k.removeprefix("actor."): v
        for k, v in verl_actor_overrides(AlgorithmConfig(), prefix="actor.").items()
    }
    merged = {**base, **overrides}  # what Hydra makes of the base config plus the overrides
    cfg = ActorConfig(policy_loss=PolicyLossConfig(loss_mode=merged.pop("policy_loss.loss_mode")), **merged)

    data = samples_to_dataproto(samples(), dtype=torch.float64)
    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(
        td, dp_size=1, batch_num_tokens=data.meta_info["num_loss_tokens"], global_batch_size=2
    )
    offsets = td["input_ids"].offsets()
    n = int(offsets[-1])
    log_probs = torch.nested.nested_tensor_from_jagged(
        torch.full((n,), -0.4, dtype=torch.float64), offsets=offsets
    )
    entropy = torch.nested.nested_tensor_from_jagged(
        torch.full((n,), 2.0, dtype=torch.float64), offsets=offsets
    )

    without, _ = harnessrl_ppo_loss(cfg, {"log_probs": log_probs}, td)
    with_entropy, metrics = harnessrl_ppo_loss(cfg, {"log_probs": log_probs, "entropy": entropy}, td)
    assert "actor/entropy_loss" in metrics  # control: verl did aggregate the entropy term
    assert abs(float(without)) > 1e-3
    assert float(with_entropy) == float(without)
