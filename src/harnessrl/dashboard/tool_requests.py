"""A rollout's model calls and its tool requests (the retriever's searches) on one timeline: what the
harness asked the search tool, the passages it got, and the model call each one fed, in the order
they happened (docs/retrieval.md, docs/dashboard.md)."""

from __future__ import annotations

from collections.abc import Sequence

from harnessrl.dashboard.html import esc
from harnessrl.schemas import Call, ToolRequest


def _passages_html(request: ToolRequest) -> str:
    passages = request.response.get("passages") or []
    if not passages:
        return '<span class="muted">no passages</span>'
    titles = ", ".join(esc(p.get("title", "")) for p in passages)
    items = "".join(
        f"<li><b>{esc(p.get('title', ''))}</b> <span class=muted>({esc(p.get('id', ''))}, score "
        f"{esc(p.get('score', ''))})</span><br>{esc(p.get('text', ''))}</li>"
        for p in passages
    )
    return f"<details><summary>{len(passages)}: {titles}</summary><ol class=passages>{items}</ol></details>"


def timeline_html(calls: Sequence[Call], requests: Sequence[ToolRequest]) -> str:
    """Calls and tool requests ordered by when they started (a call by its generation start)."""
    if not requests:
        return '<p class="muted">No tool requests.</p>'
    events: list[tuple[float, int, str]] = []
    for call in calls:
        events.append(
            (
                call.started_at,
                0,
                f"<tr class=call-row><td class=num>{call.attempt}</td><td>call {call.seq}</td>"
                f"<td>{esc(call.api)}, {len(call.response_token_ids)} sampled tokens</td><td></td></tr>",
            )
        )
    for request in requests:
        query = request.request.get("query", "")
        took = f"{request.finished_at - request.started_at:.3f}s"
        events.append(
            (
                request.started_at,
                1,
                f"<tr class=tool-row><td class=num>{request.attempt}</td><td>{esc(request.tool)}</td>"
                f"<td><code>{esc(query)}</code> <span class=muted>{took}</span></td>"
                f"<td>{_passages_html(request)}</td></tr>",
            )
        )
    rows = "".join(html for _, _, html in sorted(events, key=lambda e: (e[0], e[1])))
    head = "<tr><th>attempt</th><th>what</th><th>detail</th><th>passages returned</th></tr>"
    return f"<table class=calls>{head}{rows}</table>"
