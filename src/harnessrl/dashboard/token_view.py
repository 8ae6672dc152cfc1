"""A rollout's calls table and the token view of its samples, on a trace or compare page.

The token view shades sampled tokens (loss mask 1) apart from context tokens, shows the behaviour
logprob on hover, and marks each call's response and each chain break. A rollout decides how many
calls it makes and how long their prompts are, so every part of this is bounded whatever it did: at
most ``MAX_TOKENS_SHOWN`` tokens of one sample, ``MAX_TOKENS_PER_PAGE`` tokens over all the samples
of a page (the page says which samples it left out, and ``?sample=K`` shows one alone), at most
``MAX_CALL_ROWS`` rows of calls, and a bounded amount of work to find which call broke which chain
(``call_break_reasons``).

The samples are built as the trainer builds them: with the run's ``trainer.max_sample_tokens``, a
call longer than it (prompt + response) is dropped, never shown as trained on. Calls the trainer
refuses (``InvalidBatch``: logprobs that are not one per token, an empty prompt) get no token view:
the page says why and still shows the calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harnessrl.dashboard.html import esc, url
from harnessrl.errors import InvalidBatch
from harnessrl.schemas import Call, Rollout
from harnessrl.trajectory import RolloutSamples, Sample, build_rollout_samples, calls_seen
from harnessrl.trajectory.batch import dropped_calls

Decoder = Callable[[int], str]  # token id -> its text
MAX_TOKENS_SHOWN = 20_000  # per sample; a longer one is cut (said so on the page)
MAX_TOKENS_PER_PAGE = 40_000  # over all the samples of a page (a compare page: half per rollout)
#: What a sample's heading and markers cost against ``MAX_TOKENS_PER_PAGE``, in tokens: so a rollout
#: of many one-token samples cannot fill a page with headings either.
_VIEW_OVERHEAD = 10
MAX_CALL_ROWS = 1_000  # rows of the calls table; the rest are counted
#: Tokens times chains that finding break reasons may walk (``call_break_reasons``): each rebuild of a
#: prefix of the calls compares every prompt with every chain so far. About 0.2 s of CPU; up to ~2 s
#: where each break's classification walks a long shared prefix (a prompt re-sent many times), which
#: the page's one full build of the samples pays as well.
MAX_BREAK_WORK = 50_000_000


@dataclass(frozen=True, slots=True)
class BreakReasons:
    """Which call started a new chain for which reason, found for the first ``checked`` calls of
    the final attempt (all ``total`` unless the work was bounded)."""

    by_call: dict[int, str] = field(default_factory=dict)  # call seq -> reason
    checked: int = 0
    total: int = 0


def call_break_reasons(
    rollout: Rollout, calls: Sequence[Call], built: RolloutSamples, *, max_sample_tokens: int | None = None
) -> BreakReasons:
    """``call seq -> reason`` for every call that started a new chain after the first.

    ``build_rollout_samples`` only counts breaks, so rebuild the samples from growing prefixes of the
    calls and see which call added to which reason's count. That is quadratic, so it stops once it
    has found all of ``built.breaks`` (the whole rollout's), or before its estimated work (each
    call's tokens times the chains its prompt is compared with, summed over the rebuilds) would pass
    ``MAX_BREAK_WORK``.
    """
    final = sorted((c for c in calls if c.attempt == rollout.attempt), key=lambda c: c.seq)
    reasons: dict[int, str] = {}
    before: Counter[str] = Counter()
    chains, rebuild_work, spent = 0, 0, 0
    for k, call in enumerate(final):
        if before.total() == built.breaks.total():
            return BreakReasons(reasons, len(final), len(final))  # no break left to find
        rebuild_work += (len(call.prompt_token_ids) + len(call.response_token_ids)) * (1 + chains)
        spent += rebuild_work
        if spent > MAX_BREAK_WORK:
            return BreakReasons(reasons, k, len(final))
        prefix = build_rollout_samples(rollout, final[: k + 1], max_sample_tokens=max_sample_tokens)
        added = prefix.breaks - before
        if added:
            reasons[call.seq] = next(iter(added))
        before, chains = prefix.breaks, len(prefix.samples) + prefix.empty_samples
    return BreakReasons(reasons, len(final), len(final))


@dataclass(frozen=True, slots=True)
class TokenViews:
    """Which token views a page shows: up to ``budget`` tokens over all samples, or with ``only``
    the sample of that index alone (``?sample=K``). ``trace_url``: the rollout's trace page, which
    the page links to for a sample it left out."""

    trace_url: str
    budget: int = MAX_TOKENS_PER_PAGE
    only: int | None = None


def tokens_html(
    sample: Sample, decode: Decoder, break_reason: str | None, limit: int = MAX_TOKENS_SHOWN
) -> str:
    """One sample's first ``limit`` tokens: context vs sampled shading, logprob on hover,
    call/version markers."""
    starts = {span.start: span for span in sample.spans}
    parts = []
    if break_reason:
        parts.append(
            f'<span class="brk" title="a new chain started here">chain break: {esc(break_reason)}</span>'
        )
    shown = min(len(sample.input_ids), limit)
    for i in range(shown):
        span = starts.get(i)
        if span is not None:
            parts.append(f'<span class="pv">call {span.call_seq} · v{span.policy_version}</span>')
        token_id = sample.input_ids[i]
        text = decode(token_id)
        if sample.loss_mask[i]:
            lp = sample.behaviour_logprobs[i]
            low = " low" if lp < -5 else ""
            title = f"#{i} id {token_id} · sampled · logprob {lp:.4f}"
            parts.append(f'<span class="tok smp{low}" title="{esc(title)}">{esc(text)}</span>')
        else:
            parts.append(f'<span class="tok ctx" title="#{i} id {token_id} · context">{esc(text)}</span>')
    if shown < len(sample.input_ids):
        parts.append(f'<span class="muted"> … {len(sample.input_ids) - shown} more tokens not shown</span>')
    return f'<div class="tokens">{"".join(parts)}</div>'


def _sample_view(sample: Sample, decode: Decoder, breaks: BreakReasons, limit: int, trace_url: str) -> str:
    first_seq = sample.spans[0].call_seq if sample.spans else None
    versions = sorted({span.policy_version for span in sample.spans})
    alone = (
        f' <a href="{url(trace_url, sample=sample.sample_index)}">show it alone</a>'
        if limit < min(len(sample), MAX_TOKENS_SHOWN)
        else ""
    )
    return (
        f'<h3 id="sample-{sample.sample_index}">sample {sample.sample_index}: {len(sample)} tokens, '
        f"{sample.num_loss_tokens} sampled, policy versions {esc(versions)}{alone}</h3>"
        + tokens_html(sample, decode, breaks.by_call.get(first_seq) if first_seq is not None else None, limit)
    )


def _left_out(first: int, count: int, views: TokenViews) -> str:
    """The note where the page's token budget ran out, with a form to show one sample alone."""
    return (
        f'<p class="muted" id="samples-not-shown">token views of samples {first}..{count - 1} not shown: '
        f"a page shows at most {views.budget:,} tokens.</p>"
        f'<form class="filters" method="get" action="{esc(views.trace_url)}"><label>sample'
        f'<input name="sample" type="number" min="0" max="{count - 1}" value="{first}"></label>'
        "<button>show it alone</button></form>"
    )


def views_html(built: RolloutSamples, decode: Decoder, breaks: BreakReasons, views: TokenViews) -> str:
    """The token views of ``built``'s samples, within ``views``' budget (or the one it names)."""
    samples = built.samples
    if views.only is not None:
        chosen = [s for s in samples if s.sample_index == views.only]
        back = f' <a href="{esc(views.trace_url)}">all samples</a>'
        if not chosen:
            return f'<p class="muted">This rollout has no sample {views.only}.{back}</p>'
        return f'<p class="muted">Sample {views.only} alone.{back}</p>' + _sample_view(
            chosen[0], decode, breaks, MAX_TOKENS_SHOWN, views.trace_url
        )
    parts, left = [], views.budget
    for sample in samples:
        if left <= 0:
            parts.append(_left_out(sample.sample_index, len(samples), views))
            break
        limit = min(MAX_TOKENS_SHOWN, left)
        parts.append(_sample_view(sample, decode, breaks, limit, views.trace_url))
        left -= min(len(sample), limit) + _VIEW_OVERHEAD
    return "".join(parts) or '<p class="muted">no samples</p>'


def calls_table(
    calls: Sequence[Call],
    built: RolloutSamples,
    breaks: BreakReasons,
    *,
    oversized: dict[int, int] | None = None,
) -> str:
    """The first ``MAX_CALL_ROWS`` calls; ``oversized``: the seq of each call the samples dropped as
    longer than ``trainer.max_sample_tokens``, and that cap."""
    sample_of = {span.call_seq: s.sample_index for s in built.samples for span in s.spans}
    rows = []
    for call in calls[:MAX_CALL_ROWS]:
        where = f"sample {sample_of[call.seq]}" if call.seq in sample_of else "not in a sample"
        if oversized and call.seq in oversized:
            size = len(call.prompt_token_ids) + len(call.response_token_ids)
            where = f"dropped: {size:,} tokens, over trainer.max_sample_tokens ({oversized[call.seq]:,})"
        reason = breaks.by_call.get(call.seq)
        brk = f' <span class="brk">break: {esc(reason)}</span>' if reason else ""
        took = "" if call.finished_at is None else f"{call.finished_at - call.started_at:.2f}s"
        rows.append(
            f"<tr><td class=num>{call.seq}</td><td class=num>{call.attempt}</td><td>{esc(call.api)}</td>"
            f'<td><span class="pv">v{call.policy_version}</span></td><td class=num>{len(call.prompt_token_ids)}</td>'
            f"<td class=num>{len(call.response_token_ids)}</td><td>{esc(call.finish_reason)}</td>"
            f"<td class=num>{took}</td><td>{where}{brk}</td></tr>"
        )
    head = (
        "<tr><th>call</th><th>attempt</th><th>api</th><th>policy version</th><th>prompt tokens</th>"
        "<th>sampled tokens</th><th>finish</th><th>time</th><th>sample</th></tr>"
    )
    more = (
        f'<p class="muted">… {len(calls) - MAX_CALL_ROWS} more calls not shown.</p>'
        if len(calls) > MAX_CALL_ROWS
        else ""
    )
    return f"<table class=calls>{head}{''.join(rows)}</table>{more}"


def _summary(
    built: RolloutSamples, breaks: BreakReasons, rollout: Rollout, max_sample_tokens: int | None
) -> str:
    dropped = dropped_calls(rollout)
    return (
        f"<p>{len(built.samples)} samples · breaks: {esc(dict(built.breaks)) if built.breaks else 'none'}"
        + (
            f" (which call broke which chain: found for the first {breaks.checked} of {breaks.total} calls,"
            " finding the rest would take too long)"
            if breaks.checked < breaks.total
            else ""
        )
        + f" · calls of earlier attempts ignored: {built.calls_other_attempts}"
        + (
            f" · calls recorded after the evaluator read them, left out: {built.calls_unseen}"
            if built.calls_unseen
            else ""
        )
        + (
            f" · calls longer than trainer.max_sample_tokens ({max_sample_tokens:,}), dropped:"
            f" {built.oversized_calls} ({built.oversized_tokens:,} tokens)"
            if built.oversized_calls
            else ""
        )
        + (f" · calls dropped by the gateway (never recorded): {esc(dict(dropped))}" if dropped else "")
        + "</p>"
    )


_LEGEND = (
    '<p><span class="tok smp">sampled</span> (trained on, logprob on hover) '
    '<span class="tok ctx">context</span> <span class="tok smp low">logprob &lt; −5</span> '
    '<span class="pv">call · policy version</span> <span class="brk">chain break</span></p>'
)


def samples_html(
    rollout: Rollout,
    calls: Sequence[Call],
    decode: Decoder,
    views: TokenViews,
    *,
    max_sample_tokens: int | None = None,
) -> tuple[str, str]:
    """(calls table, token views) for a rollout, its samples built as the trainer builds them
    (``max_sample_tokens``: the run's ``trainer.max_sample_tokens``)."""
    try:
        built = build_rollout_samples(rollout, calls, max_sample_tokens=max_sample_tokens)
    except InvalidBatch as exc:  # the trainer refuses these calls too: show them, and why
        empty = RolloutSamples(rollout_id=rollout.rollout_id, samples=[])
        note = (
            f'<p><span class="badge b-flag">no samples</span> the trainer refuses these calls: {esc(exc)}</p>'
        )
        return calls_table(calls, empty, BreakReasons()), note
    breaks = call_break_reasons(rollout, calls, built, max_sample_tokens=max_sample_tokens)
    oversized = _oversized(rollout, calls, max_sample_tokens) if built.oversized_calls else {}
    tokens = (
        _summary(built, breaks, rollout, max_sample_tokens)
        + _LEGEND
        + views_html(built, decode, breaks, views)
    )
    return calls_table(calls, built, breaks, oversized=oversized), tokens


def _oversized(rollout: Rollout, calls: Sequence[Call], cap: int | None) -> dict[int, int]:
    """``seq -> cap`` of the calls ``build_rollout_samples`` dropped as longer than ``cap``: those of
    the final attempt the evaluator saw (``calls_seen``) whose prompt + response pass it."""
    if cap is None:
        return {}
    final = sorted((c for c in calls if c.attempt == rollout.attempt), key=lambda c: c.seq)
    seen = calls_seen(rollout)
    return {
        c.seq: cap
        for c in (final if seen is None else final[:seen])
        if len(c.prompt_token_ids) + len(c.response_token_ids) > cap
    }
