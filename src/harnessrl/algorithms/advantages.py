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


def _exponent(xs: Sequence[float]) -> int:
    """The power of two that brings every value of ``xs`` to at most 1 in magnitude.

    The estimators compute on ``x * 2**-e`` and scale the result back: scaling by a power of two is
    exact, so ordinary rewards give the same bits as before, while sums and differences of rewards
    near the float limit (1e308) no longer overflow (a group's sum was infinite, its mean too, and
    every advantage NaN)."""
    largest = max((abs(x) for x in xs), default=0.0)
    return math.frexp(largest)[1] if largest else 0


def _scaled(xs: Sequence[float], e: int) -> list[float]:
    return [math.ldexp(x, -e) for x in xs]


def _unscaled(x: float, e: int) -> float:
    """``x * 2**e``; infinite where that is past the float limit (``math.ldexp`` raises there)."""
    try:
        return math.ldexp(x, e)
    except OverflowError:
        return math.copysign(math.inf, x)


def _mean(xs: Sequence[float]) -> float:
    """The mean, exactly the value for equal values (``sum(xs) / n`` is off by an ulp, which
    ``r - mean`` turned into a nonzero advantage of 2e292 for equal rewards of 1.7e308): the
    first value plus the exactly summed mean of the others' differences from it."""
    e = _exponent(xs)
    ys = _scaled(xs, e)
    return _unscaled(ys[0] + math.fsum(y - ys[0] for y in ys) / len(ys), e)


def _std(xs: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); 0 for fewer than two values.

    The deviations are scaled by the largest before squaring: ``(x - m) ** 2`` raised
    ``OverflowError`` for rewards past 1e154 (a traceback instead of a step), and squares of tiny
    deviations vanish. The callers give values of magnitude at most 1 (``_scaled``), so the
    deviations themselves are finite."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    scale = max(abs(x - m) for x in xs)
    if scale == 0:
        return 0.0
    return scale * math.sqrt(sum(((x - m) / scale) * ((x - m) / scale) for x in xs) / (len(xs) - 1))


def _centered_scaled(y_R: Sequence[float], group_index_R: Sequence[int]) -> list[float]:
    """``y - mean of its group`` for values already scaled (``_scaled``): each at most 2 in magnitude."""
    out = [0.0] * len(y_R)
    for idx in _groups(group_index_R).values():
        mean = _mean([y_R[i] for i in idx])
        for i in idx:
            out[i] = y_R[i] - mean
    return out


def grpo_advantages(rewards_R: Sequence[float], group_index_R: Sequence[int], eps: float) -> list[float]:
    # (r - mean) / (std + eps) is the same computed on r * 2**-e with eps * 2**-e: scale-free.
    out = [0.0] * len(rewards_R)
    for idx in _groups(group_index_R).values():
        e = _exponent([rewards_R[i] for i in idx])
        group = _scaled([rewards_R[i] for i in idx], e)
        mean, std = _mean(group), _std(group)
        for i, y in zip(idx, group, strict=True):
            out[i] = (y - mean) / (std + _unscaled(eps, -e))
    return out


def dr_grpo_advantages(rewards_R: Sequence[float], group_index_R: Sequence[int], eps: float) -> list[float]:
    e = _exponent(rewards_R)
    return [_unscaled(a, e) for a in _centered_scaled(_scaled(rewards_R, e), group_index_R)]


def rloo_advantages(rewards_R: Sequence[float], group_index_R: Sequence[int], eps: float) -> list[float]:
    e = _exponent(rewards_R)
    y_R = _scaled(rewards_R, e)
    out = [0.0] * len(rewards_R)
    for idx in _groups(group_index_R).values():
        if len(idx) < 2:
            continue
        mean, n = _mean([y_R[i] for i in idx]), len(idx)
        for i in idx:  # r - mean of the others = n/(n-1) * (r - mean): 0 for equal rewards
            out[i] = _unscaled(n / (n - 1) * (y_R[i] - mean), e)
    return out


def reinforce_pp_advantages(
    rewards_R: Sequence[float], group_index_R: Sequence[int], eps: float
) -> list[float]:
    # The step-wide normalization is scale-free too: computed on r * 2**-e with eps * 2**-e.
    e = _exponent(rewards_R)
    centered = _centered_scaled(_scaled(rewards_R, e), group_index_R)
    if not centered:
        return []
    mean, std = _mean(centered), _std(centered)
    return [(a - mean) / (std + _unscaled(eps, -e)) for a in centered]


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
            # Only an advantage that is itself past the float limit: dr_grpo's or rloo's ``r - mean``
            # of rewards near +-1.8e308 of both signs (grpo's and reinforce_pp's are scale-free).
            raise InvalidBatch(
                f"rollout {rollout.rollout_id} (group {group_key(rollout)}, reward {rollout.reward!r}) "
                f"gets advantage {advantage!r}: its group's rewards are too far apart for a float"
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
