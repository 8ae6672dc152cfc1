"""verl integration: samples → DataProto layout, round trip, and the registered rollout-level loss.

The loss tests run verl's own machinery on CPU: ``DataProto.to_tensordict``,
``left_right_2_no_padding`` (the unpadding every verl actor applies), verl's ``ppo_loss`` and its
policy-loss registry, then compare with ``harnessrl.algorithms.losses`` on the same samples.
Skipped when verl is not installed, except in CI (``CI=true``), where it must be.
"""

from __future__ import annotations

import math
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
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

from harnessrl.algorithms import AlgorithmConfig, assign_advantages, rollout_advantages, step_totals  # noqa: E402
from harnessrl.algorithms.losses import collate, micro_batch_loss  # noqa: E402
from harnessrl.errors import ConfigError, EmptyBatch, InvalidBatch  # noqa: E402
from harnessrl.integrations.verl import (  # noqa: E402
    LOSS_NAME,
    compute_policy_loss_harnessrl_rollout,
    dataproto_to_samples,
    harnessrl_ppo_loss,
    samples_to_dataproto,
    verl_actor_overrides,
)
from harnessrl.schemas import Call, Outcome, Rollout  # noqa: E402
from harnessrl.trajectory import Sample, SampledSpan, build_batch  # noqa: E402

F64 = torch.float64


# -- a step built the real way: calls → samples (chains) → rollout advantages -----------------------
def _call(rollout_id: str, seq: int, prompt: list[int], response: list[int], version: int = 0) -> Call:
    logprobs = [-0.1 * (1 + (7 * t + seq) % 13) for t in range(len(response))]
    return Call(
        rollout_id=rollout_id,
        seq=seq,
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=logprobs,
        policy_version=version,
    )


def unbalanced_step() -> list[Sample]:
    """Three rollouts of one task: ``a`` (reward 1) splits into 2 samples with 12 loss tokens,
    ``b`` (reward 0) has 1 loss token, ``c`` (reward 1, sampled by policy version 1) has 2."""
    sys = [1, 2, 3]
    a = [
        _call("a", 0, sys, [10, 11, 12, 13]),
        _call("a", 1, sys + [10, 11, 12, 13, 7, 8], [14, 15, 16, 17, 18]),  # tool output 7, 8 between
        _call("a", 2, [4, 5], [19, 20, 21]),  # a subagent: a new chain
    ]
    b = [_call("b", 0, sys, [30])]
    c = [_call("c", 0, sys + [6], [40, 41], version=1)]
    rollouts = [
        Rollout(rollout_id=rid, api_key="k", task_id="t", step=0, reward=reward, outcome=Outcome.SUCCESS)
        for rid, reward in (("a", 1.0), ("b", 0.0), ("c", 1.0))
    ]
    batch = build_batch(zip(rollouts, [a, b, c], strict=True))
    advantages = rollout_advantages(rollouts, AlgorithmConfig())
    return assign_advantages(batch.samples, advantages)


# -- helpers: the same current / old log-probs in both layouts -----------------------------------------
def harnessrl_layout(samples: list[Sample], seed: int, noise: float) -> torch.Tensor:
    """Per-token log-probs aligned with ``collate(..., packed=False)``: behaviour + noise, (B, T)."""
    batch = collate(samples, step_totals(samples), packed=False, dtype=F64)
    g = torch.Generator().manual_seed(seed)
    x = batch.behaviour_logprobs_B_T + noise * torch.randn(
        batch.behaviour_logprobs_B_T.shape, generator=g, dtype=F64
    )
    return x.clamp(max=-1e-3)


def response_layout(x_B_T: torch.Tensor, samples: list[Sample], L: int) -> torch.Tensor:
    """The response part of each row (after the first prompt), right-padded with 0: (B, L)."""
    out = torch.zeros((len(samples), L), dtype=x_B_T.dtype)
    for b, s in enumerate(samples):
        p = s.spans[0].start
        out[b, : len(s) - p] = x_B_T[b, p : len(s)]
    return out


