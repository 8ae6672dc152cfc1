"""``train_step`` on one process: its loss is the sum of its micro-batches', idle rounds (what a rank
with less work runs under torchrun) change nothing, the KL penalty adds its k3 term against a frozen
reference, ``tis_cap`` truncates the engine/trainer importance weight with the trainer proximal, and
``policy/entropy`` is the entropy of the tempered policy (not the sampled tokens' negative log-prob).

The N-rank reducer runs in ``tests/trainer/test_distributed.py`` (the torchrun equivalence test).
"""

from __future__ import annotations

import dataclasses
import math
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
from harnessrl.trainer.forward import prefix_logprobs
from harnessrl.trainer.policy import TrainablePolicy
from harnessrl.trainer.prefix_tree import PrefixBatch
from harnessrl.trainer.train_step import NonFiniteStep, OneProcess, micro_batches, train_step
from harnessrl.trajectory import Sample, SampledSpan

MICRO_BATCH_TOKENS = 40  # several micro-batches per step
METRICS = {
    "policy/clip_fraction",
    "policy/dual_clip_fraction",
    "policy/approx_kl",
    "policy/ratio_mean",
    "policy/ratio_max",
    "policy/importance_weight_mean",
    "policy/importance_weight_max",
    "policy/loss",
    "policy/entropy",
    "policy/sampled_nll",
    "policy/grad_norm",
    "policy/lr",
    "policy/forward_tokens",
    "policy/loss_tokens",
    "policy/samples",
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
    return TrainablePolicy(
        tiny_model_dir(), optimizer=OptimizerConfig(lr=1e-2), total_steps=4, row_tokens=24, **kwargs
    )


def step(policy: TrainablePolicy, algorithm: AlgorithmConfig, s: int = 0, **kwargs) -> dict[str, float]:
    return train_step(
        policy.learner,
        make_samples(s),
        algorithm,
        temperature=0.9,
        micro_batch_tokens=MICRO_BATCH_TOKENS,
        **kwargs,
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
        samples, totals, MICRO_BATCH_TOKENS, share_prefixes=share, row_tokens=policy.config.row_tokens
    )
    assert len(micros) > 1
    with torch.no_grad():
        for micro in micros:
            if isinstance(micro, PrefixBatch):
                logprobs, batch = prefix_logprobs(policy.model, micro, 0.9).logprobs, micro.entries
            else:
                batch = micro
                logprobs = policy.logprobs(
                    micro.input_ids_B_T, micro.position_ids_B_T, 0.9, micro.loss_mask_B_T
                ).logprobs
            expected += float(micro_batch_loss(logprobs, batch, totals, algorithm).loss)
    before = weights(policy)
    metrics = policy.train_step(samples, algorithm, temperature=0.9, micro_batch_tokens=MICRO_BATCH_TOKENS)
    assert set(metrics) == METRICS  # one process adds no world_size
    assert metrics["policy/loss"] == pytest.approx(expected, rel=1e-6)
    assert metrics["policy/loss_tokens"] == sum(s.num_loss_tokens for s in samples)
    assert metrics["policy/samples"] == len(samples) and metrics["policy/grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in weights(policy).items())


def test_a_step_drops_its_gradients_once_the_optimizer_has_used_them():
    # They are not kept through the rollouts and evaluations until the next step (4 bytes a weight).
    policy = new_policy()
    before = weights(policy)
    first = step(policy, AlgorithmConfig())
    assert first["policy/grad_norm"] > 0  # the step had gradients...
    assert any(not torch.equal(before[k], v) for k, v in weights(policy).items())  # ...used them...
    assert all(p.grad is None for p in policy.model.parameters())  # ...and holds none now
    # Control: the next step computes gradients of its own again and moves the weights with them.
    middle = weights(policy)
    second = step(policy, AlgorithmConfig(), 1)
    assert second["policy/grad_norm"] > 0
    assert any(not torch.equal(middle[k], v) for k, v in weights(policy).items())
    assert all(p.grad is None for p in policy.model.parameters())


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
    assert first["policy/kl_ref"] == 0.0 and "policy/kl_ref" not in first_free
    assert first["policy/loss"] == first_free["policy/loss"]
    assert all(torch.equal(weights(free)[k], v) for k, v in weights(policy).items())
    # Step 2: the policy moved away; on the same weights the loss differs by kl_coef * mean k3
    # (token_mean: every loss token weighs 1 / loss tokens, as in the kl_ref metric).
    second, second_free = step(policy, with_kl, 1), step(free, without, 1)
    assert second["policy/kl_ref"] > 1e-5
    assert second["policy/loss"] - second_free["policy/loss"] == pytest.approx(
        0.5 * second["policy/kl_ref"], rel=1e-4
    )
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
    assert untruncated["policy/importance_weight_max"] > 1.5  # engine/trainer drift to truncate
    # The ratio is against the trainer's own logprobs (one optimizer step): 1, never clipped.
    assert untruncated["policy/ratio_mean"] == pytest.approx(1.0)
    assert untruncated["policy/clip_fraction"] == 0
    assert untruncated["policy/engine_trainer_kl"] > 0
    # Control: a cap no weight reaches changes nothing.
    loose = run(tis_cap=1e6)
    assert loose.pop("policy/importance_weight_truncated_fraction") == 0.0
    assert loose == untruncated
    # A cap that applies truncates the weights above it, and the loss changes.
    tight = run(tis_cap=1.0)
    assert 0 < tight["policy/importance_weight_truncated_fraction"] < 1
    assert tight["policy/importance_weight_max"] == pytest.approx(1.0)
    assert abs(tight["policy/loss"] - untruncated["policy/loss"]) > 1e-4
    # The default (behaviour) proximal has no such weight.
    behaviour = step(new_policy(), AlgorithmConfig())
    assert behaviour["policy/importance_weight_max"] == 1.0 and "policy/engine_trainer_kl" not in behaviour


# -- entropy and the other policy/* metrics -------------------------------------------------------------
def direct_entropy_and_nll(policy: TrainablePolicy, samples: list[Sample], temperature: float):
    """The reference: every sample alone through the full model, p = softmax(logits / T) at every
    position, and over the step's loss tokens the mean of -sum_v p_v log p_v (the entropy) and the
    mean of -log p(sampled token) (what ``entropy`` used to be)."""
    entropy = nll = tokens = 0.0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.input_ids])
            logp = (policy.model(input_ids=ids).logits[0, :-1].double() / temperature).log_softmax(-1)
            trained = torch.tensor(s.loss_mask[1:], dtype=torch.bool)  # position t predicts token t + 1
            entropy += float(-(logp.exp() * logp).sum(-1)[trained].sum())
            nll += float(-logp.gather(-1, ids[0, 1:, None])[trained].sum())
            tokens += int(trained.sum())
    return entropy / tokens, nll / tokens


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_entropy_is_that_of_the_tempered_policy_not_the_sampled_tokens_nll(share, temperature):
    policy = new_policy(share_prefixes=share)
    samples = make_samples(0)  # tokens not drawn from the policy: their NLL is not its entropy
    entropy, nll = direct_entropy_and_nll(policy, samples, temperature)
    metrics = train_step(
        policy.learner,
        samples,
        AlgorithmConfig(),
        temperature=temperature,
        micro_batch_tokens=MICRO_BATCH_TOKENS,
    )
    assert metrics["policy/entropy"] == pytest.approx(entropy, rel=1e-5)
    assert metrics["policy/sampled_nll"] == pytest.approx(nll, rel=1e-5)
    assert nll - entropy > 0.1 * entropy  # (7.7 vs 8.8 nats at T = 1): the old `entropy` was nll
    # The temperature divides the logits before the softmax: at T / 2 the entropy is far lower.
    sharper, _ = direct_entropy_and_nll(policy, samples, temperature / 2)
    assert entropy - sharper > 0.1 * entropy


