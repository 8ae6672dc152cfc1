"""Shared-prefix rows compute each shared token once and change neither the loss nor the gradient."""

from __future__ import annotations

import random

import pytest
import torch

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.algorithms.packing import step_totals
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.trainer.forward import prefix_logprobs
from harnessrl.trainer.policy import TrainablePolicy
from harnessrl.trainer.prefix_tree import prefix_batch, prefix_micro_batches
from harnessrl.trainer.train_step import micro_batches, to_device
from harnessrl.trajectory import Sample, SampledSpan


def sample(rollout: str, ids: list[int], trained_from: int, advantage: float, index: int = 0) -> Sample:
    n = len(ids)
    return Sample(
        rollout_id=rollout,
        input_ids=ids,
        loss_mask=[0] * trained_from + [1] * (n - trained_from),
        behaviour_logprobs=[0.0] * trained_from + [-6.5 - 0.1 * k for k in range(n - trained_from)],
        spans=[SampledSpan(trained_from, n, 0, 0)],
        advantage=advantage,
        sample_index=index,
    )


def group_samples() -> list[Sample]:
    """Two groups of four rollouts sharing their prompts; one rollout has two samples (the second
    extends the first), two completions share their first trained tokens, one is a duplicate."""
    rng = random.Random(0)
    out = []
    for g, prompt_len in enumerate([14, 9]):
        prompt = [rng.randrange(5, 200) for _ in range(prompt_len)]
        for r in range(4):
            completion = [rng.randrange(5, 200) for _ in range(3 + r)]
            if r == 2:  # shares its first two trained tokens with rollout 1's completion
                completion = out[-1].input_ids[prompt_len : prompt_len + 2] + completion
            adv = (r - 1.5) / 2
            out.append(sample(f"g{g}r{r}", prompt + completion, prompt_len, adv))
        first = out[-4]
        tool = [rng.randrange(5, 200) for _ in range(4)]
        second = first.input_ids + tool + [rng.randrange(5, 200) for _ in range(5)]
        out.append(sample(first.rollout_id, second, len(first.input_ids) + 4, first.advantage, index=1))
    out.append(sample("dup", list(out[0].input_ids), 14, 0.75))  # identical tokens, another rollout
    return out


def test_micro_batches_group_shared_prefixes_and_respect_budgets():
    samples = group_samples()
    batches = prefix_micro_batches(samples, micro_batch_tokens=4096, row_tokens=4096)
    assert len(batches) == 1 and len(batches[0]) == 1
    built = prefix_batch(batches[0], step_totals(samples))
    # each group's prompt once, the second sample adds only its new tokens, the duplicate nothing
    assert built.computed_tokens < built.sample_tokens
    assert built.sample_tokens == sum(len(s) for s in samples)
    assert built.entries.loss_mask_B_T.shape[1] == sum(s.num_loss_tokens for s in samples)

    small = prefix_micro_batches(samples, micro_batch_tokens=40, row_tokens=20)
    longest = max(len(s) for s in samples)
    totals = step_totals(samples)
    for micro in small:
        built = prefix_batch(micro, totals)
        assert built.input_ids_B_T.shape[1] <= max(20, longest)  # rows
        assert built.computed_tokens <= max(40, longest)  # micro-batch
    assert sorted(id(s) for m in small for row in m for s in row) == sorted(id(s) for s in samples)


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def policy(request) -> TrainablePolicy:
    p = TrainablePolicy(tiny_model_dir(), total_steps=10)
    p.model.config._attn_implementation = request.param
    return p


def loss_and_grads(policy: TrainablePolicy, samples: list[Sample], *, share: bool, row_tokens: int):
    totals = step_totals(samples)
    policy.model.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for micro in micro_batches(samples, totals, 60, share_prefixes=share, row_tokens=row_tokens):
        if share:
            logprobs, batch = prefix_logprobs(policy.model, micro, temperature=0.7).logprobs, micro.entries
        else:
            batch = micro
            logprobs = policy.logprobs(
                micro.input_ids_B_T, micro.position_ids_B_T, 0.7, micro.loss_mask_B_T
            ).logprobs
        from harnessrl.algorithms.losses import micro_batch_loss

        loss = micro_batch_loss(logprobs, batch, totals, AlgorithmConfig()).loss
        loss.backward()
        total = total + loss.detach()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    policy.model.zero_grad(set_to_none=True)
    return total, grads


@pytest.mark.parametrize("row_tokens", [4096, 24])
def test_shared_prefix_loss_and_gradient_equal_separate_samples(policy, row_tokens):
    samples = group_samples()
    ref_loss, ref_grads = loss_and_grads(policy, samples, share=False, row_tokens=16)
    loss, grads = loss_and_grads(policy, samples, share=True, row_tokens=row_tokens)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-5)
    assert ref_grads.keys() == grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-6, rtol=1e-4, msg=name)
    assert any(float(g.abs().sum()) > 0 for g in grads.values())


def test_train_step_reports_computed_tokens(policy):
    samples = group_samples()
    assert policy.config.share_prefixes and policy.config.row_tokens == 512
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    metrics = policy.train_step(samples, AlgorithmConfig(), temperature=0.7, micro_batch_tokens=4096)
    assert metrics["policy/forward_tokens"] < sum(len(s) for s in samples)
    assert metrics["policy/loss_tokens"] == sum(s.num_loss_tokens for s in samples)
    changed = [n for n, p in policy.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            p.copy_(before[n])


def test_micro_batches_move_to_the_policy_device_whole():
    """Every tensor of a micro-batch (the nested loss entries too) follows the model to its device;
    checked with the meta device, which every torch build has."""
    samples = group_samples()
    rows = prefix_micro_batches(samples, 4096, 4096)[0]
    moved = to_device(prefix_batch(rows, step_totals(samples)), torch.device("meta"))
    tensors = [getattr(moved, f) for f in moved.__slots__] + [
        getattr(moved.entries, f) for f in moved.entries.__slots__
    ]
    assert all(t.device.type == "meta" for t in tensors if isinstance(t, torch.Tensor))
    assert moved.computed_tokens > 0


def test_eager_attentions_additive_mask_is_made_on_the_batchs_device():
    """Eager attention gets the shared-prefix mask as scores to add, built beside the batch: it was
    built on the CPU whatever the device, which a GPU model's attention cannot add. No GPU here: the
    model and the batch on the meta device (shapes only) stand for one."""
    from transformers import AutoConfig, AutoModelForCausalLM

    samples = group_samples()
    [micro] = prefix_micro_batches(samples, micro_batch_tokens=4096, row_tokens=4096)
    batch = to_device(prefix_batch(micro, step_totals(samples)), torch.device("meta"))
    config = AutoConfig.from_pretrained(str(tiny_model_dir()), attn_implementation="eager")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    out = prefix_logprobs(model, batch, temperature=0.7)
    assert out.logprobs.device.type == "meta"
    assert out.logprobs.shape == batch.entries.loss_mask_B_T.shape