def actor_config(alg: AlgorithmConfig) -> ActorConfig:
    """A verl ActorConfig built from ``verl_actor_overrides`` (so the overrides are what is tested)."""
    o = {k.removeprefix("actor."): v for k, v in verl_actor_overrides(alg, prefix="actor.").items()}
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=PolicyLossConfig(loss_mode=o.pop("policy_loss.loss_mode")),
        **o,
    )


def verl_loss(data, lp_B_T: torch.Tensor, lengths: list[int], cfg: ActorConfig, dp_size: int = 1):
    """The loss verl's actor computes on ``data`` when the model outputs ``lp_B_T`` (harnessrl layout)."""
    td = left_right_2_no_padding(data.to_tensordict())
    num_samples = int((data.batch["response_mask"].sum(-1) > 0).sum())
    tu.assign_non_tensor(
        td, dp_size=dp_size, batch_num_tokens=data.meta_info["num_loss_tokens"], global_batch_size=num_samples
    )
    # verl's model output at position i is the log-prob of token i + 1 (no_padding_2_padding shifts it)
    values = torch.cat([torch.cat([lp_B_T[b, 1:n], lp_B_T.new_zeros(1)]) for b, n in enumerate(lengths)])
    log_probs = torch.nested.nested_tensor_from_jagged(values, offsets=td["input_ids"].offsets())
    loss, _ = harnessrl_ppo_loss(cfg, {"log_probs": log_probs}, td)
    return loss


# -- conversion ------------------------------------------------------------------------------------
def hand_built() -> list[Sample]:
    two_turns = Sample(
        rollout_id="r1",
        input_ids=[1, 2, 3, 10, 11, 5, 6, 12],  # prompt 1 2 3 | response 10 11 | tool 5 6 | response 12
        loss_mask=[0, 0, 0, 1, 1, 0, 0, 1],
        behaviour_logprobs=[0, 0, 0, -0.5, -0.25, 0, 0, -1.0],
        spans=[SampledSpan(3, 5, 0, 0), SampledSpan(7, 8, 2, 1)],
        reward=1.0,
        group_id="g",
        task_id="t",
        step=4,
        advantage=0.5,
    )
    short = Sample(
        rollout_id="r2",
        input_ids=[1, 2, 20],
        loss_mask=[0, 0, 1],
        behaviour_logprobs=[0, 0, -2.0],
        spans=[SampledSpan(2, 3, 1, 0)],
        reward=0.0,
        group_id="g",
        task_id="t",
        step=4,
        advantage=-0.5,
    )
    return [two_turns, short]


def test_conversion_layout_is_verl_padding_convention():
    data = samples_to_dataproto(hand_built(), pad_token_id=99)
    t = {k: v.tolist() for k, v in data.batch.items()}
    assert t["prompts"] == [[1, 2, 3], [99, 1, 2]]  # left-padded
    assert t["responses"] == [[10, 11, 5, 6, 12], [20, 99, 99, 99, 99]]  # right-padded
    assert t["input_ids"] == [[1, 2, 3, 10, 11, 5, 6, 12], [99, 1, 2, 20, 99, 99, 99, 99]]
    assert t["attention_mask"] == [[1] * 8, [0, 1, 1, 1, 0, 0, 0, 0]]
    assert t["position_ids"] == [[0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 2, 2, 2, 2, 2]]
    assert t["response_mask"] == [[1, 1, 0, 0, 1], [1, 0, 0, 0, 0]]  # tool output 5 6 is masked
    assert t["rollout_log_probs"] == [[-0.5, -0.25, 0.0, 0.0, -1.0], [-2.0, 0.0, 0.0, 0.0, 0.0]]
    assert t["old_log_probs"] == t["rollout_log_probs"]
    assert t["advantages"] == [[0.5, 0.5, 0.0, 0.0, 0.5], [-0.5, 0.0, 0.0, 0.0, 0.0]]
    assert t["token_level_scores"] == [[0, 0, 0, 0, 1.0], [0, 0, 0, 0, 0]]  # reward on the last token
    assert t["rollout_loss_tokens"] == [3, 1]
    assert t["step_rollouts"] == [2, 2]
    assert data.batch["input_ids"].dtype == torch.long and data.batch["response_mask"].dtype == torch.long
    nt = data.non_tensor_batch
    assert list(nt["uid"]) == ["g", "g"] and list(nt["rollout_id"]) == ["r1", "r2"]
    assert list(nt["min_global_steps"]) == [0, 1] and list(nt["max_global_steps"]) == [2, 1]
    assert data.meta_info["num_rollouts"] == 2 and data.meta_info["num_loss_tokens"] == 4


