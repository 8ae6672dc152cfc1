"""The trainable policy: packed micro-batches give the same log-probs as one sample at a time (no
attention across samples), the temperature matches the engine's, and the LR schedule's shape."""

from __future__ import annotations

import math

import pytest
import torch

from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.trainer.config import OptimizerConfig
from harnessrl.trainer.policy import TrainablePolicy, lr_lambda


@pytest.fixture(scope="module")
def policy() -> TrainablePolicy:
    return TrainablePolicy(tiny_model_dir(), total_steps=10)


def test_packed_rows_equal_separate_forward_passes(policy):
    a, b = [5, 17, 99, 3, 42, 7], [11, 12, 13, 14]
    ids = torch.tensor([a + b])
    pos = torch.tensor([list(range(len(a))) + list(range(len(b)))])
    with torch.no_grad():
        packed = policy.logprobs(ids, pos, temperature=1.0).logprobs[0]
        alone_a = policy.logprobs(torch.tensor([a]), torch.tensor([list(range(len(a)))]), 1.0).logprobs[0]
        alone_b = policy.logprobs(torch.tensor([b]), torch.tensor([list(range(len(b)))]), 1.0).logprobs[0]
    torch.testing.assert_close(packed[: len(a)], alone_a, atol=1e-5, rtol=1e-5)
    # Position 0 of each sample has no prediction; the rest must not see the previous sample.
    torch.testing.assert_close(packed[len(a) + 1 :], alone_b[1:], atol=1e-5, rtol=1e-5)


def test_temperature_scales_logits(policy):
    ids = torch.tensor([[5, 17, 99, 3]])
    pos = torch.arange(4)[None]
    with torch.no_grad():
        logits = policy.model(input_ids=ids, position_ids=pos).logits[0, :-1] / 0.5
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        got = policy.logprobs(ids, pos, temperature=0.5).logprobs[0, 1:]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_lr_schedule(schedule):
    f = lr_lambda(OptimizerConfig(schedule=schedule, warmup_steps=2, min_lr_ratio=0.1), total_steps=12)
    assert f(0) == pytest.approx(0.5) and f(1) == pytest.approx(1.0)
    if schedule == "constant":
        assert f(11) == 1.0
    else:
        assert f(12) == pytest.approx(0.1)
        assert 0.1 < f(7) < 1.0
        if schedule == "cosine":
            assert f(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_lora_trains_adapters_and_exports_merged_base_weights():
    from transformers import AutoModelForCausalLM

    from harnessrl.trainer.config import LoraSection
    from harnessrl.trajectory import Sample, SampledSpan

    lora = TrainablePolicy(
        tiny_model_dir(), optimizer=OptimizerConfig(lr=1e-2), total_steps=2, lora=LoraSection(r=4, alpha=8)
    )
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir()))
    before = lora.engine_state_dict()
    # the engine's names, no lora_ tensors, and only the adapted layers (nothing else changes)
    adapted = {
        k
        for k in base.state_dict()
        if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"))
    }
    assert set(before) == adapted
    sample = Sample(
        rollout_id="r",
        input_ids=[5, 6, 7, 8, 9],
        loss_mask=[0, 0, 1, 1, 1],
        behaviour_logprobs=[0.0, 0.0, -8.0, -8.0, -8.0],
        spans=[SampledSpan(2, 5, 0, 0)],
        advantage=1.0,
    )
    other = Sample(
        rollout_id="q",
        input_ids=[5, 6, 10, 11],
        loss_mask=[0, 0, 1, 1],
        behaviour_logprobs=[0.0, 0.0, -8.0, -8.0],
        spans=[SampledSpan(2, 4, 0, 0)],
        advantage=-1.0,
    )
    from harnessrl.algorithms.config import AlgorithmConfig

    lora.train_step([sample, other], AlgorithmConfig(), temperature=1.0, micro_batch_tokens=64)
    lora.train_step([sample, other], AlgorithmConfig(), temperature=1.0, micro_batch_tokens=64)
    after = lora.engine_state_dict()
    changed = [k for k in after if not torch.equal(after[k], before[k])]
    assert changed and all("proj" in k for k in changed)  # only the adapted projections move
    # Exporting merged weights does not disturb training: adapters are still separate afterwards.
    assert any("lora_" in name for name, _ in lora.model.named_parameters())


