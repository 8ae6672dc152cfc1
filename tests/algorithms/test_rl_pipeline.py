"""End to end: calls → samples → per-rollout advantages → micro-batches → loss; and no torch on import."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harnessrl.algorithms import (
    AlgorithmConfig,
    assign_advantages,
    pack_micro_batches,
    rollout_advantages,
    step_totals,
)
from harnessrl.algorithms.losses import collate, micro_batch_loss
from harnessrl.schemas import Call, Outcome, Rollout
from harnessrl.trajectory import build_batch


def calls_for(rollout_id: str, n_chains: int) -> list[Call]:
    """``n_chains`` unrelated conversations of two calls each (a subagent per chain)."""
    calls = []
    for k in range(n_chains):
        prompt = [100 + k, 1, 2]
        for _ in range(2):
            response = [3, 4, 5]
            calls.append(Call(rollout_id=rollout_id, seq=len(calls), prompt_token_ids=prompt,
                              response_token_ids=response, response_logprobs=[-0.5] * 3))  # fmt: skip
            prompt = prompt + response + [6]
    return calls


def test_rollout_level_pipeline_weighs_rollouts_equally():
    a = Rollout(rollout_id="a", api_key="k", task_id="t", step=0, reward=1.0, outcome=Outcome.SUCCESS)
    b = Rollout(rollout_id="b", api_key="k", task_id="t", step=0, reward=0.0, outcome=Outcome.POLICY_FAILURE)
    x = Rollout(rollout_id="x", api_key="k", task_id="t", step=0, reward=5.0, outcome=Outcome.INFRA_FAILURE)
    batch = build_batch([(a, calls_for("a", 3)), (b, calls_for("b", 1)), (x, calls_for("x", 1))])
    assert batch.stats.samples_per_rollout == 2.0 and batch.stats.rollouts_skipped_infra == 1
    config = AlgorithmConfig(advantage="dr_grpo")
    adv = rollout_advantages([a, b, x], config)
    assert adv.advantages == {"a": 0.5, "b": -0.5}
    samples = assign_advantages(batch.samples, adv)
    totals = step_totals(samples)
    assert totals.rollout_token_counts_R == (18, 6)

    total = 0.0
    grads = []
    for mb in pack_micro_batches(samples, 20):
        mbatch = collate(mb, totals, dtype=torch.float64)
        lp = mbatch.behaviour_logprobs_B_T.clone().requires_grad_(True)
        out = micro_batch_loss(lp, mbatch, totals, config)
        out.loss.backward()
        total += out.loss.item()
        grads.append(lp.grad[mbatch.loss_mask_B_T])
    # on-policy, ratio 1: loss = mean over rollouts of -A = -(0.5 - 0.5) / 2 = 0
    assert total == pytest.approx(0.0, abs=1e-12)
    # each of a's 18 tokens gets -0.5 / (18 * 2), each of b's 6 tokens +0.5 / (6 * 2): equal rollout weight
    g = torch.cat(grads)
    assert sorted(set(round(v, 12) for v in g.tolist())) == [round(-0.5 / 36, 12), round(0.5 / 12, 12)]
    assert g.sum().item() == pytest.approx(-0.25 + 0.25)


def test_trajectory_and_advantages_do_not_import_torch():
    code = "import sys, harnessrl.trajectory, harnessrl.algorithms; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
