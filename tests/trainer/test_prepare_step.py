"""``prepare_step``: what a step trains on, from completed groups alone (no processes, no store)."""

from __future__ import annotations

import pytest

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.errors import HarnessRLError
from harnessrl.schemas import Call, Outcome, Rollout, RolloutStatus, Task
from harnessrl.trainer.config import TrainerSection
from harnessrl.trainer.fleet import Group
from harnessrl.trainer.schedule import TRAIN_KIND, GroupPlan
from harnessrl.trainer.step import heldout_metrics, prepare_step, staleness_bound

TASK = Task(task_id="t", split="train", data={"prompt": "2+2"})


def group(
    group_id: str,
    rewards: list[float],
    *,
    versions: list[int] | None = None,
    outcomes: list[Outcome] | None = None,
) -> Group:
    """A complete group: rollout k answered one call sampled by policy ``versions[k]``."""
    versions = versions or [0] * len(rewards)
    outcomes = outcomes or [Outcome.SUCCESS] * len(rewards)
    members = tuple((f"{group_id}-r{k}", TASK) for k in range(len(rewards)))
    rollouts, calls = [], {}
    for k, (rollout_id, _) in enumerate(members):
        rollouts.append(
            Rollout(
                rollout_id=rollout_id,
                api_key="k",
                task_id="t",
                group_id=group_id,
                status=RolloutStatus.FINISHED,
                outcome=outcomes[k],
                reward=rewards[k],
            )
        )
        response = [10 + k, 20 + k]
        calls[rollout_id] = [
            Call(
                rollout_id=rollout_id,
                seq=0,
                prompt_token_ids=[1, 2, 3],
                response_token_ids=response,
                response_logprobs=[-0.5, -0.25],
                policy_version=versions[k],
            )
        ]
    return Group(GroupPlan(group_id, TRAIN_KIND, 0, members), tuple(rollouts), calls)


def advantage_of(batch, rollout_id: str) -> float:
    [sample] = [s for s in batch.samples if s.rollout_id == rollout_id]
    return sample.advantage


def test_fresh_groups_become_one_sample_per_rollout_with_centered_advantages():
    batch = prepare_step(
        [group("g0", [1.0, 0.0]), group("g1", [1.0, 1.0])], 0, TrainerSection(), AlgorithmConfig()
    )
    assert len(batch.samples) == 4 and len(batch.rollouts) == 4
    assert advantage_of(batch, "g0-r0") > 0 > advantage_of(batch, "g0-r1")
    assert batch.metrics["reward/mean"] == 0.75
    assert batch.metrics["rollouts/dropped_stale"] == 0 and batch.metrics["staleness/max"] == 0
    assert batch.generated_tokens == 8


def test_zero_variance_groups_carry_no_signal():
    batch = prepare_step([group("g0", [1.0, 1.0, 1.0])], 0, TrainerSection(), AlgorithmConfig())
    assert all(s.advantage == 0.0 for s in batch.samples)
    assert batch.metrics["reward/std"] == 0.0


def test_rollouts_past_the_staleness_bound_are_dropped():
    trainer = TrainerSection(mode="async", max_staleness=1, stale_samples="drop")
    # trained at version 3: lags 0, 1 (kept), 2 (dropped)
    batch = prepare_step([group("g0", [1.0, 0.0, 1.0], versions=[3, 2, 1])], 3, trainer, AlgorithmConfig())
    assert {s.rollout_id for s in batch.samples} == {"g0-r0", "g0-r1"}
    assert batch.metrics["rollouts/dropped_stale"] == 1
    assert batch.metrics["staleness/max"] == 2 and batch.metrics["staleness/mean"] == 1.0
    assert len(batch.rollouts) == 3  # still reported (and marked trained) as part of the step


def test_dropping_stale_rollouts_keeps_their_rewards_in_the_groups_baseline():
    """Regression: the two stale failures of rewards [1, 1, 0, 0] were dropped before the group's
    statistics, which left [1, 1]: a zero-variance group, and the step lost its signal."""
    trainer = TrainerSection(mode="async", max_staleness=1, stale_samples="drop")
    # trained at version 5: lags 1, 0 (kept), 3, 2 (dropped)
    batch = prepare_step(
        [group("g0", [1.0, 1.0, 0.0, 0.0], versions=[4, 5, 2, 3])], 5, trainer, AlgorithmConfig()
    )
    assert {s.rollout_id for s in batch.samples} == {"g0-r0", "g0-r1"}
    fresh = prepare_step([group("g0", [1.0, 1.0, 0.0, 0.0])], 0, TrainerSection(), AlgorithmConfig())
    assert advantage_of(batch, "g0-r0") == advantage_of(fresh, "g0-r0") > 0  # as if none were stale
    assert batch.metrics["advantage/zero_variance_groups"] == 0.0
    assert batch.metrics["rollouts/dropped_stale"] == 2 and batch.metrics["rollouts/trained"] == 2