def test_packed_rows_give_the_same_loss_and_gradient_as_one_row(policy):
    """Bounded rows (several per micro-batch, padded) change nothing but the attention cost."""
    from harnessrl.algorithms.config import AlgorithmConfig
    from harnessrl.algorithms.losses import collate, micro_batch_loss
    from harnessrl.algorithms.packing import step_totals
    from harnessrl.trainer.train_step import packed_rows
    from harnessrl.trajectory import Sample, SampledSpan

    samples = []
    for i, n in enumerate([9, 5, 12, 7, 3, 11]):
        ids = [(7 * i + j) % 50 + 5 for j in range(n)]
        mask = [0] * 2 + [1] * (n - 2)
        samples.append(
            Sample(
                rollout_id=f"r{i % 3}",
                input_ids=ids,
                loss_mask=mask,
                behaviour_logprobs=[0.0, 0.0] + [-7.0] * (n - 2),
                spans=[SampledSpan(2, n, 0, 0)],
                advantage=float(i % 2) - 0.5,
                sample_index=i,
            )
        )
    totals = step_totals(samples)
    config = AlgorithmConfig()

    def loss_and_grad(batch):
        policy.model.zero_grad(set_to_none=True)
        logprobs = policy.logprobs(batch.input_ids_B_T, batch.position_ids_B_T, temperature=1.0).logprobs
        loss = micro_batch_loss(logprobs, batch, totals, config).loss
        loss.backward()
        grad = policy.model.get_input_embeddings().weight.grad.clone()
        return loss.detach(), grad

    one_loss, one_grad = loss_and_grad(collate(samples, totals, packed=True))
    rows = packed_rows(samples, totals, row_tokens=16)
    assert rows.input_ids_B_T.shape[0] > 1  # really several rows
    rows_loss, rows_grad = loss_and_grad(rows)
    torch.testing.assert_close(rows_loss, one_loss, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(rows_grad, one_grad, atol=1e-6, rtol=1e-4)
    policy.model.zero_grad(set_to_none=True)


def test_selective_lm_head_matches_full_logits_on_trained_tokens(policy):
    ids = torch.tensor([[5, 17, 99, 3, 42, 7, 8, 9], [11, 12, 13, 14, 15, 16, 0, 0]])
    pos = torch.tensor([list(range(8)), list(range(6)) + [0, 1]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 0, 1, 1], [0, 0, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    with torch.no_grad():
        logits = policy.model(input_ids=ids, position_ids=pos).logits[:, :-1] / 0.7  # the whole head
        full = torch.nn.functional.pad(
            torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0], (1, 0)
        )
        selective = policy.logprobs(ids, pos, temperature=0.7, loss_mask_B_T=mask).logprobs
    torch.testing.assert_close(selective[mask], full[mask], atol=1e-5, rtol=1e-5)
    assert (selective[~mask] == 0).all()


def test_a_cpu_policys_optimizer_is_fused_and_steps_as_torchs_default_adamw(policy):
    """The fused AdamW kernel (no per-parameter temporaries) takes the same step as the loop torch
    uses on CPU by default: same parameters after two steps with weight decay."""
    optimizer = policy.learner.optimizer
    assert optimizer.defaults["fused"] is True
    params = [torch.randn(300, 40), torch.randn(40)]
    grads = [[torch.randn_like(p) for p in params] for _ in range(2)]
    after = []
    for fused in (True, None):
        copies = [p.clone().requires_grad_(True) for p in params]
        adam = torch.optim.AdamW(copies, lr=1e-2, weight_decay=0.1, fused=fused)
        for step in grads:
            for p, g in zip(copies, step, strict=True):
                p.grad = g.clone()
            adam.step()
        after.append([p.detach() for p in copies])
    for start, fused_p, loop_p in zip(params, *after, strict=True):
        assert not torch.allclose(fused_p, start)  # control: the steps moved the parameters
        torch.testing.assert_close(fused_p, loop_p, atol=1e-6, rtol=1e-5)


def test_checkpointing_every_other_layer_recomputes_those_and_gives_the_same_gradients():
    """``gradient_checkpointing_every = 2``: the first of the tiny model's two layers is recomputed in
    the backward pass, the second keeps its activations; the gradients are those of no checkpointing."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from harnessrl.trainer.config import PolicyConfig
    from harnessrl.trainer.policy import load_model

    def grads(**config) -> tuple[list[bool], list[torch.Tensor]]:
        model = load_model(tiny_model_dir(), PolicyConfig(**config))
        model.train()
        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        recomputed = [layer.gradient_checkpointing for layer in layers]
        ids = torch.arange(5, 45).unsqueeze(0)
        model(ids, labels=ids).loss.backward()
        return recomputed, [p.grad for p in model.parameters()]

    plain_layers, plain = grads()
    half_layers, half = grads(gradient_checkpointing=True, gradient_checkpointing_every=2)
    all_layers, _ = grads(gradient_checkpointing=True)
    assert plain_layers == [False, False] and all_layers == [True, True]
    assert half_layers == [True, False]
    for a, b in zip(plain, half, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
