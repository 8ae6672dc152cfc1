"""The trace view of one rollout and the side-by-side compare view.

A trace shows what the policy saw (the last call's messages plus the answer, with tool calls and
results: ``dashboard.conversation``), the evaluator's output, audit flags with the offending
substring highlighted, every call (policy version, sizes, which sample it extended or why its chain
broke), and the token view of the samples (``dashboard.token_view``, bounded per page): sampled
tokens (loss mask 1) and context tokens shaded differently, the behaviour logprob on hover, and
chain breaks marked where a new sample starts. Its summary says
when the rollout was made and trained (policy steps, see ``_when_rows``), the advantage it was
trained with, and links to the harness's stdout/stderr of each attempt. An attempt whose recorded
calls cannot be read (a damaged row: ``dashboard.trace_calls``), or whose own row's JSON could
not be (``DAMAGED_ROW_KEY``), is named in a card at the top; the page shows everything else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harnessrl.dashboard.conversation import MAX_JSON_CHARS, conversation_html
from harnessrl.dashboard.data import DAMAGED_ROW_KEY
from harnessrl.dashboard.html import badge, esc, fmt_num, pretty_json, result_badge, trace_path, url
from harnessrl.dashboard.logs import LogFile
from harnessrl.dashboard.token_view import MAX_TOKENS_PER_PAGE, Decoder, TokenViews, samples_html
from harnessrl.dashboard.tool_requests import timeline_html
from harnessrl.dashboard.trace_calls import TraceCalls
from harnessrl.schemas import Rollout, ToolRequest

#: The audit entries a page shows of one rollout (the rest are counted), and the characters of each
#: entry's command it shows, around the match. The policy decides how many commands it runs and how
#: long they are, and the audit stores each flagged command whole (2,000 flagged commands of 20 KB
#: made a 40 MB trace page).
MAX_AUDIT_ENTRIES = 200
MAX_AUDIT_COMMAND_CHARS = 2_000


def highlight(command: str, match: str) -> str:
    """``command`` escaped, with every occurrence of ``match`` in a ``<mark>``."""
    if not match or match not in command:
        return esc(command)
    return f'<mark class="hit">{esc(match)}</mark>'.join(esc(part) for part in command.split(match))


def command_html(command: str, match: str, limit: int = MAX_AUDIT_COMMAND_CHARS) -> str:
    """``highlight`` of at most ``limit`` characters of ``command``: a longer one is shown from around
    the first occurrence of ``match``, with how many characters were left out before and after."""
    if len(command) <= limit:
        return highlight(command, match)
    at = command.find(match) if match else -1
    start = 0 if at < 0 else max(0, min(at - (limit - len(match)) // 2, len(command) - limit))
    end = start + limit
    before = f"… ({start:,} characters not shown) " if start else ""
    after = f" … ({len(command) - end:,} more characters not shown)" if end < len(command) else ""
    return esc(before) + highlight(command[start:end], match) + esc(after)


def audit_html(rollout: Rollout) -> str:
    entries = rollout.metadata.get("audit") or []
    if not rollout.flags and not entries:
        return '<p class="muted">No audit flags.</p>'
    parts = ["<p>" + " ".join(badge(flag, "flag") for flag in rollout.flags) + "</p>"]
    if not isinstance(entries, list):  # not what the controller writes: shown as it is (it was a 500)
        return "".join(parts) + pretty_json(entries, limit=MAX_JSON_CHARS)
    for entry in entries[:MAX_AUDIT_ENTRIES]:
        if not isinstance(entry, dict):
            continue
        command = command_html(str(entry.get("command", "")), str(entry.get("match", "")))
        parts.append(
            f'<div class="card flag">{badge(entry.get("rule"), "flag")} call {esc(entry.get("call_seq"))}'
            f"<pre>{command}</pre></div>"
        )
    if len(entries) > MAX_AUDIT_ENTRIES:
        parts.append(
            f'<p class="muted audit-more">… {len(entries) - MAX_AUDIT_ENTRIES:,} more audit entries not '
            f"shown (a page shows the first {MAX_AUDIT_ENTRIES:,}).</p>"
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
    # Cut as the conversation's JSON is: a scorer's JSON verdict (up to 1 MiB, 32 deep) may carry what
    # the policy wrote, and indented it grew 30-fold.
    evaluation = pretty_json(meta.get("evaluation", {}), limit=MAX_JSON_CHARS)
    return f'<table class="kv">{table}</table><h3>evaluator output</h3>{evaluation}'


def unreadable_html(rollout: Rollout, unreadable: Mapping[int, str]) -> str:
    """A card naming each attempt whose recorded calls cannot be read, and each column of the
    rollout's own row that could not (``DAMAGED_ROW_KEY``), with what decoding them raised."""
    columns = rollout.metadata.get(DAMAGED_ROW_KEY)
    columns = columns if isinstance(columns, dict) else {}
    if not unreadable and not columns:
        return ""
    lines = [
        f"<li>the rollout's {esc(column)} (shown empty): <code>{esc(error)}</code></li>"
        for column, error in columns.items()
    ]
    lines += [
        f"<li>the calls of attempt {esc(attempt)} (not shown): <code>{esc(error)}</code></li>"
        for attempt, error in sorted(unreadable.items(), key=lambda item: (type(item[0]).__name__, item[0]))
    ]
    return (
        '<div class="card flag"><b>Damaged record.</b> The store holds rows of this rollout that '
        f"cannot be read:<ul>{''.join(lines)}</ul></div>"
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
            f'<a class="log-link" href="{esc(trace_path(prefix, rollout.rollout_id))}/logs/{attempt}/'
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
    calls: TraceCalls,
    decode: Decoder,
    prefix: str,
    *,
    logs: Sequence[LogFile] = (),
    tool_requests: Sequence[ToolRequest] = (),
    tool_requests_total: int | None = None,
    sample: int | None = None,
    max_sample_tokens: int | None = None,
) -> str:
    """The trace page of ``rollout``; ``sample``: show that sample's token view alone.
    ``tool_requests``: the first of the rollout's tool requests, ``tool_requests_total`` of them.
    ``max_sample_tokens``: the run's ``trainer.max_sample_tokens`` (its samples are built with it)."""
    views = TokenViews(trace_url=_trace_url(prefix, rollout), only=sample)
    calls_tbl, token_views = samples_html(rollout, calls, decode, views, max_sample_tokens=max_sample_tokens)
    return (
        f"<h1>Rollout {esc(rollout.rollout_id)} {result_badge(rollout.reward, rollout.outcome)}</h1>"
        f"{unreadable_html(rollout, calls.unreadable)}{_summary(rollout, prefix, logs)}"
        f"<details><summary>task</summary>{pretty_json(rollout.task)}</details>"
        f'<h2>Evaluation</h2><div class="card">{evaluation_html(rollout)}</div>'
        f'<h2>Audit</h2><div class="card">{audit_html(rollout)}</div>'
        f'<h2>Conversation</h2><div class="conversation">{_conversation(calls)}</div>'
        f"<h2>Calls</h2>{calls_tbl}"
        + (
            "<h2>Calls and tool requests</h2>"
            + timeline_html(
                calls.rows, tool_requests, total_requests=tool_requests_total, total_calls=calls.total
            )
            if tool_requests
            else ""
        )
        + f'<h2 id="tokens">Tokens</h2>{token_views}'
    )


