"""From completed groups to the samples of one optimizer step: pure, no processes, no I/O.

``prepare_step`` decides what a step trains on: rollouts too stale for the run's bound are dropped
(or their advantages shrunk) while their rewards still count in their group's baseline, the rest
become token-exact samples (``harnessrl.trajectory``) with
rollout-level advantages (``harnessrl.algorithms``), and the step's data metrics are computed. Each
rollout's staleness is the trained policy version minus the oldest version that sampled a call of
its final attempt.

A rollout sampled by weights the run no longer has is dropped whatever ``stale_samples`` says
(counted in ``rollouts/dropped_stale``) rather than trained as on-policy; the rest of its group
trains. A kill after step N+1 was published (generation resumes at once) but before its checkpoint
was whole resumes from step N, and what was generated meanwhile keeps the label N+1, which the
resumed run gives to other weights: ``RolloutBook.recover`` marks those rollouts
(``DISCARDED_WEIGHTS_KEY``), and a call labelled after the version being trained is refused too.

A rollout whose final attempt's recorded calls cannot be read (``Group.unreadable``: a damaged
row) is left out like an infrastructure failure: no samples, out of its group's baseline, counted in
``rollouts/calls_unreadable``; one whose own rollout row cannot be read (``Group.rows_unreadable``)
is not among a group's rollouts at all, and is counted in ``rollouts/row_unreadable``. A rollout the trainer cancelled past ``trainer.rollout_deadline_s``
(``cancelled_stuck``) whose final attempt sampled the policy counts as reward 0, in its group's
baseline and trained (``stuck_reward``); one that never called the model has no reward and stays out
(docs/train.md, "A rollout that never ends", says why).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from harnessrl.algorithms import assign_advantages, rollout_advantages
from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.errors import HarnessRLError
from harnessrl.schemas import Outcome, Rollout
from harnessrl.trainer.config import TrainerSection
from harnessrl.trainer.failures import CANCELLED_STUCK_KEY
from harnessrl.trainer.fleet import DISCARDED_WEIGHTS_KEY, Group
from harnessrl.trajectory import Sample, build_batch


class EvaluationFailed(HarnessRLError):
    """A held-out evaluation produced no scored rollout (every one failed for infrastructure reasons)."""


@dataclass(frozen=True)
class StepBatch:
    samples: list[Sample]
    rollouts: list[Rollout]  # every rollout of the step's groups, dropped ones included
    metrics: dict[str, Any]  # the data side of the step's metrics (rewards, staleness, trajectories)
    generated_tokens: int


def staleness_bound(cfg: TrainerSection) -> int:
    """How many policy versions a rollout may lag: ``max_staleness`` in async mode; 0 in sync mode,
    where the next groups are created only after the previous step trained."""
    return cfg.max_staleness if cfg.mode == "async" else 0


def _sampling_versions(rollout: Rollout, group: Group) -> list[int]:
    """The policy versions that sampled the calls of the rollout's final attempt."""
    return [c.policy_version for c in group.calls[rollout.rollout_id] if c.attempt == rollout.attempt]


def rollout_staleness(rollout: Rollout, group: Group, version: int) -> int:
    versions = _sampling_versions(rollout, group)
    return version - min(versions) if versions else 0


def sampled_by_discarded_weights(rollout: Rollout, group: Group, version: int) -> bool:
    """Weights a resumed run discarded sampled the rollout (the module's docstring): marked so at
    recovery, or a call of its final attempt came from a version after ``version``."""
    if DISCARDED_WEIGHTS_KEY in rollout.metadata:
        return True
    return any(v > version for v in _sampling_versions(rollout, group))


def stuck_reward(rollout: Rollout, group: Group) -> Rollout:
    """``rollout`` as a step counts it: cancelled past ``trainer.rollout_deadline_s`` after its final
    attempt sampled the policy, with reward 0 (the trainer cannot tell a stall the policy caused from
    one it did not, and an uncounted 0 is one a policy could learn to reach: docs/train.md); any
    other rollout as it is."""
    if CANCELLED_STUCK_KEY not in rollout.metadata or rollout.reward is not None:
        return rollout
    if rollout.outcome is Outcome.INFRA_FAILURE or not _sampling_versions(rollout, group):
        return rollout
    return rollout.model_copy(update={"reward": 0.0})


