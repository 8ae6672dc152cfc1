"""Advantages computed per rollout (not per sample), then given to every sample of the rollout.

A group is the rollouts of one task in one step (``harnessrl.trajectory.group_key``). Estimators
are pure functions in ``ADVANTAGE_ESTIMATORS`` with one signature,
``(rewards_R, group_index_R, eps) -> advantages_R``, over the rollouts of a whole step:

- ``grpo``: ``(r - mean_g) / (std_g + eps)`` (DeepSeekMath). ``std_g`` is the sample std (Bessel,
  as verl/OpenRLHF/TRL use); a group of one has std 0.
- ``dr_grpo``: ``r - mean_g`` (Dr. GRPO: no std division; its length-bias fix lives in the loss
  aggregation, not here).
- ``rloo``: ``r - mean of the other rollouts of the group`` = ``G/(G-1) * (r - mean_g)``; 0 for a
  group of one.
- ``reinforce_pp``: REINFORCE++-baseline (OpenRLHF ``reinforce_baseline``): ``r - mean_g``, then
  normalized over the whole step: ``(a - mean) / (std + eps)``.

Where this departs from the papers: every paper above computes the group statistics over
*samples*. Here they are over *rollouts*, because a harnessed rollout may split into several samples
(Agent Lightning's worked example: rewards 1 and 0, the first rollout in 3 samples → baseline 1/2,
where a per-sample mean would give 3/4). Rollouts that failed for infrastructure reasons, or that
have no reward, are excluded before any statistic is computed.

Pure Python (no torch).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.errors import InvalidBatch
from harnessrl.schemas import Outcome, Rollout
from harnessrl.trajectory import Sample, group_key

AdvantageEstimator = Callable[[Sequence[float], Sequence[int], float], list[float]]


def _groups(group_index_R: Sequence[int]) -> dict[int, list[int]]:
    members: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(group_index_R):
        members[g].append(i)
    return members


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); 0 for fewer than two values.

    The deviations are scaled by the largest before squaring: ``(x - m) ** 2`` raised
    ``OverflowError`` for rewards past 1e154 (a traceback instead of a step), and unscaled squares
    made such a group's std infinite and its advantages silently 0."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    scale = max(abs(x - m) for x in xs)
    if scale == 0 or not math.isfinite(scale):
        return scale  # 0, or not a number to divide by (``rollout_advantages`` refuses the result)
    return scale * math.sqrt(sum(((x - m) / scale) * ((x - m) / scale) for x in xs) / (len(xs) - 1))


def _centered(rewards_R: Sequence[float], group_index_R: Sequence[int]) -> list[float]:
    out = [0.0] * len(rewards_R)
    for idx in _groups(group_index_R).values():
        mean = _mean([rewards_R[i] for i in idx])
        for i in idx:
            out[i] = rewards_R[i] - mean
    return out


def grpo_advantages(rewards_R: Sequence[float], group_index_R: Sequence[int], eps: float) -> list[float]:
    out = [0.0] * len(rewards_R)
    for idx in _groups(group_index_R).values():
        group = [rewards_R[i] for i in idx]
        mean, std = _mean(group), _std(group)
        for i in idx:
            out[i] = (rewards_R[i] - mean) / (std + eps)
    return out


def dr_grpo_advantages(rewards_R: Sequence[float], group_index_R: Sequence[int], eps: float) -> list[float]:
    return _centered(rewards_R, group_index_R)


def rloo_advantages(rewards_R: Sequence[float], group_index_R: Sequence[int], eps: float) -> list[float]:
    out = [0.0] * len(rewards_R)
    for idx in _groups(group_index_R).values():
        if len(idx) < 2:
            continue
        total = sum(rewards_R[i] for i in idx)
        for i in idx:
            out[i] = rewards_R[i] - (total - rewards_R[i]) / (len(idx) - 1)
    return out


def reinforce_pp_advantages(
    rewards_R: Sequence[float], group_index_R: Sequence[int], eps: float
) -> list[float]:
    centered = _centered(rewards_R, group_index_R)
    if not centered:
        return []
    mean, std = _mean(centered), _std(centered)
    return [(a - mean) / (std + eps) for a in centered]


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}


@dataclass(slots=True)
class RolloutAdvantages:
    """Per-rollout advantages of one step.

    ``advantages`` holds the rollouts that enter the loss; ``excluded`` maps every other rollout to
    why (``infra_failure``, ``no_reward``, ``zero_variance``). ``metrics`` is ready for logging.
    """

    advantages: dict[str, float]
    excluded: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def rollout_advantages(rollouts: Sequence[Rollout], config: AlgorithmConfig) -> RolloutAdvantages:
    """Compute each rollout's advantage within its group (see the module docstring).

    Raises ``InvalidBatch`` for a rollout given twice, a reward that is NaN or infinite (of a
    rollout that is not an infrastructure failure, whose reward is never used), or rewards so large
    that an advantage is not a finite number.
    """
    estimator = ADVANTAGE_ESTIMATORS[config.advantage]
    excluded: dict[str, str] = {}
    by_group: dict[str, list[Rollout]] = defaultdict(list)
    seen: set[str] = set()
    for rollout in rollouts:
        if rollout.rollout_id in seen:
            raise InvalidBatch(f"rollout {rollout.rollout_id} given twice")
        seen.add(rollout.rollout_id)
        if rollout.outcome is Outcome.INFRA_FAILURE:
            excluded[rollout.rollout_id] = "infra_failure"
        elif rollout.reward is None:
            excluded[rollout.rollout_id] = "no_reward"
        elif not math.isfinite(rollout.reward):
            # One NaN or infinity makes its whole group's mean (and, with reinforce_pp, the whole
            # step's) NaN: every advantage would be NaN. The store refuses such rewards; a library
            # user's rollouts may still hold one.
            raise InvalidBatch(
                f"rollout {rollout.rollout_id} has reward {rollout.reward!r}: rewards must be finite numbers"
            )
        else:
            by_group[group_key(rollout)].append(rollout)

    kept: list[Rollout] = []
    group_index_R: list[int] = []
    zero_variance = 0
    for members in by_group.values():
        if len({r.reward for r in members}) == 1:
            zero_variance += 1
            if config.zero_variance_groups == "drop":
                excluded.update((r.rollout_id, "zero_variance") for r in members)
                continue
        group_index_R.extend([group_index_R[-1] + 1 if group_index_R else 0] * len(members))
        kept.extend(members)

    rewards_R = [float(r.reward) for r in kept]  # type: ignore[arg-type]
    advantages_R = estimator(rewards_R, group_index_R, config.eps)
    for rollout, advantage in zip(kept, advantages_R, strict=True):
        if not math.isfinite(advantage):
            # Finite rewards near the float limit (1e308) overflow the group's sum: its mean is
            # infinite and every advantage of the group NaN, which made every weight NaN.
            raise InvalidBatch(
                f"rollout {rollout.rollout_id} (group {group_key(rollout)}, reward {rollout.reward!r}) "
                f"gets advantage {advantage!r}: its group's rewards are too large to average"
            )
    groups = len(by_group)
    reasons = list(excluded.values())
    # Infrastructure failures are counted once, by the step (rollouts/infra_failures).
    metrics = {
        "rollouts/trained": float(len(kept)),
        "rollouts/no_reward": float(reasons.count("no_reward")),
        "rollouts/dropped_zero_variance": float(reasons.count("zero_variance")),
        "reward/trained_mean": _mean(rewards_R) if rewards_R else 0.0,
        "advantage/groups": float(groups),
        "advantage/zero_variance_groups": float(zero_variance),
        "advantage/zero_variance_share": zero_variance / groups if groups else 0.0,
        "advantage/mean": _mean(advantages_R) if advantages_R else 0.0,
        "advantage/abs_mean": _mean([abs(a) for a in advantages_R]) if advantages_R else 0.0,
    }
    return RolloutAdvantages(
        advantages={r.rollout_id: a for r, a in zip(kept, advantages_R, strict=True)},
        excluded=excluded,
        metrics=metrics,
    )


def assign_advantages(samples: Sequence[Sample], advantages: RolloutAdvantages) -> list[Sample]:
    """Copies of ``samples`` with their rollout's advantage; samples of excluded rollouts are left out."""
    out: list[Sample] = []
    for sample in samples:
        if sample.rollout_id in advantages.advantages:
            out.append(dataclasses.replace(sample, advantage=advantages.advantages[sample.rollout_id]))
        elif sample.rollout_id not in advantages.excluded:
            raise InvalidBatch(f"sample of rollout {sample.rollout_id}, which got no advantage")
    return out