def _trace_url(prefix: str, rollout: Rollout) -> str:
    return trace_path(prefix, rollout.rollout_id)


def _conversation(calls: TraceCalls) -> str:
    return conversation_html([calls.last] if calls.last is not None else [])


@dataclass(frozen=True, slots=True)
class CompareSide:
    """One rollout of a compare: the rollout, or what is wrong with its row when the store's row
    cannot be made one (``DamagedRollout``: the side names it and shows the calls' conversation);
    and what the page keeps of its calls."""

    rollout_id: str
    rollout: Rollout | str
    calls: TraceCalls


def _damaged_side(side: CompareSide, prefix: str) -> str:
    return (
        f'<div class="side"><h2><a href="{esc(trace_path(prefix, side.rollout_id))}">{esc(side.rollout_id)}</a>'
        '</h2><div class="card flag damaged-row"><b>Damaged record.</b> The store\'s row of this rollout '
        f"cannot be read, so its evaluation and tokens are not shown:<pre>{esc(side.rollout)}</pre></div>"
        f"<h3>Conversation</h3>{_conversation(side.calls)}</div>"
    )


def compare_body(
    sides: Sequence[CompareSide], decode: Decoder, prefix: str, caps: dict[str, int] | None = None
) -> str:
    """Two rollouts side by side; ``caps``: each run's ``trainer.max_sample_tokens`` by run id. A
    side whose rollout row cannot be read is named, beside the other shown whole."""
    a, b = (side.rollout for side in sides[:2])
    same_group = (
        isinstance(a, Rollout)
        and isinstance(b, Rollout)
        and a.group_id is not None
        and a.group_id == b.group_id
    )
    warn = "" if same_group else '<p class="badge b-flag">these rollouts are not in the same group</p>'
    cols = []
    for side in sides:
        rollout, calls = side.rollout, side.calls
        if not isinstance(rollout, Rollout):
            cols.append(_damaged_side(side, prefix))
            continue
        # Each side gets half the page's token budget, so a compare page is no larger than a trace.
        views = TokenViews(trace_url=_trace_url(prefix, rollout), budget=MAX_TOKENS_PER_PAGE // 2)
        cap = (caps or {}).get(rollout.run_id) if rollout.run_id is not None else None
        _, tokens = samples_html(rollout, calls, decode, views, max_sample_tokens=cap)
        cols.append(
            f'<div class="side"><h2><a href="{esc(_trace_url(prefix, rollout))}">'
            f"{esc(rollout.rollout_id)}</a> {result_badge(rollout.reward, rollout.outcome)} reward {esc(fmt_num(rollout.reward, 4))}</h2>"
            f"{unreadable_html(rollout, calls.unreadable)}{_summary(rollout, prefix)}<h3>Evaluation</h3>{evaluation_html(rollout)}"
            f"<h3>Audit</h3>{audit_html(rollout)}<h3>Conversation</h3>{_conversation(calls)}"
            f"<h3>Tokens</h3>{tokens}</div>"
        )
    return f'<h1>Compare</h1>{warn}<div class="compare">{"".join(cols)}</div>'