def test_fixed_widths_pad_further_and_too_long_is_an_error():
    data = samples_to_dataproto(hand_built(), prompt_length=5, response_length=7, old_log_probs=False)
    assert data.batch["prompts"].shape == (2, 5) and data.batch["responses"].shape == (2, 7)
    assert data.batch["prompts"][0].tolist() == [0, 0, 1, 2, 3]
    assert "old_log_probs" not in data.batch
    with pytest.raises(InvalidBatch, match="prompt_length"):
        samples_to_dataproto(hand_built(), prompt_length=2)
    with pytest.raises(InvalidBatch, match="response_length"):
        samples_to_dataproto(hand_built(), response_length=4)


def test_bad_input_is_rejected_with_a_clear_error():
    s1, s2 = hand_built()
    with pytest.raises(EmptyBatch, match="no samples"):
        samples_to_dataproto([])
    s2.advantage = None
    with pytest.raises(InvalidBatch, match="no advantage"):
        samples_to_dataproto([s1, s2])
    s2.advantage, s2.spans = 0.0, [SampledSpan(0, 3, 0, 0)]
    with pytest.raises(InvalidBatch, match="empty first prompt"):
        samples_to_dataproto([s1, s2])
    with pytest.raises(InvalidBatch, match="not in the given step totals"):
        samples_to_dataproto(hand_built(), totals=step_totals(hand_built()[:1]))


def test_round_trip_returns_the_same_samples():
    samples = unbalanced_step()
    assert len(samples) == 4 and [s.rollout_id for s in samples] == ["a", "a", "b", "c"]
    data = samples_to_dataproto(samples, pad_token_id=7, dtype=F64, prompt_length=9, response_length=20)
    assert dataproto_to_samples(data) == samples
    s1, s2 = hand_built()
    s1.group_id = None  # uid falls back to the rollout id, the group stays None
    back = dataproto_to_samples(samples_to_dataproto([s1, s2]))
    assert back == [s1, s2]
    assert list(samples_to_dataproto([s1, s2]).non_tensor_batch["uid"]) == ["r1", "g"]


def test_a_batch_of_another_format_is_refused():
    data = samples_to_dataproto(hand_built())
    data.meta_info["format"] = "other"
    with pytest.raises(InvalidBatch, match="harnessrl.verl/v1"):
        dataproto_to_samples(data)


# -- the rollout-level loss through verl -------------------------------------------------------------
AGGS = ["rollout_token_mean", "token_mean", "seq_mean_token_mean"]


@pytest.mark.parametrize("loss_agg", AGGS)
@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("tis", [False, True])
def test_loss_and_gradients_through_verl_equal_harnessrl(loss_agg, dual_clip, tis):
    samples = unbalanced_step()
    totals = step_totals(samples)
    alg = AlgorithmConfig(loss_agg=loss_agg, dual_clip=dual_clip, proximal="trainer", tis_cap=1.2)
    batch = collate(samples, totals, packed=False, dtype=F64)
    lp_ours = harnessrl_layout(samples, seed=1, noise=0.4).requires_grad_(True)
    lp_verl = lp_ours.detach().clone().requires_grad_(True)
    old = harnessrl_layout(samples, seed=2, noise=0.3) if tis else None

    ours = micro_batch_loss(lp_ours, batch, totals, alg, old_logprobs_B_T=old).loss
    ours.backward()

    data = samples_to_dataproto(samples, dtype=F64)
    if tis:  # verl recomputed old log-probs; its token-level TIS weights are harnessrl's
        L = data.batch["responses"].shape[1]
        data.batch["old_log_probs"] = response_layout(old, samples, L)
        weights, _ = compute_rollout_correction_weights(
            data.batch["old_log_probs"] - data.batch["rollout_log_probs"],
            data.batch["response_mask"],
            rollout_is="token",
            rollout_is_threshold=alg.tis_cap,
        )
        data.batch["rollout_is_weights"] = weights
    theirs = verl_loss(data, lp_verl, [len(s) for s in samples], actor_config(alg))
    theirs.backward()

    assert abs(ours.item()) > 1e-3  # a loss worth comparing
    assert theirs.item() == pytest.approx(ours.item(), abs=1e-6)
    torch.testing.assert_close(lp_verl.grad, lp_ours.grad, atol=1e-6, rtol=0)


