"""Batch building and its statistics."""

from __future__ import annotations

from harnessrl.schemas import Call, Outcome, Rollout
from harnessrl.trajectory import BREAK_REASONS, build_batch


def call(seq: int, prompt: list[int], response: list[int], rollout_id: str) -> Call:
    return Call(
        rollout_id=rollout_id,
        seq=seq,
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-0.1] * len(response),
    )


def test_batch_statistics():
    one = Rollout(rollout_id="a", api_key="k", task_id="t", reward=1.0, outcome=Outcome.SUCCESS)
    two = Rollout(rollout_id="b", api_key="k", task_id="t", reward=0.0, outcome=Outcome.POLICY_FAILURE)
    infra = Rollout(rollout_id="c", api_key="k", task_id="t", outcome=Outcome.INFRA_FAILURE)
    empty = Rollout(rollout_id="d", api_key="k", task_id="t", reward=0.0)
    calls_a = [call(0, [1, 2], [3], "a"), call(1, [1, 2, 3, 4], [5], "a")]
    calls_b = [
        call(0, [1, 2], [3, 4], "b"),
        call(1, [9], [5], "b"),  # new context
        call(2, [1, 2, 3, 7], [8], "b"),  # diverges inside b's first response: prefix_mismatch
        call(3, [1, 2, 3, 4, 5, 6, 7, 8], [9, 9], "b"),  # extends, but 10 > 9 tokens: length, dropped
    ]
    batch = build_batch(
        [(one, calls_a), (two, calls_b), (infra, [call(0, [1], [2], "c")]), (empty, [])], max_sample_tokens=9
    )
    stats = batch.stats
    assert [s.rollout_id for s in batch.samples] == ["a", "b", "b", "b"]
    assert stats.rollouts == 2 and stats.rollouts_skipped_infra == 1 and stats.rollouts_without_samples == 1
    assert stats.samples_per_rollout == 2.0
    assert stats.single_sample_share == 0.5
    assert dict(stats.breaks) == {"new_context": 1, "prefix_mismatch": 1, "length": 1}
    assert stats.oversized_calls == 1 and stats.oversized_tokens == 10
    assert stats.loss_tokens == 6
    metrics = stats.as_metrics()
    assert metrics["trajectory/samples_per_rollout"] == 2.0
    assert {f"trajectory/breaks/{r}" for r in BREAK_REASONS} <= set(metrics)
