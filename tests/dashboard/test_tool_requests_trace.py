"""The trace shows a rollout's searches beside its calls: read from the store file the dashboard opens
read-only, in time order with the calls, query and passages escaped (a harness chose the query and the
corpus chose the text)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY

from harnessrl.dashboard import create_dashboard_app
from harnessrl.dashboard.data import MAX_TOOL_JSON_CHARS, MAX_TOOL_REQUESTS, DashboardData
from harnessrl.dashboard.tool_requests import MAX_PASSAGES_SHOWN, MAX_TIMELINE_ROWS, timeline_html
from harnessrl.dashboard.trace_calls import CallRow
from harnessrl.schemas import Call, ToolRequest
from harnessrl.store.sqlite import SQLiteStore


def test_searches_appear_between_the_calls_they_came_between(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "harnessrl.db")
    store.create_rollout(task={"prompt": "q"}, rollout_id="r1")
    for at in (10.0, 30.0):
        store.add_call(
            Call(
                rollout_id="r1",
                prompt_token_ids=[1],
                response_token_ids=[2],
                response_logprobs=[-0.1],
                started_at=at,
                finished_at=at + 1,
            )
        )
    passages = [{"id": "p<1>", "title": "Velmora <b>", "text": "founded in 1432", "score": 2.5}]
    store.add_tool_request(
        ToolRequest(
            rollout_id="r1",
            tool="search",
            request={"query": "<script>x</script>"},
            response={"passages": passages},
            started_at=20.0,
            finished_at=20.01,
        )
    )
    store.close()
    data = DashboardData(tmp_path / "harnessrl.db")
    requests = data.list_tool_requests("r1").shown
    assert [r.request["query"] for r in requests] == ["<script>x</script>"]
    calls = [CallRow.of(call) for call in data.list_calls("r1")]
    html = timeline_html(calls, requests)
    assert html.index("call 0") < html.index("&lt;script&gt;x&lt;/script&gt;") < html.index("call 1")
    assert "<script>" not in html and "Velmora &lt;b&gt;" in html and "founded in 1432" in html
    assert "No tool requests" in timeline_html(calls, [])  # control: a rollout without searches


def _searcher(tmp_path: Path, *, calls: int, searches: int, passages: int) -> TestClient:
    """A run folder whose rollout ``r1`` made ``calls`` calls and ``searches`` searches, each search
    returning ``passages`` passages of 600 characters; a signed-in client of it."""
    store = SQLiteStore(tmp_path / "harnessrl.db")
    store.create_rollout(task={"prompt": "q"}, rollout_id="r1")
    store.start_rollout("r1")
    for i in range(calls):
        store.add_call(
            Call(
                rollout_id="r1",
                prompt_token_ids=[1, i],
                response_token_ids=[2],
                response_logprobs=[-0.1],
                started_at=10.0 + 2 * i,
                finished_at=11.0 + 2 * i,
            )
        )
    store.close()
    hits = [
        {"id": f"p{k}", "title": f"passage {k}", "text": "x" * 600, "score": 1.0} for k in range(passages)
    ]
    rows = [
        (
            "r1",
            0,
            "search",
            json.dumps({"query": f"query {i}"}),
            json.dumps({"passages": hits}),
            11.5 + i,
            11.6 + i,
        )
        for i in range(searches)
    ]
    with sqlite3.connect(tmp_path / "harnessrl.db") as conn:  # bulk: one transaction
        conn.executemany(
            "INSERT INTO tool_requests (rollout_id, attempt, tool, request, response, started_at, finished_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    client = TestClient(create_dashboard_app(tmp_path, ADMIN_KEY))
    client.get(f"/ui/?key={ADMIN_KEY}")
    return client


def test_a_rollout_of_3000_searches_gets_a_bounded_trace(tmp_path: Path) -> None:
    """Regression: every search and every passage was on the page (3,000 searches: 41 MB)."""
    client = _searcher(tmp_path, calls=10, searches=3_000, passages=5)
    html = client.get("/ui/rollouts/r1").text
    rows = html.count("<tr class=tool-row>") + html.count("<tr class=call-row>")
    assert rows == MAX_TIMELINE_ROWS
    assert html.count("<tr class=call-row>") == 10  # the calls came first in time
    assert html.count("<li><b>passage") == MAX_PASSAGES_SHOWN  # over the whole timeline
    assert "… 0 more calls and 2010 more tool requests not shown" in html
    assert "5 passages (not shown: the page has shown its 1,000)" in html
    assert len(html) < 3_000_000  # was 41 MB at this size
    loaded = DashboardData(tmp_path / "harnessrl.db").list_tool_requests("r1")
    assert len(loaded.shown) == MAX_TOOL_REQUESTS and loaded.total == 3_000  # SQL LIMIT, and a count


def test_the_timeline_caps_calls_like_the_calls_table(tmp_path: Path) -> None:
    """Regression: the timeline listed every call, without the calls table's 1,000-row cap."""
    client = _searcher(tmp_path, calls=MAX_TIMELINE_ROWS + 200, searches=1, passages=1)
    html = client.get("/ui/rollouts/r1").text
    assert html.count("<tr class=call-row>") == MAX_TIMELINE_ROWS - 1  # the search (at 11.5 s) is second
    assert html.count("<tr class=tool-row>") == 1
    assert "… 201 more calls and 0 more tool requests not shown" in html


def test_a_huge_search_response_is_not_parsed(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "harnessrl.db")
    store.create_rollout(task={"prompt": "q"}, rollout_id="r1")
    huge = [{"id": "p", "title": "t", "text": "y" * MAX_TOOL_JSON_CHARS, "score": 1.0}]
    store.add_tool_request(
        ToolRequest(
            rollout_id="r1", tool="search", request={"query": "big"}, response={"passages": huge},
            started_at=1.0, finished_at=2.0,
        )
    )  # fmt: skip
    store.close()
    [request] = DashboardData(tmp_path / "harnessrl.db").list_tool_requests("r1").shown
    assert request.request == {"query": "big"} and "passages" not in request.response
    html = timeline_html([], [request])
    assert "response not shown" in html and "y" * 1000 not in html
