"""The trace view of one rollout and the side-by-side compare view.

A trace shows what the harness saw (the last call's request messages plus the answer, with tool
calls and results), the evaluator's output, audit flags with the offending substring highlighted,
every call (policy version, sizes, which sample it extended or why its chain broke), and the token
view of each sample: sampled tokens (loss mask 1) and context tokens shaded differently, the
behaviour logprob on hover, and chain breaks marked where a new sample starts. Its summary says
when the rollout was made and trained (policy steps, see ``_when_rows``), the advantage it was
trained with, and links to the harness's stdout/stderr of each attempt.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from harnessrl.dashboard.html import badge, esc, fmt_num, pretty_json, result_badge, url
from harnessrl.dashboard.logs import LogFile
from harnessrl.dashboard.tool_requests import timeline_html
from harnessrl.schemas import Call, Rollout, ToolRequest
from harnessrl.trajectory import RolloutSamples, Sample, build_rollout_samples
from harnessrl.trajectory.batch import dropped_calls

Decoder = Callable[[int], str]  # token id -> its text
MAX_TOKENS_SHOWN = 20_000  # per sample; a longer one is cut (said so on the page)
MAX_CALLS_FOR_BREAKS = 300  # break reasons are found by rebuilding prefixes: quadratic in calls


def call_break_reasons(rollout: Rollout, calls: Sequence[Call]) -> dict[int, str]:
    """``call seq -> reason`` for every call that started a new chain after the first.

    ``build_rollout_samples`` only counts breaks, so rebuild the samples from growing prefixes of the
    calls and see which call added to which reason's count.
    """
    final = sorted((c for c in calls if c.attempt == rollout.attempt), key=lambda c: c.seq)
    if len(final) > MAX_CALLS_FOR_BREAKS:
        return {}
    reasons: dict[int, str] = {}
    before: Counter[str] = Counter()
    for k, call in enumerate(final):
        after = build_rollout_samples(rollout, final[: k + 1]).breaks
        added = after - before
        if added:
            reasons[call.seq] = next(iter(added))
        before = after
    return reasons


def _text(content: Any) -> str:
    if isinstance(content, str):
        return f"<pre>{esc(content)}</pre>"
    if isinstance(content, list):
        return "".join(_block(block) for block in content)
    return "" if content is None else pretty_json(content)


def _block(block: Any) -> str:
    """One content block (OpenAI parts, Anthropic blocks, Responses items)."""
    if not isinstance(block, dict):
        return _text(block)
    kind = block.get("type", "")
    if kind in ("text", "input_text", "output_text") or ("text" in block and len(block) <= 3):
        return f"<pre>{esc(block.get('text', ''))}</pre>"
    if kind == "tool_use":
        return f"<div>{badge('tool call')} <b>{esc(block.get('name'))}</b>{pretty_json(block.get('input'))}</div>"
    if kind == "tool_result":
        return f"<div>{badge('tool result')}{_text(block.get('content'))}</div>"
    if kind == "function_call":
        return f"<div>{badge('tool call')} <b>{esc(block.get('name'))}</b><pre>{esc(block.get('arguments'))}</pre></div>"
    if kind == "function_call_output":
        return f"<div>{badge('tool result')}<pre>{esc(block.get('output'))}</pre></div>"
    if kind in ("thinking", "reasoning"):
        return f"<details><summary>{esc(kind)}</summary>{pretty_json(block)}</details>"
    return pretty_json(block)


def message_html(message: Any, extra_class: str = "") -> str:
    if not isinstance(message, dict):
        return f'<div class="msg">{_text(message)}</div>'
    role = str(message.get("role") or message.get("type") or "message")
    parts = [_text(message.get("content"))] if "content" in message else []
    if "content" not in message and "type" in message:
        parts.append(_block(message))
    for tool_call in message.get("tool_calls") or []:
        fn = tool_call.get("function", {}) if isinstance(tool_call, dict) else {}
        parts.append(
            f"<div>{badge('tool call')} <b>{esc(fn.get('name'))}</b><pre>{esc(fn.get('arguments'))}</pre></div>"
        )
    for key in ("reasoning_content", "reasoning", "thinking"):
        if message.get(key):
            parts.append(f"<details><summary>{esc(key)}</summary><pre>{esc(message[key])}</pre></details>")
    return f'<div class="msg {esc(role)} {extra_class}"><div class="role">{esc(role)}</div>{"".join(parts)}</div>'


def conversation_html(calls: Sequence[Call]) -> str:
    """The last call's request (what the harness had built up) followed by the policy's answer."""
    if not calls:
        return '<p class="muted">No model calls recorded.</p>'
    last = calls[-1]
    request = last.request
    messages: list[Any] = []
    if request.get("system"):
        messages.append({"role": "system", "content": request["system"]})
    if isinstance(request.get("instructions"), str):
        messages.append({"role": "system", "content": request["instructions"]})
    if "messages" in request:
        messages += list(request["messages"])
    elif isinstance(request.get("input"), list):
        messages += list(request["input"])
    elif "input" in request or "prompt" in request:
        messages.append({"role": "user", "content": request.get("input", request.get("prompt"))})
    answer = message_html(last.response, "answer") if last.response else ""
    note = f'<p class="muted">As the harness sent call {last.seq} ({esc(last.api)}), then the answer.</p>'
    return note + "".join(message_html(m) for m in messages) + answer


def highlight(command: str, match: str) -> str:
    """``command`` escaped, with every occurrence of ``match`` in a ``<mark>``."""
    if not match or match not in command:
        return esc(command)
    return f'<mark class="hit">{esc(match)}</mark>'.join(esc(part) for part in command.split(match))


def audit_html(rollout: Rollout) -> str:
    entries = rollout.metadata.get("audit") or []
    if not rollout.flags and not entries:
        return '<p class="muted">No audit flags.</p>'
    parts = ["<p>" + " ".join(badge(flag, "flag") for flag in rollout.flags) + "</p>"]
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        parts.append(
            f'<div class="card flag">{badge(entry.get("rule"), "flag")} call {esc(entry.get("call_seq"))}'
            f"<pre>{highlight(str(entry.get('command', '')), str(entry.get('match', '')))}</pre></div>"
        )
    return "".join(parts)


def evaluation_html(rollout: Rollout) -> str:
    meta = rollout.metadata
    rows = [
        ("result", result_badge(rollout.reward, rollout.outcome)),
        ("harness ended", badge(rollout.outcome)),
        ("reward", esc(fmt_num(rollout.reward, 4))),
        ("reward before audit", esc(fmt_num(meta.get("reward_before_audit"), 4))),
        ("exit", esc(json.dumps(meta.get("exit"))) if meta.get("exit") else ""),
        ("error", f"<pre>{esc(rollout.error)}</pre>" if rollout.error else ""),
    ]
    table = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows if v)
    return (
        f'<table class="kv">{table}</table><h3>evaluator output</h3>{pretty_json(meta.get("evaluation", {}))}'
    )


def tokens_html(sample: Sample, decode: Decoder, break_reason: str | None) -> str:
    """One sample's tokens: context vs sampled shading, logprob on hover, call/version markers."""
    starts = {span.start: span for span in sample.spans}
    parts = []
    if break_reason:
        parts.append(
            f'<span class="brk" title="a new chain started here">chain break: {esc(break_reason)}</span>'
        )
    shown = min(len(sample.input_ids), MAX_TOKENS_SHOWN)
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


