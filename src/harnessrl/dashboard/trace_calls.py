"""What a trace or compare page keeps of a rollout's calls, read one call at a time.

A rollout decides how many calls it makes and how long their prompts are. Decoded all at once, its
calls held every prompt whole: 1,000 calls of 40 k tokens took 2 GB for one trace page. Here each
attempt's calls are decoded one by one (``DashboardData.each_call``) and only what the page shows
is kept: a ``CallRow`` of each of the first ``MAX_CALL_ROWS`` calls (the calls table, the
timeline), the last call whole (the conversation), and the samples, built call by call as the
trainer builds them (``trajectory.SampleBuilder``), with the reason each chain broke. The samples
hold each chain's tokens once, as the trainer's do, up to ``MAX_TOKENS_BUILT``.

An attempt whose rows cannot be decoded (a damaged row) is left out whole, as if it had no calls,
and named in ``TraceCalls.unreadable``; calls the trainer refuses (``InvalidBatch``) build no
samples, and ``TraceCalls.refused`` says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harnessrl.dashboard.data import DashboardData
from harnessrl.errors import InvalidBatch, NotFound, UpstreamError
from harnessrl.schemas import Call, Rollout
from harnessrl.store.damage import DAMAGED_ROW
from harnessrl.trajectory import RolloutSamples, SampleBuilder, calls_seen

MAX_CALL_ROWS = 1_000  # calls a page lists (the calls table, the timeline); the rest are counted
#: The most tokens a page's samples may hold (about 60 bytes each): a rollout whose every call starts
#: a new chain holds every prompt in its samples, 12 M tokens (800 MB) for 300 calls of 40 k. Past
#: it no more calls are added, and the page says from how many calls its samples were built.
MAX_TOKENS_BUILT = 1_000_000


@dataclass(frozen=True, slots=True)
class CallRow:
    """What the calls table and the timeline show of one call: no tokens, no request."""

    seq: int
    attempt: int
    api: str
    policy_version: int
    prompt_tokens: int
    sampled_tokens: int
    finish_reason: Any
    started_at: float | None  # None: the row's time is no number (a damaged row)
    finished_at: float | None

    @classmethod
    def of(cls, call: Call) -> CallRow:
        return cls(
            call.seq,
            call.attempt,
            call.api,
            call.policy_version,
            len(call.prompt_token_ids),
            len(call.response_token_ids),
            call.finish_reason,
            _time(call.started_at),
            _time(call.finished_at),
        )


def _time(value: Any) -> float | None:
    """A call's time as the row holds it, if it is a number: decoding does not check the columns it
    copies, and a damaged row's text there failed the whole trace page (a 500) where a call's
    duration was worked out."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(slots=True)
class TraceCalls:
    """What a page keeps of a rollout's calls (those of the attempts that could be read)."""

    rows: list[CallRow]  # the first ``MAX_CALL_ROWS`` calls, by seq
    total: int  # calls in all
    last: Call | None  # the last call, whole
    built: RolloutSamples  # the samples, built as the trainer builds them
    breaks: dict[int, str] = field(default_factory=dict)  # call seq -> why it started a new chain
    oversized: dict[int, int] = field(default_factory=dict)  # seq -> the cap it was dropped over
    refused: str | None = None  # why the trainer refuses these calls (then no samples)
    built_from: int | None = None  # set when the samples were cut short: the calls they were built from
    to_build: int = 0  # the calls the trainer builds samples from (``built.calls_used`` and the dropped)
    unbuilt: set[int] = field(default_factory=set)  # seqs of ``rows`` past the cut: in no sample built
    unreadable: dict[int, str] = field(default_factory=dict)  # attempt -> why its calls cannot be read


def _order(seq: Any) -> tuple[bool, Any]:
    """A sort key for seqs that a damaged row may have made other than integers."""
    return (True, str(seq)) if type(seq) is not int else (False, seq)


