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


# -- what the evaluator saw, and what the gateway dropped (issue 36) ---------------------------------


def test_calls_recorded_after_the_evaluator_read_them_are_left_out():
    """A finisher that read 2 calls says so (``metadata.calls_seen``); a third call committed between
    that read and the finish was judged by nobody: it is not trained on, and it is counted."""
    calls = [
        call(0, [1, 2], [3], "a"),
        call(1, [1, 2, 3, 4], [5], "a"),
        call(2, [1, 2, 3, 4, 5, 6], [7], "a"),
    ]
    seen = Rollout(
        rollout_id="a", api_key="k", reward=1.0, outcome=Outcome.SUCCESS, metadata={"calls_seen": 2}
    )
    batch = build_batch([(seen, calls)])
    [sample] = batch.samples
    assert [span.call_seq for span in sample.spans] == [0, 1]
    assert batch.stats.calls_unseen == 1 and batch.stats.calls_used == 2
    assert batch.stats.as_metrics()["trajectory/calls_unseen"] == 1.0
    # Control: the same rollout with every call seen (or its finisher silent) trains on all three.
    for metadata in ({"calls_seen": 3}, {}, {"calls_seen": "3"}, {"calls_seen": True}):
        unsaid = seen.model_copy(update={"metadata": metadata})
        batch = build_batch([(unsaid, calls)])
        assert [span.call_seq for span in batch.samples[0].spans] == [0, 1, 2]
        assert batch.stats.calls_unseen == 0


def test_calls_the_gateway_dropped_are_counted_per_reason():
    dropped = {
        "dropped_calls": {"client_gone": 2, "rollout_ended": 1, "gateway_lapsed": 2, "gateway_stopping": 1}
    }
    a = Rollout(rollout_id="a", api_key="k", reward=1.0, outcome=Outcome.SUCCESS, metadata=dropped)
    b = Rollout(
        rollout_id="b", api_key="k", outcome=Outcome.INFRA_FAILURE,
        metadata={"dropped_calls": {"client_gone": 1, "slow_reader": 4, "junk": "x", "bad": -1}},
    )  # fmt: skip
    c = Rollout(rollout_id="c", api_key="k", reward=0.0, metadata={"dropped_calls": "not a dict"})
    stats = build_batch([(a, [call(0, [1], [2], "a")]), (b, []), (c, [])]).stats
    metrics = stats.as_metrics()
    assert {k: v for k, v in metrics.items() if "calls_dropped" in k} == {
        "trajectory/calls_dropped/client_gone": 3.0,
        "trajectory/calls_dropped/slow_reader": 4.0,
        "trajectory/calls_dropped/rollout_ended": 1.0,
        "trajectory/calls_dropped/gateway_lapsed": 2.0,
        "trajectory/calls_dropped/gateway_stopping": 1.0,
    }
    # Control: rollouts with nothing dropped report zeros, not missing metrics.
    quiet = build_batch([(a.model_copy(update={"metadata": {}}), [])]).stats.as_metrics()
    assert quiet["trajectory/calls_dropped/client_gone"] == 0.0