def test_micro_batches_and_data_parallel_ranks_add_up_to_the_step_loss():
    samples = unbalanced_step()
    lp = harnessrl_layout(samples, seed=3, noise=0.4)
    cfg = actor_config(AlgorithmConfig())
    lengths = [len(s) for s in samples]
    whole = samples_to_dataproto(samples, dtype=F64)
    step_loss = verl_loss(whole, lp, lengths, cfg).item()
    # verl splits the step into micro-batches; each carries the *step's* normalizers
    parts = [verl_loss(whole[i : i + 2], lp[i : i + 2], lengths[i : i + 2], cfg).item() for i in (0, 2)]
    assert sum(parts) == pytest.approx(step_loss, abs=1e-9)
    # on 2 ranks each rank's loss is scaled by 2; FSDP's gradient average divides it back
    assert verl_loss(whole, lp, lengths, cfg, dp_size=2).item() == pytest.approx(2 * step_loss, abs=1e-9)


def test_rollout_level_normalization_differs_from_verls_token_mean():
    samples = unbalanced_step()
    lp = harnessrl_layout(samples, seed=4, noise=0.4)
    lengths = [len(s) for s in samples]
    data = samples_to_dataproto(samples, dtype=F64)
    rollout_level = verl_loss(data, lp, lengths, actor_config(AlgorithmConfig()))
    token_mean = verl_loss(data, lp, lengths, actor_config(AlgorithmConfig(loss_agg="token_mean")))
    # rollout "a" holds 12 of the 15 loss tokens: token-mean gives it 12/15 of the weight, the
    # rollout-level mean 1/3. The registered loss is what makes verl weigh rollouts equally.
    assert abs(rollout_level.item() - token_mean.item()) > 1e-2
    assert data.batch["rollout_loss_tokens"].tolist() == [12, 12, 1, 2]


def test_the_loss_is_registered_and_refuses_to_run_without_rollout_weights():
    assert get_policy_loss_fn(LOSS_NAME) is compute_policy_loss_harnessrl_rollout
    cfg = actor_config(AlgorithmConfig())
    x = torch.zeros((1, 3))
    mask = torch.ones((1, 3))
    with pytest.raises(ValueError, match="per-rollout weights"):
        compute_policy_loss_harnessrl_rollout(x, x, x, mask, config=cfg)
    loss, metrics = compute_policy_loss_harnessrl_rollout(
        x, x, torch.ones((1, 3)), mask, config=cfg, rollout_weights=torch.tensor([1 / 3])
    )
    assert loss.item() == pytest.approx(-1.0)  # ratio 1, advantage 1, three tokens of weight 1/3
    assert metrics["actor/pg_clipfrac"] == 0.0
    td = left_right_2_no_padding(samples_to_dataproto(hand_built()).to_tensordict())
    del td["rollout_loss_tokens"]
    with pytest.raises(ValueError, match="rollout_loss_tokens"):
        harnessrl_ppo_loss(cfg, {}, td)