class _AttemptReader:
    """One attempt's calls as they are decoded: its first rows, its last call and, for the rollout's
    final attempt, the samples."""

    def __init__(
        self, builder: SampleBuilder | None, seen: int | None, cap: int | None, max_rows: int, max_tokens: int
    ) -> None:
        self.builder, self.seen, self.cap, self.max_rows = builder, seen, cap, max_rows
        self.max_tokens = max_tokens
        self.rows: list[CallRow] = []
        self.count, self.unseen = 0, 0
        self.last: Call | None = None
        self.breaks: dict[int, str] = {}
        self.oversized: dict[int, int] = {}
        self.refused: str | None = None
        self.fed = 0  # calls given to the builder
        self.to_build = 0  # calls the trainer would build from
        self.built_from: int | None = None  # the calls fed, once the builder held its most tokens
        self.unbuilt: set[int] = set()

    def visit(self, call: Call) -> None:
        listed = len(self.rows) < self.max_rows
        if listed:
            self.rows.append(CallRow.of(call))
        self.count += 1
        self.last = call
        if self.builder is None:
            return
        if self.seen is not None and self.count > self.seen:
            self.unseen += 1  # recorded after the evaluator read the calls: not trained on
            return
        self.to_build += 1
        if self.built_from is not None or self.builder.tokens >= self.max_tokens:
            self.built_from = self.fed  # the samples hold their most: the rest are not read for them
            if listed:
                self.unbuilt.add(call.seq)
            return
        self.fed += 1
        if self.cap is not None and len(call.prompt_token_ids) + len(call.response_token_ids) > self.cap:
            self.oversized[call.seq] = self.cap
        try:
            reason = self.builder.add(call)
        except InvalidBatch as exc:  # the trainer refuses these calls too: the page says why
            self.refused, self.builder, self.breaks, self.oversized = str(exc), None, {}, {}
            return
        if reason is not None:
            self.breaks[call.seq] = reason


def read_trace_calls(
    data: DashboardData,
    rollout_id: str,
    rollout: Rollout | None,
    *,
    max_sample_tokens: int | None = None,
    max_rows: int = MAX_CALL_ROWS,
    max_tokens: int = MAX_TOKENS_BUILT,
) -> TraceCalls:
    """What a page shows of ``rollout_id``'s calls; ``rollout`` None (its row cannot be read): no
    samples. ``max_sample_tokens``: the run's ``trainer.max_sample_tokens``; ``max_tokens``: the
    most tokens the samples may hold before no more calls are added to them."""
    final = rollout.attempt if rollout is not None else None
    trace = TraceCalls(rows=[], total=0, last=None, built=RolloutSamples(rollout_id=rollout_id, samples=[]))
    other_attempts = 0
    for attempt in data.call_attempts(rollout_id):
        builder = None
        if rollout is not None and attempt == final:
            builder = SampleBuilder(rollout, max_sample_tokens=max_sample_tokens)
        seen = calls_seen(rollout) if rollout is not None else None
        reader = _AttemptReader(builder, seen, max_sample_tokens, max_rows, max_tokens)
        try:
            data.each_call(rollout_id, attempt, reader.visit)
        except (NotFound, UpstreamError):
            raise  # the store file itself is gone or unreadable: the page's 404 or 503, not damage
        except DAMAGED_ROW as exc:  # its calls are left out whole, as decoding them all at once did
            trace.unreadable[attempt] = f"{type(exc).__name__}: {exc}"[:500]
            continue
        trace.rows += reader.rows
        trace.total += reader.count
        if reader.last is not None and (
            trace.last is None or _order(reader.last.seq) > _order(trace.last.seq)
        ):
            trace.last = reader.last
        if builder is None:
            other_attempts += reader.count
            continue
        trace.breaks, trace.oversized, trace.refused = reader.breaks, reader.oversized, reader.refused
        trace.built_from, trace.to_build, trace.unbuilt = reader.built_from, reader.to_build, reader.unbuilt
        if reader.builder is not None:
            trace.built = reader.builder.finish()
            trace.built.calls_unseen = reader.unseen
    trace.rows = sorted(trace.rows, key=lambda row: _order(row.seq))[:max_rows]
    trace.built.calls_other_attempts = other_attempts
    return trace
