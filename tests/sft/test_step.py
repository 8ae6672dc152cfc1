"""One SFT step against a plain torch reference: the loss is the token-mean cross-entropy of the
answer tokens, and the step's gradient is that loss's gradient (read off the update of plain SGD at
learning rate 1, put in the learner the step works on: Adam's first update is about lr * sign(grad),
which turns fp32 noise on near-zero gradients into whole-lr differences)."""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F

from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.sft.step import sft_step
from harnessrl.trainer.config import OptimizerConfig, PolicyConfig
from harnessrl.trainer.policy import TrainablePolicy
from harnessrl.trajectory import Sample, SampledSpan


def sequence(rollout_id: str, ids: list[int], answers: list[tuple[int, int]]) -> Sample:
    mask = [0] * len(ids)
    for start, end in answers:
        mask[start:end] = [1] * (end - start)
    spans = [SampledSpan(s, e, 0, i) for i, (s, e) in enumerate(answers)]
    return Sample(rollout_id, ids, mask, [0.0] * len(ids), spans, advantage=1.0)


def policy(grad_clip: float | None, *, share_prefixes: bool = False, row_tokens: int = 64) -> TrainablePolicy:
    config = PolicyConfig(
        optimizer=OptimizerConfig(grad_clip=grad_clip),
        share_prefixes=share_prefixes,
        device="cpu",
        row_tokens=row_tokens,
    )
    return TrainablePolicy(tiny_model_dir(), config)


def sgd_learner(p: TrainablePolicy):
    optimizer = torch.optim.SGD(p.model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return dataclasses.replace(p.learner, optimizer=optimizer, scheduler=scheduler)


def reference_step(
    model: torch.nn.Module, samples: list[Sample], grad_clip: float
) -> tuple[float, torch.nn.Module]:
    """Cross-entropy over all answer tokens of all sequences (each sequence on its own), clipped
    gradient, one SGD step at learning rate 1."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    logits, targets = [], []
    for s in samples:
        ids = torch.tensor([s.input_ids])
        mask = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
        out = model(input_ids=ids).logits[0, :-1]  # position t predicts token t + 1
        logits.append(out[mask])
        targets.append(ids[0, 1:][mask])
    loss = F.cross_entropy(torch.cat(logits), torch.cat(targets))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return float(loss.detach()), model


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)


def test_one_step_on_one_sequence_is_the_reference_cross_entropy():
    torch.manual_seed(0)
    ids = torch.randint(0, 4000, (40,)).tolist()
    sample = sequence("r", ids, [(12, 20), (30, 40)])  # two answers with context between
    p = policy(grad_clip=1.0)
    before = copy.deepcopy(p.model)
    metrics = sft_step(sgd_learner(p), [sample], micro_batch_tokens=4096)
    loss, after = reference_step(before, [sample], grad_clip=1.0)
    assert abs(metrics["sft/loss"] - loss) < 1e-5
    assert metrics["sft/loss_tokens"] == 18
    assert_same_weights(p.model, after)


def test_micro_batches_and_packing_change_nothing():
    """Three sequences in three micro-batches: still one token mean over the whole step."""
    torch.manual_seed(1)
    samples = [
        sequence(f"r{i}", torch.randint(0, 4000, (n,)).tolist(), [(n // 2, n)])
        for i, n in enumerate((30, 24, 18))
    ]
    p = policy(grad_clip=1.0)
    before = copy.deepcopy(p.model)
    metrics = sft_step(sgd_learner(p), samples, micro_batch_tokens=32)
    loss, after = reference_step(before, samples, grad_clip=1.0)
    assert abs(metrics["sft/loss"] - loss) < 1e-5
    assert metrics["sft/forward_tokens"] >= 72
    assert_same_weights(p.model, after)


def test_a_shared_prefix_runs_once_and_changes_nothing():
    """Four sequences behind one long common prompt (a harness's system prompt), two of them with a
    longer common part: in shared-prefix rows the prompt runs through the model once, and the loss
    and the update are still the reference's, sequence by sequence."""
    torch.manual_seed(2)
    prompt = torch.randint(0, 4000, (48,)).tolist()
    middle = torch.randint(0, 4000, (6,)).tolist()
    tails = [torch.randint(0, 4000, (n,)).tolist() for n in (9, 12, 7, 10)]
    samples = [
        sequence(f"r{i}", ids, [(len(ids) - 5, len(ids)), (48, 50)])
        for i, ids in enumerate(
            [prompt + tails[0], prompt + middle + tails[1], prompt + middle + tails[2], prompt + tails[3]]
        )
    ]
    p = policy(grad_clip=1.0, share_prefixes=True, row_tokens=256)
    before = copy.deepcopy(p.model)
    metrics = sft_step(sgd_learner(p), samples, micro_batch_tokens=256)
    loss, after = reference_step(before, samples, grad_clip=1.0)
    assert abs(metrics["sft/loss"] - loss) < 1e-5
    assert metrics["sft/loss_tokens"] == 4 * 7
    # the prompt once, the middle once, each tail once: not the four sequences' 254 tokens
    assert metrics["sft/forward_tokens"] == 48 + 6 + sum(len(t) for t in tails)
    assert_same_weights(p.model, after)


def test_rows_too_short_to_share_still_train_the_same():
    """Rows shorter than prompt plus two tails: each sequence runs whole, and nothing changes."""
    torch.manual_seed(3)
    prompt = torch.randint(0, 4000, (30,)).tolist()
    samples = [
        sequence(f"r{i}", prompt + torch.randint(0, 4000, (8,)).tolist(), [(30, 38)]) for i in range(3)
    ]
    p = policy(grad_clip=1.0, share_prefixes=True, row_tokens=16)
    before = copy.deepcopy(p.model)
    metrics = sft_step(sgd_learner(p), samples, micro_batch_tokens=16)
    loss, after = reference_step(before, samples, grad_clip=1.0)
    assert abs(metrics["sft/loss"] - loss) < 1e-5
    assert metrics["sft/forward_tokens"] == 3 * 38
    assert_same_weights(p.model, after)


def test_grad_norm_is_reported_with_clipping_off():
    """``sft/grad_norm`` is the norm before clipping (docs/sft.md), so it is reported without
    ``optimizer.grad_clip`` too (it read 0.0), the same norm as with a clip it does not reach."""
    torch.manual_seed(0)
    sample = sequence("r", torch.randint(0, 4000, (40,)).tolist(), [(12, 40)])
    unclipped = sft_step(sgd_learner(policy(grad_clip=None)), [sample], micro_batch_tokens=4096)
    clipped = sft_step(sgd_learner(policy(grad_clip=1e9)), [sample], micro_batch_tokens=4096)
    assert unclipped["sft/grad_norm"] > 0
    assert abs(unclipped["sft/grad_norm"] - clipped["sft/grad_norm"]) <= 1e-6 * clipped["sft/grad_norm"]
