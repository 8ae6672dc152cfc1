"""A rollout's calls table and the token view of its samples, on a trace or compare page.

The token view shades sampled tokens (loss mask 1) apart from context tokens, shows the behaviour
logprob on hover, and marks each call's response and each chain break. A rollout decides how many
calls it makes and how long their prompts are, so every part of this is bounded whatever it did: at
most ``MAX_TOKENS_SHOWN`` tokens of one sample, ``MAX_TOKENS_PER_PAGE`` tokens over all the samples
of a page (the page says which samples it left out, and ``?sample=K`` shows one alone), at most
``MAX_CALL_ROWS`` rows of calls; the calls are read one at a time (``dashboard.trace_calls``), which
also says which call broke which chain.

The samples are built as the trainer builds them: with the run's ``trainer.max_sample_tokens``, a
call longer than it (prompt + response) is dropped, never shown as trained on. Calls the trainer
refuses (``InvalidBatch``: logprobs that are not one per token, an empty prompt) get no token view:
the page says why and still shows the calls.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from harnessrl.dashboard.html import esc, url
from harnessrl.dashboard.trace_calls import MAX_CALL_ROWS, MAX_TOKENS_BUILT, CallRow, TraceCalls
from harnessrl.schemas import Rollout
from harnessrl.trajectory import RolloutSamples, Sample
from harnessrl.trajectory.batch import dropped_calls

Decoder = Callable[[int], str]  # token id -> its text
MAX_TOKENS_SHOWN = 20_000  # per sample; a longer one is cut (said so on the page)
MAX_TOKENS_PER_PAGE = 40_000  # over all the samples of a page (a compare page: half per rollout)
#: What a sample's heading and markers cost against ``MAX_TOKENS_PER_PAGE``, in tokens: so a rollout
#: of many one-token samples cannot fill a page with headings either.
_VIEW_OVERHEAD = 10


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


def _sample_view(
    sample: Sample, decode: Decoder, breaks: Mapping[int, str], limit: int, trace_url: str
) -> str:
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
        + tokens_html(sample, decode, breaks.get(first_seq) if first_seq is not None else None, limit)
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


def views_html(built: RolloutSamples, decode: Decoder, breaks: Mapping[int, str], views: TokenViews) -> str:
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
    rows: Sequence[CallRow],
    built: RolloutSamples,
    breaks: Mapping[int, str],
    *,
    total: int | None = None,
    oversized: Mapping[int, int] | None = None,
    unbuilt: Collection[int] = (),
) -> str:
    """The first ``MAX_CALL_ROWS`` of ``rows`` (of ``total`` calls: the rest are counted);
    ``oversized``: the seq of each call the samples dropped as longer than
    ``trainer.max_sample_tokens``, and that cap; ``unbuilt``: the seqs of calls past where the
    page stopped building samples (``TraceCalls.built_from``)."""
    sample_of = {span.call_seq: s.sample_index for s in built.samples for span in s.spans}
    lines = []
    for call in rows[:MAX_CALL_ROWS]:
        where = f"sample {sample_of[call.seq]}" if call.seq in sample_of else "not in a sample"
        if call.seq in unbuilt:
            where = "not read for samples (past the page's most tokens)"
        if oversized and call.seq in oversized:
            size = call.prompt_tokens + call.sampled_tokens
            where = f"dropped: {size:,} tokens, over trainer.max_sample_tokens ({oversized[call.seq]:,})"
        reason = breaks.get(call.seq)
        brk = f' <span class="brk">break: {esc(reason)}</span>' if reason else ""
        took = (
            ""
            if call.finished_at is None or call.started_at is None
            else f"{call.finished_at - call.started_at:.2f}s"
        )
        lines.append(
            f"<tr><td class=num>{esc(call.seq)}</td><td class=num>{esc(call.attempt)}</td><td>{esc(call.api)}</td>"
            f'<td><span class="pv">v{esc(call.policy_version)}</span></td><td class=num>{call.prompt_tokens}</td>'
            f"<td class=num>{call.sampled_tokens}</td><td>{esc(call.finish_reason)}</td>"
            f"<td class=num>{took}</td><td>{where}{brk}</td></tr>"
        )
    head = (
        "<tr><th>call</th><th>attempt</th><th>api</th><th>policy version</th><th>prompt tokens</th>"
        "<th>sampled tokens</th><th>finish</th><th>time</th><th>sample</th></tr>"
    )
    left = (len(rows) if total is None else total) - len(lines)
    more = f'<p class="muted">… {left} more calls not shown.</p>' if left > 0 else ""
    return f"<table class=calls>{head}{''.join(lines)}</table>{more}"


def _summary(calls: TraceCalls, rollout: Rollout, max_sample_tokens: int | None) -> str:
    built, dropped = calls.built, dropped_calls(rollout)
    return (
        f"<p>{len(built.samples)} samples · breaks: {esc(dict(built.breaks)) if built.breaks else 'none'}"
        + (
            f' <span class="badge b-flag">cut short</span> built from the first {calls.built_from:,} of'
            f" {calls.to_build:,} calls: their samples hold {MAX_TOKENS_BUILT:,} tokens, the most a page builds"
            if calls.built_from is not None
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
    calls: TraceCalls,
    decode: Decoder,
    views: TokenViews,
    *,
    max_sample_tokens: int | None = None,
) -> tuple[str, str]:
    """(calls table, token views) for a rollout, its samples built as the trainer builds them
    (``max_sample_tokens``: the run's ``trainer.max_sample_tokens``)."""
    if calls.refused is not None:  # the trainer refuses these calls too: show them, and why
        empty = RolloutSamples(rollout_id=rollout.rollout_id, samples=[])
        note = (
            '<p><span class="badge b-flag">no samples</span> the trainer refuses these calls: '
            f"{esc(calls.refused)}</p>"
        )
        return calls_table(calls.rows, empty, {}, total=calls.total), note
    built = calls.built
    tokens = (
        _summary(calls, rollout, max_sample_tokens) + _LEGEND + views_html(built, decode, calls.breaks, views)
    )
    table = calls_table(
        calls.rows, built, calls.breaks, total=calls.total, oversized=calls.oversized, unbuilt=calls.unbuilt
    )
    return table, tokens