def test_downweight_shrinks_a_stale_rollouts_advantage_by_bound_over_lag():
    stale = group("g0", [1.0, 0.0], versions=[1, 3])  # trained at 3: lags 2 and 0
    fresh = prepare_step([stale], 3, TrainerSection(mode="async", max_staleness=5), AlgorithmConfig())
    shrunk = prepare_step(
        [stale],
        3,
        TrainerSection(mode="async", max_staleness=1, stale_samples="downweight"),
        AlgorithmConfig(),
    )
    assert len(shrunk.samples) == 2 and shrunk.metrics["rollouts/dropped_stale"] == 0
    assert advantage_of(shrunk, "g0-r0") == pytest.approx(advantage_of(fresh, "g0-r0") * 1 / 2)
    assert advantage_of(shrunk, "g0-r1") == advantage_of(fresh, "g0-r1")


def test_sync_mode_is_bound_zero():
    assert staleness_bound(TrainerSection(mode="sync", max_staleness=4)) == 0
    assert staleness_bound(TrainerSection(mode="async", max_staleness=4)) == 4
    batch = prepare_step(
        [group("g0", [1.0, 0.0], versions=[1, 0])], 1, TrainerSection(mode="sync"), AlgorithmConfig()
    )
    assert {s.rollout_id for s in batch.samples} == {"g0-r0"}


@pytest.mark.parametrize("stale_samples", ["drop", "downweight"])
def test_rollouts_sampled_by_weights_a_resumed_run_discarded_are_not_trained(stale_samples):
    # Killed after step 3 was published but before its checkpoint was whole: the run resumed from
    # step 2, and r1 had been sampled by the discarded step-3 weights. It used to train as on-policy
    # (lag 3 - 2 = -1, within any bound), even in sync mode.
    trainer = TrainerSection(mode="sync", stale_samples=stale_samples)
    batch = prepare_step([group("g0", [1.0, 0.0, 0.0], versions=[2, 3, 2])], 2, trainer, AlgorithmConfig())
    assert {s.rollout_id for s in batch.samples} == {"g0-r0", "g0-r2"}
    assert advantage_of(batch, "g0-r0") > 0 > advantage_of(batch, "g0-r2")  # the group's rest trains
    assert batch.metrics["rollouts/dropped_stale"] == 1
    assert batch.metrics["staleness/max"] == 0 and batch.metrics["staleness/mean"] == 0.0
    assert len(batch.rollouts) == 3


def test_infra_failures_are_left_out_of_the_reward_metrics():
    g = group(
        "g0", [1.0, 0.0, 0.0], outcomes=[Outcome.SUCCESS, Outcome.POLICY_FAILURE, Outcome.INFRA_FAILURE]
    )
    batch = prepare_step([g], 0, TrainerSection(), AlgorithmConfig())
    assert batch.metrics["rollouts/infra_failures"] == 1
    assert batch.metrics["reward/mean"] == 0.5  # over the two scored rollouts
    assert batch.metrics["rollouts/trained"] == 2 and batch.metrics["rollouts/total"] == 3
    assert "g0-r2" not in {s.rollout_id for s in batch.samples}


def test_heldout_metrics_and_an_evaluation_with_nothing_scored():
    g = group("eval-s00000", [1.0, 0.0], outcomes=[Outcome.SUCCESS, Outcome.INFRA_FAILURE])
    assert heldout_metrics(g, overlap=2) == {
        "heldout/reward": 1.0,
        "heldout/success_rate": 1.0,
        "heldout/rollouts": 1,
        "heldout/overlap_with_train": 2,
    }
    broken = group("eval-s00001", [0.0], outcomes=[Outcome.INFRA_FAILURE])
    with pytest.raises(HarnessRLError, match="every rollout failed"):
        heldout_metrics(broken, overlap=0)


def test_step_metrics_report_lengths_truncation_prompt_and_zero_variance_share():
    varied, flat = group("g0", [1.0, 0.0]), group("g1", [0.5, 0.5])
    cut = varied.calls["g0-r1"][0]
    varied.calls["g0-r1"] = [
        cut.model_copy(update={"finish_reason": "length", "finished_at": cut.started_at + 2.0})
    ]
    batch = prepare_step([varied, flat], 0, TrainerSection(), AlgorithmConfig())
    m = batch.metrics
    assert m["response/length_mean"] == 2.0 and m["response/length_max"] == 2.0
    assert m["response/truncated_share"] == 0.25  # one call of four stopped at max_tokens
    assert m["prompt/length_mean"] == 3.0 and m["prompt/length_max"] == 3.0
    assert m["calls/per_rollout"] == 1.0
    assert m["time/generation_s_mean"] == 2.0  # the only call with a finish time
    assert m["advantage/zero_variance_share"] == 0.5  # g1's rewards are all equal
