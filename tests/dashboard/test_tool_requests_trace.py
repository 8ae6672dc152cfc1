"""The trace shows a rollout's searches beside its calls: read from the store file the dashboard opens
read-only, in time order with the calls, query and passages escaped (a harness chose the query and the
corpus chose the text)."""

from __future__ import annotations

from pathlib import Path

from harnessrl.dashboard.data import DashboardData
from harnessrl.dashboard.tool_requests import timeline_html
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
    requests = data.list_tool_requests("r1")
    assert [r.request["query"] for r in requests] == ["<script>x</script>"]
    html = timeline_html(data.list_calls("r1"), requests)
    assert html.index("call 0") < html.index("&lt;script&gt;x&lt;/script&gt;") < html.index("call 1")
    assert "<script>" not in html and "Velmora &lt;b&gt;" in html and "founded in 1432" in html
    assert "No tool requests" in timeline_html(
        data.list_calls("r1"), []
    )  # control: a rollout without searches