def test_token_entropy_in_chunks_matches_the_direct_formula_and_ignores_impossible_tokens():
    from harnessrl.algorithms.losses import token_entropy

    logits_N_V = torch.randn(37, 50, generator=torch.Generator().manual_seed(0)) * 3
    logits_N_V[0, :10] = -torch.inf  # tokens the distribution cannot produce
    logp = logits_N_V.double().log_softmax(-1)
    direct_N = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)
    for chunk_elements in (1, 50 * 5, 50 * 37, 10**9):  # one row per chunk ... all rows in one
        got_N = token_entropy(logits_N_V, chunk_elements=chunk_elements)
        assert not got_N.isnan().any()
        torch.testing.assert_close(got_N.double(), direct_N, rtol=1e-5, atol=1e-6)
    uniform = token_entropy(torch.zeros(2, 64))
    torch.testing.assert_close(uniform, torch.full((2,), math.log(64)))
    assert not token_entropy(torch.randn(3, 8, requires_grad=True)).requires_grad  # a metric: no graph


def test_max_metrics_are_the_largest_over_the_step_and_means_do_not_depend_on_micro_batching():
    def run(micro_batch_tokens: int) -> dict[str, float]:
        return train_step(
            new_policy(share_prefixes=False).learner,
            make_samples(0),
            AlgorithmConfig(proximal="trainer"),
            temperature=0.9,
            micro_batch_tokens=micro_batch_tokens,
        )

    one, several = run(10**6), run(MICRO_BATCH_TOKENS)  # one micro-batch; several
    # (a token mean of each micro-batch's maximum, as these were, is below the maximum)
    assert several["policy/importance_weight_max"] == pytest.approx(one["policy/importance_weight_max"])
    assert several["policy/ratio_max"] == pytest.approx(one["policy/ratio_max"])
    for key in ("policy/entropy", "policy/sampled_nll", "policy/importance_weight_mean", "policy/loss"):
        assert several[key] == pytest.approx(one[key], rel=1e-5), key


