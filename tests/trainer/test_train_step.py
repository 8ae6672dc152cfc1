"""``train_step`` on one process: its loss is the sum of its micro-batches', idle rounds (what a rank
with less work runs under torchrun) change nothing, the KL penalty adds its k3 term against a frozen
reference, and ``tis_cap`` truncates the engine/trainer importance weight with the trainer proximal.

The N-rank reducer runs in ``tests/trainer/test_distributed.py`` (the torchrun equivalence test).
"""

from __future__ import annotations

import random

import pytest
import torch

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.algorithms.losses import micro_batch_loss
from harnessrl.algorithms.packing import step_totals
from harnessrl.config import load_raw_config, validate_config
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.errors import ConfigError
from harnessrl.trainer.config import OptimizerConfig, TrainConfig
from harnessrl.trainer.policy import TrainablePolicy
from harnessrl.trainer.prefix_tree import PrefixBatch
from harnessrl.trainer.train_step import OneProcess, micro_batches, train_step
from harnessrl.trajectory import Sample, SampledSpan

MICRO_BATCH_TOKENS = 40  # several micro-batches per step
METRICS = {
    "loss/loss_tokens",
    "loss/clip_fraction",
    "loss/dual_clip_fraction",
    "loss/approx_kl",
    "loss/ratio_mean",
    "loss/ratio_max",
    "loss/importance_weight_mean",
    "loss/importance_weight_max",
    "loss",
    "grad_norm",
    "lr",
    "entropy",
    "train_tokens",
    "loss_tokens",
    "samples",
}


def make_samples(step: int) -> list[Sample]:
    """Four rollouts of one or two samples (12 to 30 tokens) sharing a system prompt; behaviour
    logprobs near the tiny model's own (about -log 4096), so some tokens drift either way."""
    rng = random.Random(step)
    system = [rng.randrange(5, 4096) for _ in range(4)]
    samples = []
    for r, lengths in enumerate([[30, 18], [25], [12, 22], [16]]):
        for i, n in enumerate(lengths):
            prompt = 6
            mask = [0] * prompt + [1] * (n - prompt)
            samples.append(
                Sample(
                    rollout_id=f"s{step}-r{r}",
                    input_ids=system + [rng.randrange(5, 4096) for _ in range(n - len(system))],
                    loss_mask=mask,
                    behaviour_logprobs=[-8.3 + rng.uniform(-0.6, 0.6) if m else 0.0 for m in mask],
                    spans=[SampledSpan(prompt, n, 0, 0)],
                    sample_index=i,
                    advantage=[1.0, -0.6, 0.4, -1.1][r],
                )
            )
    return samples


def new_policy(**kwargs) -> TrainablePolicy:
    return TrainablePolicy(tiny_model_dir(), OptimizerConfig(lr=1e-2), total_steps=4, row_tokens=24, **kwargs)


def step(policy: TrainablePolicy, algorithm: AlgorithmConfig, s: int = 0, **kwargs) -> dict[str, float]:
    return train_step(
        policy, make_samples(s), algorithm, temperature=0.9, micro_batch_tokens=MICRO_BATCH_TOKENS, **kwargs
    )


def weights(policy: TrainablePolicy) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in policy.model.state_dict().items()}


