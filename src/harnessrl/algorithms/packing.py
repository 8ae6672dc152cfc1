"""Step-wide loss normalizers and packing a step's samples into micro-batches by token budget.

The loss of a step is normalized by *step* totals (per-rollout loss-token counts, number of
rollouts, samples and loss tokens), never by micro-batch totals, so that summing the micro-batch
losses gives exactly the whole-step loss however the samples are split. ``step_totals`` computes
those totals once per step; every micro-batch carries them into ``harnessrl.algorithms.losses``.

Pure Python (no torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from harnessrl.errors import ConfigError, InvalidBatch
from harnessrl.trajectory import Sample


@dataclass(frozen=True, slots=True)
class StepTotals:
    """Normalizers of one optimizer step.

    ``rollout_ids[r]`` has ``rollout_token_counts_R[r]`` loss tokens over all its samples;
    ``sample_token_counts_S[s]`` is the loss-token count of the step's ``s``-th sample. A rollout
    with no loss token contributes nothing and is not counted in ``num_rollouts``.
    """

    rollout_ids: tuple[str, ...]
    rollout_token_counts_R: tuple[int, ...]
    sample_token_counts_S: tuple[int, ...]
    _rollout_index: dict[str, int] = field(repr=False)
    _sample_index: dict[tuple[str, int], int] = field(repr=False)

    @property
    def num_rollouts(self) -> int:
        return sum(1 for n in self.rollout_token_counts_R if n > 0)

    @property
    def num_samples(self) -> int:
        return sum(1 for n in self.sample_token_counts_S if n > 0)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.rollout_token_counts_R)

    def rollout_index(self, sample: Sample) -> int:
        return self._rollout_index[sample.rollout_id]

    def sample_index(self, sample: Sample) -> int:
        return self._sample_index[(sample.rollout_id, sample.sample_index)]


def step_totals(samples: Sequence[Sample]) -> StepTotals:
    """The normalizers of a step made of ``samples`` (all samples of every rollout in the step)."""
    rollout_index: dict[str, int] = {}
    sample_index: dict[tuple[str, int], int] = {}
    rollout_counts: list[int] = []
    sample_counts: list[int] = []
    for sample in samples:
        key = (sample.rollout_id, sample.sample_index)
        if key in sample_index:
            raise InvalidBatch(f"sample {key} appears twice in the step")
        sample_index[key] = len(sample_counts)
        n = sample.num_loss_tokens
        sample_counts.append(n)
        r = rollout_index.setdefault(sample.rollout_id, len(rollout_counts))
        if r == len(rollout_counts):
            rollout_counts.append(0)
        rollout_counts[r] += n
    return StepTotals(
        rollout_ids=tuple(rollout_index),
        rollout_token_counts_R=tuple(rollout_counts),
        sample_token_counts_S=tuple(sample_counts),
        _rollout_index=rollout_index,
        _sample_index=sample_index,
    )


def pack_micro_batches(samples: Sequence[Sample], max_tokens: int) -> list[list[Sample]]:
    """Split a step's samples into micro-batches of at most ``max_tokens`` tokens in total.

    First-fit decreasing on sample length: few micro-batches, and with the packed layout of
    ``losses.collate`` no padding at all. Deterministic (ties keep input order). Every sample is in
    exactly one micro-batch, so all samples of a rollout stay in the step; the exact rollout-level
    normalization (``StepTotals``) makes it irrelevant which micro-batch each one lands in.
    """
    if max_tokens < 1:
        raise ConfigError("max_tokens must be at least 1")
    longest = max((len(s) for s in samples), default=0)
    if longest > max_tokens:
        raise ConfigError(
            f"a sample has {longest} tokens, more than the micro-batch budget {max_tokens}; "
            "raise the budget to at least max_sample_tokens"
        )
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i]), i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(samples[i])
        for b, left in enumerate(room):
            if n <= left:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(max_tokens - n)
    return [[samples[i] for i in sorted(b)] for b in bins]
