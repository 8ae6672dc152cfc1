"""Build one step's samples from many rollouts, with the statistics a run should report.

``build_batch`` runs ``build_rollout_samples`` on every rollout and aggregates what happened:
samples per rollout, the share of rollouts that stayed one sample, chain-break reasons, calls
dropped for length, calls the evaluator did not see, and the calls the gateway dropped before
recording them (the rollout's ``metadata.dropped_calls``: client gone, slow reader, rollout ended).
Rollouts whose outcome is an infrastructure failure are skipped here (they never enter the loss);
``harnessrl.algorithms`` also excludes them from group statistics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from harnessrl.schemas import Call, Outcome, Rollout
from harnessrl.store.base import DROP_REASONS, DROPPED_CALLS_KEY
from harnessrl.trajectory.samples import BREAK_REASONS, RolloutSamples, Sample, build_rollout_samples


@dataclass(slots=True)
class TrajectoryStats:
    """Per-batch trajectory statistics. ``as_metrics`` flattens them for logging."""

    rollouts: int = 0  # rollouts that produced at least one sample
    rollouts_skipped_infra: int = 0  # outcome infra_failure: not built
    rollouts_without_samples: int = 0  # no usable call (none recorded, or all oversized/empty)
    samples: int = 0
    single_sample_rollouts: int = 0
    calls_used: int = 0
    calls_other_attempts: int = 0
    calls_unseen: int = 0  # recorded after the evaluator read the calls: left out
    calls_dropped: Counter[str] = field(default_factory=Counter)  # by the gateway, never recorded
    oversized_calls: int = 0
    oversized_tokens: int = 0
    empty_samples: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    max_sample_tokens_seen: int = 0
    breaks: Counter[str] = field(default_factory=Counter)

    @property
    def samples_per_rollout(self) -> float:
        return self.samples / self.rollouts if self.rollouts else 0.0

    @property
    def single_sample_share(self) -> float:
        return self.single_sample_rollouts / self.rollouts if self.rollouts else 0.0

    def add(self, built: RolloutSamples) -> None:
        if built.samples:
            self.rollouts += 1
            self.single_sample_rollouts += len(built.samples) == 1
        else:
            self.rollouts_without_samples += 1
        self.samples += len(built.samples)
        self.calls_used += built.calls_used
        self.calls_other_attempts += built.calls_other_attempts
        self.calls_unseen += built.calls_unseen
        self.oversized_calls += built.oversized_calls
        self.oversized_tokens += built.oversized_tokens
        self.empty_samples += built.empty_samples
        self.breaks.update(built.breaks)
        for sample in built.samples:
            self.tokens += len(sample)
            self.loss_tokens += sample.num_loss_tokens
            self.max_sample_tokens_seen = max(self.max_sample_tokens_seen, len(sample))

    def as_metrics(self, prefix: str = "trajectory/") -> dict[str, float]:
        # rollouts_skipped_infra is left out: the step logs every infra failure (rollouts/infra_failures).
        metrics: dict[str, float] = {
            "rollouts_with_samples": self.rollouts,
            "rollouts_without_samples": self.rollouts_without_samples,
            "samples": self.samples,
            "samples_per_rollout": self.samples_per_rollout,
            "single_sample_share": self.single_sample_share,
            "calls_used": self.calls_used,
            "calls_other_attempts": self.calls_other_attempts,
            "calls_unseen": self.calls_unseen,
            "oversized_calls": self.oversized_calls,
            "oversized_tokens": self.oversized_tokens,
            "empty_samples": self.empty_samples,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "max_sample_tokens_seen": self.max_sample_tokens_seen,
        }
        for reason in BREAK_REASONS:
            metrics[f"breaks/{reason}"] = self.breaks.get(reason, 0)
        for reason in DROP_REASONS:
            metrics[f"calls_dropped/{reason}"] = self.calls_dropped.get(reason, 0)
        return {prefix + k: float(v) for k, v in metrics.items()}


@dataclass(slots=True)
class SampleBatch:
    """One step's samples (rollouts in input order, each rollout's samples in chain order)."""

    samples: list[Sample]
    stats: TrajectoryStats


def build_batch(
    rollouts: Iterable[tuple[Rollout, Sequence[Call]]], *, max_sample_tokens: int | None = None
) -> SampleBatch:
    """Build the samples of every ``(rollout, calls)`` pair and aggregate their statistics."""
    stats = TrajectoryStats()
    samples: list[Sample] = []
    for rollout, calls in rollouts:
        stats.calls_dropped.update(dropped_calls(rollout))
        if rollout.outcome is Outcome.INFRA_FAILURE:
            stats.rollouts_skipped_infra += 1
            continue
        built = build_rollout_samples(rollout, calls, max_sample_tokens=max_sample_tokens)
        stats.add(built)
        samples.extend(built.samples)
    return SampleBatch(samples=samples, stats=stats)


def dropped_calls(rollout: Rollout) -> Counter[str]:
    """The calls of ``rollout`` a gateway dropped, by reason (``metadata.dropped_calls``; malformed
    entries count as none)."""
    counts = rollout.metadata.get(DROPPED_CALLS_KEY)
    if not isinstance(counts, dict):
        return Counter()
    return Counter(
        {k: v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    )