def test_actor_overrides_map_harnessrl_settings_to_verl_keys():
    o = verl_actor_overrides(AlgorithmConfig(clip_low=0.1, clip_high=0.3, kl_coef=0.01))
    assert o["actor_rollout_ref.actor.policy_loss.loss_mode"] == LOSS_NAME
    assert o["actor_rollout_ref.actor.clip_ratio_low"] == 0.1
    assert o["actor_rollout_ref.actor.clip_ratio_high"] == 0.3
    assert math.isinf(o["actor_rollout_ref.actor.clip_ratio_c"])  # no dual clip by default
    assert o["actor_rollout_ref.actor.use_kl_loss"] is True
    assert o["actor_rollout_ref.actor.ppo_epochs"] == 1
    seq = verl_actor_overrides(AlgorithmConfig(loss_agg="seq_mean_token_mean", dual_clip=4.0))
    assert seq["actor_rollout_ref.actor.policy_loss.loss_mode"] == "vanilla"
    assert seq["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-mean"
    assert seq["actor_rollout_ref.actor.clip_ratio_c"] == 4.0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_float_tensors_are_built_in_the_requested_dtype(dtype: torch.dtype) -> None:
    """Advantages are not made in float32 first: 0.1 stays 0.1 in float64 (regression: torch.where
    with a Python float gave float32 values, 0.10000000149011612)."""
    s1, s2 = hand_built()
    s1.advantage, s2.advantage = 0.1, -1 / 3
    data = samples_to_dataproto([s1, s2], dtype=dtype)
    advantages_B_L = data.batch["advantages"]
    mask_B_L = data.batch["response_mask"].bool()
    assert advantages_B_L.dtype == dtype
    expected_B_L = torch.zeros(advantages_B_L.shape, dtype=dtype)
    expected_B_L[0][mask_B_L[0]] = torch.tensor(0.1, dtype=dtype)
    expected_B_L[1][mask_B_L[1]] = torch.tensor(-1 / 3, dtype=dtype)
    assert torch.equal(advantages_B_L, expected_B_L)
    if dtype == torch.float64:
        assert advantages_B_L[0][mask_B_L[0]].tolist() == [0.1, 0.1, 0.1]
        assert advantages_B_L[1][mask_B_L[1]].tolist() == [-1 / 3]


# -- samples verl's tensors would hold wrong: refused, naming the sample ------------------------------
def _mutated(**changes) -> list[Sample]:
    s1, s2 = hand_built()
    for name, value in changes.items():
        setattr(s1, name, value)
    return [s1, s2]


def test_a_loss_token_is_never_left_in_the_prompt_part():
    """The prompt part is never trained: with spans out of order it swallowed two of three loss
    tokens, while ``rollout_loss_tokens`` still counted them (regression)."""
    s1, s2 = hand_built()
    s1.spans = [s1.spans[1], s1.spans[0]]  # [7, 8) first: the prompt was input_ids[:7]
    data = samples_to_dataproto([s1, s2])
    assert data.batch["prompts"][0].tolist() == [1, 2, 3]
    assert data.batch["response_mask"].sum(-1).tolist() == [3, 1]
    assert data.batch["response_mask"].sum(-1).tolist() == data.batch["rollout_loss_tokens"].tolist()
    s1.loss_mask = [0, 1, 0, 1, 1, 0, 0, 1]  # a loss token before every span
    with pytest.raises(InvalidBatch, match=r"sample 0 of rollout r1: loss_mask\[1\] is 1 before"):
        samples_to_dataproto([s1, s2])


BAD_SAMPLES = {
    "lengths differ": (dict(loss_mask=[0, 0, 0, 1, 1, 0, 0]), "lengths 8, 7 and 8"),
    "span past the end": (dict(spans=[SampledSpan(3, 5, 0, 0), SampledSpan(7, 9, 2, 1)]), r"span \[7, 9\)"),
    "span starts past the end": (dict(spans=[SampledSpan(3, 5, 0, 0), SampledSpan(12, 12, 2, 1)]), "outside"),
    "every response empty": (
        dict(
            input_ids=[1, 2, 3],
            loss_mask=[0] * 3,
            behaviour_logprobs=[0.0] * 3,
            spans=[SampledSpan(3, 3, 0, 0)],
        ),
        "no token after its first prompt",
    ),
    "loss mask 2": (dict(loss_mask=[0, 0, 0, 2, 1, 0, 0, 1]), r"loss_mask\[3\] is 2"),
    # token 5 lies between the spans [3, 5) and [7, 8): tool output, trained as if sampled
    "loss token on tool output": (
        dict(loss_mask=[0, 0, 0, 1, 1, 1, 0, 1]),
        r"loss_mask\[5\] is 1 but no span holds token 5",
    ),
    "negative token id": (dict(input_ids=[1, 2, 3, -10, 11, 5, 6, 12]), r"input_ids\[3\] is -10"),
    "token id past int64": (
        dict(input_ids=[1, 2, 3, 2**63, 11, 5, 6, 12]),
        r"input_ids\[3\] is 9223372036854775808",
    ),
    "float token id": (dict(input_ids=[1, 2, 3, 10.7, 11, 5, 6, 12]), r"input_ids\[3\] is 10.7"),
    "NaN log-prob": (
        dict(behaviour_logprobs=[0, 0, 0, math.nan, -0.25, 0, 0, -1.0]),
        r"behaviour_logprobs\[3\]",
    ),
    "infinite log-prob": (
        dict(behaviour_logprobs=[0, 0, 0, -0.5, -0.25, 0, 0, -math.inf]),
        r"logprobs\[7\] is -inf",
    ),
    "NaN advantage": (dict(advantage=math.nan), "advantage is nan"),
    "infinite reward": (dict(reward=math.inf), "reward is inf"),
}


@pytest.mark.parametrize("case", list(BAD_SAMPLES))
def test_a_sample_verl_would_hold_wrong_is_refused_naming_it(case: str):
    """Each went through as broadcast rows, a reward in padding, NaN in the loss, or a bare torch error."""
    changes, message = BAD_SAMPLES[case]
    samples_to_dataproto(_mutated())  # control: the sample as built converts
    with pytest.raises(InvalidBatch, match=f"sample 0 of rollout r1.*{message}"):
        samples_to_dataproto(_mutated(**changes))


def test_numpy_integers_are_token_ids_and_a_bad_pad_token_id_is_a_config_error():
    import numpy as np

    s1, s2 = hand_built()
    s1.input_ids = list(np.array(s1.input_ids, dtype=np.int64))  # not Python ints: the slow check
    s1.loss_mask = list(np.array(s1.loss_mask, dtype=np.int64))
    assert torch.equal(
        samples_to_dataproto([s1, s2]).batch["input_ids"],
        samples_to_dataproto(hand_built()).batch["input_ids"],
    )
    for pad in (-1, 2**63, 1.5):
        with pytest.raises(ConfigError, match="pad_token_id"):
            samples_to_dataproto(hand_built(), pad_token_id=pad)


def test_filler_rows_let_verl_split_a_step_over_data_parallel_ranks_and_add_no_loss():
    """verl's dispatch splits a batch evenly over its data-parallel ranks and asserts otherwise: a
    step of 4 samples could not go to 3 ranks (regression: no way but to drop samples)."""
    from verl.protocol import BatchData

    samples = unbalanced_step()
    lp = harnessrl_layout(samples, seed=5, noise=0.4)
    cfg = actor_config(AlgorithmConfig())
    lengths = [len(s) for s in samples]
    whole = samples_to_dataproto(samples, dtype=F64)
    step_loss = verl_loss(whole, lp, lengths, cfg).item()
    with pytest.raises(AssertionError, match="divisible"):  # what a plain batch meets on 3 ranks
        BatchData(whole.to_tensordict()).chunk(chunks=3)

    data = samples_to_dataproto(samples, dtype=F64, row_multiple=3)
    assert len(data) == 6 and data.meta_info["filler_rows"] == 2 and data.meta_info["num_samples"] == 4
    assert data.batch["response_mask"][4:].sum() == 0 and data.batch["attention_mask"][4:].sum(
        -1
    ).tolist() == [2, 2]
    assert dataproto_to_samples(data) == samples
    lp6 = torch.cat([lp, lp.new_full((2, lp.shape[1]), -0.5)])
    lengths6 = lengths + [2, 2]
    # each rank's share (scaled by dp_size = 3, as FSDP then averages) adds up to the step loss
    assert [len(r) for r in BatchData(data.to_tensordict()).chunk(chunks=3)] == [2, 2, 2]
    shares = [
        verl_loss(data[i : i + 2], lp6[i : i + 2], lengths6[i : i + 2], cfg, dp_size=3).item()
        for i in (0, 2, 4)
    ]
    assert sum(shares) / 3 == pytest.approx(step_loss, abs=1e-9)
    assert shares[2] == 0.0  # the third rank holds only the filler rows
    with pytest.raises(ConfigError, match="row_multiple"):
        samples_to_dataproto(samples, row_multiple=0)
