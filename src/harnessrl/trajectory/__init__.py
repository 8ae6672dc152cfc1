"""Trajectory building: a rollout's recorded calls → training samples (chains), plus their export.

Pure Python (no torch): the gateway and dashboard may import it. See ``docs/trajectories.md``.
"""

from harnessrl.trajectory.batch import SampleBatch, TrajectoryStats, build_batch
from harnessrl.trajectory.export import FORMAT, iter_samples, read_samples, write_samples
from harnessrl.trajectory.samples import (
    BREAK_REASONS,
    CALLS_SEEN_KEY,
    RolloutSamples,
    Sample,
    SampleBuilder,
    SampledSpan,
    build_rollout_samples,
    calls_seen,
    calls_to_samples,
    group_key,
)

__all__ = [
    "BREAK_REASONS",
    "CALLS_SEEN_KEY",
    "FORMAT",
    "RolloutSamples",
    "Sample",
    "SampleBatch",
    "SampleBuilder",
    "SampledSpan",
    "TrajectoryStats",
    "build_batch",
    "build_rollout_samples",
    "calls_seen",
    "calls_to_samples",
    "group_key",
    "iter_samples",
    "read_samples",
    "write_samples",
]