def calls_table(calls: Sequence[Call], built: RolloutSamples, breaks: dict[int, str]) -> str:
    sample_of = {span.call_seq: s.sample_index for s in built.samples for span in s.spans}
    rows = []
    for call in calls:
        where = f"sample {sample_of[call.seq]}" if call.seq in sample_of else "not in a sample"
        brk = f' <span class="brk">break: {esc(breaks[call.seq])}</span>' if call.seq in breaks else ""
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
    return f"<table class=calls>{head}{''.join(rows)}</table>"


def samples_html(rollout: Rollout, calls: Sequence[Call], decode: Decoder) -> tuple[str, str]:
    """(calls table, token views) for a rollout."""
    built = build_rollout_samples(rollout, calls)
    breaks = call_break_reasons(rollout, calls)
    views = []
    for sample in built.samples:
        first_seq = sample.spans[0].call_seq if sample.spans else None
        versions = sorted({span.policy_version for span in sample.spans})
        views.append(
            f'<h3 id="sample-{sample.sample_index}">sample {sample.sample_index}: {len(sample)} tokens, '
            f"{sample.num_loss_tokens} sampled, policy versions {esc(versions)}</h3>"
            + tokens_html(sample, decode, breaks.get(first_seq) if first_seq is not None else None)
        )
    dropped = dropped_calls(rollout)
    summary = (
        f"<p>{len(built.samples)} samples · breaks: {esc(dict(built.breaks)) if built.breaks else 'none'}"
        f" · calls of earlier attempts ignored: {built.calls_other_attempts}"
        + (
            f" · calls recorded after the evaluator read them, left out: {built.calls_unseen}"
            if built.calls_unseen
            else ""
        )
        + (f" · calls dropped by the gateway (never recorded): {esc(dict(dropped))}" if dropped else "")
        + "</p>"
    )
    legend = (
        '<p><span class="tok smp">sampled</span> (trained on, logprob on hover) '
        '<span class="tok ctx">context</span> <span class="tok smp low">logprob &lt; −5</span> '
        '<span class="pv">call · policy version</span> <span class="brk">chain break</span></p>'
    )
    return calls_table(calls, built, breaks), summary + legend + (
        "".join(views) or '<p class="muted">no samples</p>'
    )


