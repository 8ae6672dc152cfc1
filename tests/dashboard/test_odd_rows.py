"""Rows a disk or a bad writer left odd, each of which failed a whole page with a 500: a real run
folder's SQLite store, changed with ``sqlite3``, served by the real dashboard."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY, _call

from harnessrl.dashboard import create_dashboard_app
from harnessrl.schemas import Outcome
from harnessrl.store.sqlite import SQLiteStore


def _three_rollouts(run: Path) -> Path:
    store = SQLiteStore(run / "harnessrl.db")
    store.create_run("run", {"run": {"name": "run"}})
    for rollout_id in ("odd", "fine", "other"):
        store.create_rollout(rollout_id=rollout_id, run_id="run", task={"prompt": f"{rollout_id}-prompt"})
        store.start_rollout(rollout_id)
        store.add_call(_call(rollout_id, [1, 2], [3], 0))
        store.finish_rollout(rollout_id, Outcome.SUCCESS, 1.0)
    store.close()
    return run / "harnessrl.db"


@pytest.mark.parametrize("created_at", [1e300, -1e300, 1e20])
def test_a_creation_time_no_calendar_holds_never_fails_the_rollouts_table(
    tmp_path: Path, created_at: float
) -> None:
    """``time.gmtime`` raised OverflowError for it: every page of the table holding the row was a 500."""
    with sqlite3.connect(_three_rollouts(tmp_path)) as conn:
        conn.execute("UPDATE rollouts SET created_at = ? WHERE rollout_id = 'odd'", (created_at,))
    with TestClient(create_dashboard_app(tmp_path, ADMIN_KEY), raise_server_exceptions=False) as client:
        client.get(f"/ui/?key={ADMIN_KEY}")
        for query in ("", "?order=oldest", "?order=duration_desc"):
            page = client.get(f"/ui/rollouts{query}")
            assert page.status_code == 200, (query, page.text[:300])
            assert all(f"/ui/rollouts/{rid}" in page.text for rid in ("odd", "fine", "other"))
        assert client.get("/ui/rollouts/odd").status_code == 200


@pytest.mark.parametrize("column", ["started_at", "finished_at"])
def test_a_call_time_that_is_no_number_never_fails_the_trace(tmp_path: Path, column: str) -> None:
    """Decoding copies a call's times as the row holds them: text there was a TypeError where the
    calls table worked out the call's duration, a 500 for the trace and the compare."""
    db = _three_rollouts(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE calls SET finished_at = 2.5 WHERE rollout_id = 'odd'")
        conn.execute(f"UPDATE calls SET {column} = 'soon' WHERE rollout_id = 'odd'")
    with TestClient(create_dashboard_app(tmp_path, ADMIN_KEY), raise_server_exceptions=False) as client:
        client.get(f"/ui/?key={ADMIN_KEY}")
        trace = client.get("/ui/rollouts/odd")
        assert trace.status_code == 200 and "odd-prompt" in trace.text
        assert "<td>chat.completions</td>" in trace.text  # the call is still listed
        assert client.get("/ui/compare", params={"a": "odd", "b": "fine"}).status_code == 200


@pytest.mark.parametrize(
    ("column", "value"), [("started_at", "soon"), ("finished_at", "later"), ("attempt", "x")]
)
def test_a_tool_request_row_that_is_none_is_left_out_not_a_500(
    tmp_path: Path, column: str, value: str
) -> None:
    """Each tool request row was validated as a ``ToolRequest``: one damaged row failed the trace."""
    db = _three_rollouts(tmp_path)
    rows = [
        ("odd", 0, "search", json.dumps({"query": query}), json.dumps({"passages": []}), 1.0 + i, 1.5 + i)
        for i, query in enumerate(("broken-query", "fine-query"))
    ]
    with sqlite3.connect(
        db
    ) as conn:  # the store takes none after the rollout ended: written as a gateway did
        conn.executemany(
            "INSERT INTO tool_requests (rollout_id, attempt, tool, request, response, started_at, finished_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute(f"UPDATE tool_requests SET {column} = ? WHERE request LIKE '%broken-query%'", (value,))
    with TestClient(create_dashboard_app(tmp_path, ADMIN_KEY), raise_server_exceptions=False) as client:
        client.get(f"/ui/?key={ADMIN_KEY}")
        trace = client.get("/ui/rollouts/odd")
        assert trace.status_code == 200, trace.text[:300]
        assert "fine-query" in trace.text and "broken-query" not in trace.text
        assert "1 more tool requests not shown" in trace.text  # counted, as left out