@pytest.mark.parametrize("share", [True, False])
def test_the_step_loss_is_the_sum_of_its_micro_batch_losses(share):
    policy = new_policy(share_prefixes=share)
    samples, algorithm = make_samples(0), AlgorithmConfig()
    totals = step_totals(samples)
    expected = 0.0
    micros = micro_batches(
        samples, totals, MICRO_BATCH_TOKENS, share_prefixes=share, row_tokens=policy.row_tokens
    )
    assert len(micros) > 1
    with torch.no_grad():
        for micro in micros:
            if isinstance(micro, PrefixBatch):
                logprobs, batch = policy.prefix_logprobs(micro, 0.9), micro.entries
            else:
                batch = micro
                logprobs = policy.logprobs(
                    micro.input_ids_B_T, micro.position_ids_B_T, 0.9, micro.loss_mask_B_T
                )
            expected += float(micro_batch_loss(logprobs, batch, totals, algorithm).loss)
    before = weights(policy)
    metrics = policy.train_step(samples, algorithm, temperature=0.9, micro_batch_tokens=MICRO_BATCH_TOKENS)
    assert set(metrics) == METRICS  # one process adds no world_size
    assert metrics["loss"] == pytest.approx(expected, rel=1e-6)
    assert metrics["loss_tokens"] == sum(s.num_loss_tokens for s in samples)
    assert metrics["samples"] == len(samples) and metrics["grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in weights(policy).items())


class BusierRanks(OneProcess):
    """One process that behaves as if another rank had two more micro-batches than it has."""

    def __init__(self) -> None:
        self.syncs: list[bool] = []

    def rounds(self, count: int) -> int:
        return count + 2

    def sync_gradients(self, on: bool) -> None:
        self.syncs.append(on)


@pytest.mark.parametrize("share", [True, False])
def test_idle_rounds_change_neither_metrics_nor_weights(share):
    plain, busy = new_policy(share_prefixes=share), new_policy(share_prefixes=share)
    algorithm = AlgorithmConfig(kl_coef=0.0)
    want = step(plain, algorithm)
    ranks = BusierRanks()
    got = step(busy, algorithm, ranks=ranks)
    assert got == want
    count = len(ranks.syncs) - 2  # the real micro-batches
    assert ranks.syncs == [False] * (count + 1) + [True]  # gradients reduced once, after the last round
    for name, value in weights(plain).items():
        assert torch.equal(weights(busy)[name], value), name


def test_the_kl_penalty_adds_its_k3_term_against_the_frozen_reference():
    with_kl = AlgorithmConfig(kl_coef=0.5, loss_agg="token_mean")
    without = AlgorithmConfig(loss_agg="token_mean")
    policy, free = new_policy(reference_dir=tiny_model_dir()), new_policy()
    reference = {k: v.clone() for k, v in policy.reference.state_dict().items()}
    # Step 1: the policy is its reference, so k3 and its gradient are 0: both take the same step.
    first, first_free = step(policy, with_kl), step(free, without)
    assert first["loss/kl_ref"] == 0.0 and "loss/kl_ref" not in first_free
    assert first["loss"] == first_free["loss"]
    assert all(torch.equal(weights(free)[k], v) for k, v in weights(policy).items())
    # Step 2: the policy moved away; on the same weights the loss differs by kl_coef * mean k3
    # (token_mean: every loss token weighs 1 / loss tokens, as in the kl_ref metric).
    second, second_free = step(policy, with_kl, 1), step(free, without, 1)
    assert second["loss/kl_ref"] > 1e-5
    assert second["loss"] - second_free["loss"] == pytest.approx(0.5 * second["loss/kl_ref"], rel=1e-4)
    assert any(not torch.equal(weights(policy)[k], weights(free)[k]) for k in reference)  # its gradient
    for name, value in policy.reference.state_dict().items():  # frozen
        assert torch.equal(value, reference[name]), name
    assert not any(p.requires_grad for p in policy.reference.parameters())


def test_the_kl_penalty_without_a_reference_model_is_a_config_error():
    with pytest.raises(ConfigError, match="algorithm.kl_coef"):
        step(new_policy(), AlgorithmConfig(kl_coef=0.1))


def test_the_run_policy_loads_a_reference_only_for_a_kl_penalty():
    def config(*overrides: str) -> TrainConfig:
        return validate_config(TrainConfig, load_raw_config("examples/tiny/train.toml", list(overrides)))

    assert TrainablePolicy.from_config(config(), tiny_model_dir()).reference is None
    policy = TrainablePolicy.from_config(config("algorithm.kl_coef=0.05"), tiny_model_dir())
    assert policy.reference is not None and not policy.reference.training


def test_tis_cap_truncates_the_importance_weight_where_it_exceeds_the_cap():
    def run(**kwargs) -> dict[str, float]:
        return step(new_policy(), AlgorithmConfig(proximal="trainer", **kwargs))

    untruncated = run()
    assert untruncated["loss/importance_weight_max"] > 1.5  # engine/trainer drift to truncate
    # The ratio is against the trainer's own logprobs (one optimizer step): 1, never clipped.
    assert untruncated["loss/ratio_mean"] == pytest.approx(1.0) and untruncated["loss/clip_fraction"] == 0
    assert untruncated["loss/engine_trainer_kl"] > 0
    # Control: a cap no weight reaches changes nothing.
    loose = run(tis_cap=1e6)
    assert loose.pop("loss/importance_weight_truncated_fraction") == 0.0
    assert loose == untruncated
    # A cap that applies truncates the weights above it, and the loss changes.
    tight = run(tis_cap=1.0)
    assert 0 < tight["loss/importance_weight_truncated_fraction"] < 1
    assert tight["loss/importance_weight_max"] == pytest.approx(1.0)
    assert abs(tight["loss"] - untruncated["loss"]) > 1e-4
    # The default (behaviour) proximal has no such weight.
    behaviour = step(new_policy(), AlgorithmConfig())
    assert behaviour["loss/importance_weight_max"] == 1.0 and "loss/engine_trainer_kl" not in behaviour