def _when_rows(rollout: Rollout) -> list[tuple[str, str]]:
    """Which policy steps the rollout belongs to, named for what they are: a training rollout's
    ``step`` is the step at which its group was created and ``metadata.trained_at_step`` the step
    that trained on it; a held-out rollout's ``step`` is the step it evaluated."""
    meta, step = rollout.metadata, esc(rollout.step)
    if meta.get("kind") == "eval":
        return [("split", "held-out"), ("evaluated at step", step)]
    if meta.get("kind") != "train":
        return [("step", step)]
    trained = meta.get("trained_at_step")
    return [
        ("split", "train"),
        ("created at step", step),
        ("trained at step", "not trained (yet)" if trained is None else f"<b>{esc(trained)}</b>"),
        ("advantage", _advantage_html(meta)),
    ]


def _advantage_html(meta: dict[str, Any]) -> str:
    """``metadata.advantage``: the trainer writes None for a rollout that taught nothing; a run
    from before it recorded advantages has no key at all (nothing is shown then)."""
    if "advantage" not in meta:
        return ""
    advantage = meta["advantage"]
    if isinstance(advantage, int | float):
        return f"<b>{esc(fmt_num(advantage, 4))}</b>"
    return '<span class="muted">none: it taught nothing (a zero-variance group, stale, or failed)</span>'


def logs_html(rollout: Rollout, logs: Sequence[LogFile], prefix: str) -> str:
    """Links to the harness's stdout/stderr, one line per attempt (earlier attempts were retried)."""
    by_attempt: dict[int, list[LogFile]] = {}
    for log in logs:
        by_attempt.setdefault(log.attempt, []).append(log)
    lines = []
    for attempt, files in sorted(by_attempt.items()):
        links = " · ".join(
            f'<a class="log-link" href="{esc(prefix)}/rollouts/{esc(rollout.rollout_id)}/logs/{attempt}/'
            f'{esc(f.stream)}">{esc(f.stream)}</a> <span class="muted">({f.size:,} B)</span>'
            for f in files
        )
        lines.append(f"attempt {attempt}: {links}")
    return "<br>".join(lines)


def _summary(rollout: Rollout, prefix: str, logs: Sequence[LogFile] = ()) -> str:
    r = rollout
    group = r.metadata.get("group")
    rows = [
        ("rollout", esc(r.rollout_id)),
        ("run", esc(r.run_id)),
        *_when_rows(r),
        ("task", esc(r.task_id)),
        (
            "group",
            f'<a href="{url(prefix + "/rollouts", group=r.group_id)}">{esc(r.group_id)}</a>'
            + (f' <span class="muted">(training group {esc(group)})</span>' if isinstance(group, int) else "")
            if r.group_id
            else "",
        ),
        ("status", badge(r.status)),
        ("attempt", esc(r.attempt)),
        ("harness logs", logs_html(r, logs, prefix)),
    ]
    return (
        '<table class="kv">'
        + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows if v)
        + "</table>"
    )


def trace_body(
    rollout: Rollout,
    calls: Sequence[Call],
    decode: Decoder,
    prefix: str,
    *,
    logs: Sequence[LogFile] = (),
    tool_requests: Sequence[ToolRequest] = (),
) -> str:
    calls_tbl, token_views = samples_html(rollout, calls, decode)
    return (
        f"<h1>Rollout {esc(rollout.rollout_id)} {result_badge(rollout.reward, rollout.outcome)}</h1>"
        f"{_summary(rollout, prefix, logs)}"
        f"<details><summary>task</summary>{pretty_json(rollout.task)}</details>"
        f'<h2>Evaluation</h2><div class="card">{evaluation_html(rollout)}</div>'
        f'<h2>Audit</h2><div class="card">{audit_html(rollout)}</div>'
        f'<h2>Conversation</h2><div class="conversation">{conversation_html(calls)}</div>'
        f"<h2>Calls</h2>{calls_tbl}"
        + (f"<h2>Calls and tool requests</h2>{timeline_html(calls, tool_requests)}" if tool_requests else "")
        + f"<h2>Tokens</h2>{token_views}"
    )


def compare_body(pairs: list[tuple[Rollout, list[Call]]], decode: Decoder, prefix: str) -> str:
    a, b = pairs[0][0], pairs[1][0]
    warn = (
        ""
        if a.group_id is not None and a.group_id == b.group_id
        else '<p class="badge b-flag">these rollouts are not in the same group</p>'
    )
    cols = []
    for rollout, calls in pairs:
        _, tokens = samples_html(rollout, calls, decode)
        cols.append(
            f'<div class="side"><h2><a href="{esc(prefix)}/rollouts/{esc(rollout.rollout_id)}">'
            f"{esc(rollout.rollout_id)}</a> {result_badge(rollout.reward, rollout.outcome)} reward {esc(fmt_num(rollout.reward, 4))}</h2>"
            f"{_summary(rollout, prefix)}<h3>Evaluation</h3>{evaluation_html(rollout)}"
            f"<h3>Audit</h3>{audit_html(rollout)}<h3>Conversation</h3>{conversation_html(calls)}"
            f"<h3>Tokens</h3>{tokens}</div>"
        )
    return f'<h1>Compare</h1>{warn}<div class="compare">{"".join(cols)}</div>'