def test_lr_is_the_rate_of_this_step_update():
    policy = TrainablePolicy(
        tiny_model_dir(), optimizer=OptimizerConfig(lr=1e-2, warmup_steps=2), total_steps=4, row_tokens=24
    )
    first, second = step(policy, AlgorithmConfig()), step(policy, AlgorithmConfig(), 1)
    assert first["policy/lr"] == pytest.approx(0.5e-2)  # warmup: step 1 of 2 (not step 2's rate)
    assert second["policy/lr"] == pytest.approx(1e-2)


def test_the_gradient_norm_is_reported_with_clipping_off():
    """Regression: ``grad_clip = None`` (clipping off) reported ``policy/grad_norm`` 0.0, though it is
    the norm before clipping; an infinite limit must leave the update as it is."""
    clipped = TrainablePolicy(
        tiny_model_dir(), optimizer=OptimizerConfig(lr=1e-2, grad_clip=1e9), total_steps=4, row_tokens=24
    )
    unclipped = TrainablePolicy(
        tiny_model_dir(), optimizer=OptimizerConfig(lr=1e-2, grad_clip=None), total_steps=4, row_tokens=24
    )
    a, b = step(clipped, AlgorithmConfig()), step(unclipped, AlgorithmConfig())
    assert b["policy/grad_norm"] > 0
    assert b["policy/grad_norm"] == pytest.approx(a["policy/grad_norm"], rel=1e-6)
    after_a, after_b = weights(clipped), weights(unclipped)
    assert all(torch.allclose(after_a[k], after_b[k]) for k in after_a)  # a limit never reached: no change


@pytest.mark.parametrize(
    "bad", [{"lr": math.inf}, {"weight_decay": math.inf}, {"betas": (math.nan, 0.9)}, {"betas": (0.9, 1.0)}]
)
def test_non_finite_or_out_of_range_optimizer_settings_are_refused(bad):
    with pytest.raises(ValueError):
        OptimizerConfig(**bad)
    OptimizerConfig(grad_clip=math.inf)  # control: an infinite clip is "no clipping"


def test_a_step_without_loss_tokens_still_advances_the_lr_schedule():
    """Regression: a skipped step (no loss token) left the LR scheduler where it was, so every later
    step trained at the rate of the step before it (a warmup one step longer, a decay that never
    reached its end), though the step counts as a policy version and in ``trainer.steps``."""

    def build() -> TrainablePolicy:
        return TrainablePolicy(
            tiny_model_dir(), optimizer=OptimizerConfig(lr=1e-2, warmup_steps=3), total_steps=6, row_tokens=24
        )

    straight, skipping = build(), build()
    rates = [step(straight, AlgorithmConfig(), s)["policy/lr"] for s in range(3)]
    assert rates == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2])  # the warmup, step by step
    empty = [dataclasses.replace(s, loss_mask=[0] * len(s)) for s in make_samples(0)]
    before = weights(skipping)
    skipped = train_step(skipping.learner, empty, AlgorithmConfig(), temperature=0.9, micro_batch_tokens=40)
    assert skipped == {"policy/loss": 0.0, "policy/skipped": 1.0}
    assert all(torch.equal(before[k], v) for k, v in weights(skipping).items())  # no update...
    assert not skipping.optimizer.state  # ...and AdamW has not counted one
    # ...but steps 2 and 3 train at the schedule's rates for steps 2 and 3.
    assert [step(skipping, AlgorithmConfig(), s)["policy/lr"] for s in (1, 2)] == pytest.approx(rates[1:])