def prepare_step(
    groups: list[Group], version: int, trainer: TrainerSection, algorithm: AlgorithmConfig
) -> StepBatch:
    """The samples and data metrics of the step that trains policy ``version`` on ``groups``."""
    bound = staleness_bound(trainer)
    every = [r for g in groups for r in g.rollouts]
    unreadable = {rid for g in groups for rid in g.unreadable}
    rollouts = [stuck_reward(r, g) for g in groups for r in g.rollouts if r.rollout_id not in unreadable]
    calls = {r.rollout_id: g.calls[r.rollout_id] for g in groups for r in g.rollouts}
    discarded = {
        r.rollout_id
        for g in groups
        for r in g.rollouts
        if r.rollout_id not in unreadable and sampled_by_discarded_weights(r, g, version)
    }
    lags = {
        r.rollout_id: rollout_staleness(r, g, version)
        for g in groups
        for r in g.rollouts
        if r.rollout_id not in discarded and r.rollout_id not in unreadable
    }
    too_stale = {rid for rid, lag in lags.items() if lag > bound}
    drop = trainer.stale_samples == "drop"
    scored = [r for r in rollouts if r.rollout_id not in discarded]
    kept = [r for r in scored if not (drop and r.rollout_id in too_stale)]

    batch = build_batch([(r, calls[r.rollout_id]) for r in kept], max_sample_tokens=trainer.max_sample_tokens)
    # The group's baseline counts its stale members' rewards too; only their samples are dropped.
    # Leaving them out of it changed the rest's advantages: two stale failures dropped from rewards
    # [1, 1, 0, 0] left a zero-variance group, and the step lost the group's signal.
    advantages = rollout_advantages(scored, algorithm)
    if drop:
        for rid in too_stale & advantages.advantages.keys():
            del advantages.advantages[rid]
            advantages.excluded[rid] = "stale"
        advantages.metrics["rollouts/trained"] = float(len(advantages.advantages))
    else:  # down-weight: shrink a stale rollout's advantage by bound / lag
        for rid in too_stale & advantages.advantages.keys():
            advantages.advantages[rid] *= bound / lags[rid]
    samples = assign_advantages(batch.samples, advantages)

    rewards = [r.reward for r in rollouts if r.reward is not None and r.outcome is not Outcome.INFRA_FAILURE]
    staleness = list(lags.values())
    metrics: dict[str, Any] = {
        "reward/mean": statistics.fmean(rewards) if rewards else None,
        "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward/success_rate": sum(1 for x in rewards if x >= 1.0) / len(rewards) if rewards else None,
        "rollouts/total": len(every),
        "rollouts/infra_failures": sum(1 for r in every if r.outcome is Outcome.INFRA_FAILURE),
        # still running past trainer.rollout_deadline_s: cancelled; reward 0 if it sampled the policy,
        # else no reward and out of the baselines
        "rollouts/cancelled_stuck": sum(1 for r in every if CANCELLED_STUCK_KEY in r.metadata),
        # its final attempt's recorded calls cannot be read (a damaged row): left out, as an
        # infrastructure failure is
        "rollouts/calls_unreadable": len(unreadable),
        # its own rollout row cannot be read (a damaged row): not among its group's rollouts at all
        "rollouts/row_unreadable": sum(len(g.rows_unreadable) for g in groups),
        "rollouts/dropped_stale": (len(too_stale) if drop else 0) + len(discarded),
        "staleness/mean": statistics.fmean(staleness) if staleness else 0.0,
        "staleness/max": max(staleness, default=0),
        **advantages.metrics,
        **batch.stats.as_metrics(prefix="trajectory/"),
    }
    metrics.update(call_metrics([c for r in kept for c in calls[r.rollout_id] if c.attempt == r.attempt]))
    generated = sum(len(c.response_token_ids) for cs in calls.values() for c in cs)
    return StepBatch(samples, every, metrics, generated)


def call_metrics(calls: list[Any]) -> dict[str, float]:
    """Per model call of the final attempts of the step's rollouts not dropped as stale: response
    length (sampled tokens), the share cut at ``max_tokens`` (``finish_reason == "length"``), prompt
    length, and generation seconds (first request byte to last token, queueing included). TRL/verl:
    ``completions/mean_length``, ``completions/clipped_ratio``; ``response_length/mean``,
    ``response_length/clip_ratio``, ``prompt_length/mean`` (docs/metrics.md)."""
    if not calls:
        return {}
    lengths = [len(c.response_token_ids) for c in calls]
    timed = [
        c.finished_at - c.started_at for c in calls if c.finished_at is not None and c.started_at is not None
    ]
    return {
        "response/length_mean": statistics.fmean(lengths),
        "response/length_max": float(max(lengths)),
        "response/truncated_share": sum(c.finish_reason == "length" for c in calls) / len(calls),
        "prompt/length_mean": statistics.fmean(len(c.prompt_token_ids) for c in calls),
        "prompt/length_max": float(max(len(c.prompt_token_ids) for c in calls)),
        "time/generation_s_mean": statistics.fmean(timed) if timed else 0.0,
        "calls/per_rollout": len(calls) / max(1, len({c.rollout_id for c in calls})),
    }


def heldout_metrics(group: Group, overlap: int) -> dict[str, Any]:
    """A held-out evaluation's metrics; ``EvaluationFailed`` if no rollout of it could be scored."""
    rewards = [r.reward or 0.0 for r in group.rollouts if r.outcome is not Outcome.INFRA_FAILURE]
    if not rewards:
        raise EvaluationFailed("held-out evaluation: every rollout failed for infrastructure reasons")
    return {
        "heldout/reward": statistics.fmean(rewards),
        "heldout/success_rate": sum(1 for x in rewards if x >= 1.0) / len(rewards),
        "heldout/rollouts": len(rewards),
        "heldout/overlap_with_train": overlap,
    }
