"""A rollout's model calls and its tool requests (the retriever's searches) on one timeline: what the
harness asked the search tool, the passages it got, and the model call each one fed, in the order
they happened (docs/retrieval.md, docs/dashboard.md).

A harness decides how many searches it makes and a corpus how long its passages are, so the
timeline is bounded whatever they did: at most ``MAX_TIMELINE_ROWS`` rows (calls and tool requests
together, the earliest; ``DashboardData.list_tool_requests`` reads at most ``MAX_TOOL_REQUESTS``
requests), at most ``MAX_PASSAGES_SHOWN`` passages over the whole timeline, and each query, title
and passage text cut at a fixed length. What is left out is counted on the page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harnessrl.dashboard.html import esc
from harnessrl.dashboard.trace_calls import MAX_CALL_ROWS, CallRow
from harnessrl.schemas import ToolRequest

MAX_TIMELINE_ROWS = MAX_CALL_ROWS  # calls and tool requests; the rest are counted
MAX_PASSAGES_SHOWN = 1_000  # over the whole timeline; a request past it shows its count only
MAX_QUERY_CHARS = 1_000
MAX_TITLE_CHARS = 200
MAX_PASSAGE_CHARS = 1_000


def _cut(value: Any, limit: int) -> str:
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit:,} more characters)"


class _PassageBudget:
    """How many passages the timeline may still show."""

    def __init__(self, left: int) -> None:
        self.left = left

    def take(self, wanted: int) -> int:
        taken = min(wanted, self.left)
        self.left -= taken
        return taken


def _passages_html(request: ToolRequest, budget: _PassageBudget) -> str:
    if request.response.get("not_shown"):
        return f'<span class="muted">response not shown: {esc(request.response["not_shown"])}</span>'
    passages = request.response.get("passages")
    passages = [p for p in passages if isinstance(p, dict)] if isinstance(passages, list) else []
    if not passages:
        return '<span class="muted">no passages</span>'
    shown = passages[: budget.take(len(passages))]
    if not shown:
        return f'<span class="muted">{len(passages)} passages (not shown: the page has shown its {MAX_PASSAGES_SHOWN:,})</span>'
    titles = ", ".join(esc(_cut(p.get("title", ""), MAX_TITLE_CHARS)) for p in shown)
    items = "".join(
        f"<li><b>{esc(_cut(p.get('title', ''), MAX_TITLE_CHARS))}</b> <span class=muted>"
        f"({esc(_cut(p.get('id', ''), MAX_TITLE_CHARS))}, score {esc(_cut(p.get('score', ''), 40))})</span>"
        f"<br>{esc(_cut(p.get('text', ''), MAX_PASSAGE_CHARS))}</li>"
        for p in shown
    )
    more = (
        f'<li class="muted">… {len(passages) - len(shown)} more passages not shown '
        f"(the page shows {MAX_PASSAGES_SHOWN:,})</li>"
        if len(shown) < len(passages)
        else ""
    )
    return f"<details><summary>{len(passages)}: {titles}</summary><ol class=passages>{items}{more}</ol></details>"


def timeline_html(
    calls: Sequence[CallRow],
    requests: Sequence[ToolRequest],
    *,
    total_requests: int | None = None,
    total_calls: int | None = None,
) -> str:
    """Calls and tool requests ordered by when they started (a call by its generation start), the
    first ``MAX_TIMELINE_ROWS`` of them. ``total_requests``, ``total_calls``: how many the rollout
    made, when ``requests`` or ``calls`` are only the first of them (the rest are counted as left out)."""
    if not requests:
        return '<p class="muted">No tool requests.</p>'
    # (started at, calls before requests at the same time, the call or request)
    events: list[tuple[float, int, CallRow | ToolRequest]] = [
        (math.inf if call.started_at is None else call.started_at, 0, call) for call in calls
    ]
    events += [(request.started_at, 1, request) for request in requests]
    events.sort(key=lambda e: (e[0], e[1]))
    shown, left_out = events[:MAX_TIMELINE_ROWS], events[MAX_TIMELINE_ROWS:]
    budget = _PassageBudget(MAX_PASSAGES_SHOWN)
    rows = "".join(
        _call_row(event) if isinstance(event, CallRow) else _request_row(event, budget)
        for _, _, event in shown
    )
    head = "<tr><th>attempt</th><th>what</th><th>detail</th><th>passages returned</th></tr>"
    calls_cut = sum(1 for _, kind, _ in left_out if kind == 0)
    requests_left = len(left_out) - calls_cut + max(0, (total_requests or 0) - len(requests))
    calls_left = calls_cut + max(0, (total_calls or 0) - len(calls))
    more = (
        f'<p class="muted timeline-more">… {calls_left} more calls and {requests_left} more tool requests '
        f"not shown (the timeline shows the first {MAX_TIMELINE_ROWS:,} rows).</p>"
        if calls_left or requests_left
        else ""
    )
    return f"<table class=calls>{head}{rows}</table>{more}"


def _call_row(call: CallRow) -> str:
    return (
        f"<tr class=call-row><td class=num>{esc(call.attempt)}</td><td>call {esc(call.seq)}</td>"
        f"<td>{esc(call.api)}, {call.sampled_tokens} sampled tokens</td><td></td></tr>"
    )


def _request_row(request: ToolRequest, budget: _PassageBudget) -> str:
    query = _cut(request.request.get("query", ""), MAX_QUERY_CHARS)
    took = f"{request.finished_at - request.started_at:.3f}s"
    return (
        f"<tr class=tool-row><td class=num>{request.attempt}</td><td>{esc(request.tool)}</td>"
        f"<td><code>{esc(query)}</code> <span class=muted>{took}</span></td>"
        f"<td>{_passages_html(request, budget)}</td></tr>"
    )