@pytest.mark.parametrize(
    ("spoil", "proximal"),
    [
        ("behaviour_logprob", "trainer"),  # NaN importance weight: a NaN gradient
        ("behaviour_logprob", "behaviour"),  # a NaN loss, its token untrained
        ("advantage", "behaviour"),
    ],
)
def test_a_step_whose_loss_or_gradient_is_not_finite_is_refused_and_changes_nothing(spoil, proximal):
    """Regression: a NaN in the step's data was applied: the NaN gradient made every weight NaN (the
    engine then served them) or the NaN loss went by with a token silently untrained."""
    algorithm = AlgorithmConfig(proximal=proximal)
    samples = make_samples(0)
    if spoil == "advantage":
        samples[2] = dataclasses.replace(samples[2], advantage=math.nan)
    else:
        samples[0].behaviour_logprobs[10] = math.nan
    policy = new_policy()
    before = weights(policy)
    with pytest.raises(NonFiniteStep, match=r"the step's loss is nan and its gradient norm .*: not applied"):
        train_step(policy.learner, samples, algorithm, temperature=0.9, micro_batch_tokens=MICRO_BATCH_TOKENS)
    assert all(torch.equal(before[k], v) for k, v in weights(policy).items())
    assert not policy.optimizer.state and policy.scheduler.last_epoch == 0
    assert all(p.grad is None for p in policy.model.parameters())
    # Control: the same policy takes the clean step, and it moves the weights.
    metrics = step(policy, algorithm)
    assert math.isfinite(metrics["policy/loss"]) and policy.scheduler.last_epoch == 1
    assert any(not torch.equal(before[k], v) for k, v in weights(policy).items())


def test_a_resumed_policy_trains_with_this_runs_optimizer_settings(tmp_path):
    """Regression: loading a checkpoint's optimizer and scheduler state brought back their saved
    ``lr``, ``betas`` and ``weight_decay``: ``--resume --set optimizer.lr=...`` went on at the old
    rate. With the settings unchanged, the resumed step is the uninterrupted one, exactly."""
    optimizer = OptimizerConfig(lr=1e-2, warmup_steps=2, schedule="linear")
    straight = TrainablePolicy(tiny_model_dir(), optimizer=optimizer, total_steps=4, row_tokens=24)
    first = TrainablePolicy(tiny_model_dir(), optimizer=optimizer, total_steps=4, row_tokens=24)
    want = [step(straight, AlgorithmConfig(), s) for s in range(2)][1]
    step(first, AlgorithmConfig())
    folder = first.save_checkpoint(tmp_path / "ckpt")

    same = TrainablePolicy(folder, optimizer=optimizer, total_steps=4, row_tokens=24)
    same.load_trainer_state(folder)
    assert step(same, AlgorithmConfig(), 1)["policy/lr"] == want["policy/lr"] == pytest.approx(1e-2)
    for name, value in weights(straight).items():
        torch.testing.assert_close(weights(same)[name], value, rtol=0, atol=1e-6)

    changed = optimizer.model_copy(update={"lr": 1e-4, "betas": (0.5, 0.9), "weight_decay": 0.1})
    resumed = TrainablePolicy(folder, optimizer=changed, total_steps=4, row_tokens=24)
    resumed.load_trainer_state(folder)
    assert step(resumed, AlgorithmConfig(), 1)["policy/lr"] == pytest.approx(1e-4)  # step 2 of 2 of warmup
    group = resumed.optimizer.param_groups[0]
    assert (group["betas"], group["weight_decay"]) == ((0.5, 0.9), 0.1)
    assert resumed.scheduler.get_last_lr()[0] == pytest.approx(
        1e-4
    )  # step 3: the decay starts at the new rate
    assert len(resumed.optimizer.state) == len(list(resumed.model.parameters()))  # the moments were kept
