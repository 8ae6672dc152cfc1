"""The rollouts table pages 100k rollouts right: pages come from SQL LIMIT/OFFSET, counts from SQL.

What a page costs at that size, against 1k, is measured by ``benchmarks/dashboard_scale.py``, not here.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY

from harnessrl.dashboard import create_dashboard_app
from harnessrl.store.sqlite import SQLiteStore

N = 100_000


def test_rollouts_page_renders_fast_with_100k_rollouts(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "harnessrl.db").create_run("big", {})
    now = time.time()
    rows = [
        (
            f"r{i:06d}", f"key{i}", "big", f"t{i % 500}", json.dumps({"prompt": "p"}), f"g{i // 8:05d}", i // 800,
            "finished", "success" if i % 3 else "policy_failure", (i % 7) / 7, 0,
            '["test_tampering"]' if i % 1000 == 0 else "[]", "{}", now, now, now + 2.5,
        )
        for i in range(N)
    ]  # fmt: skip
    with sqlite3.connect(tmp_path / "harnessrl.db") as conn:
        conn.executemany(
            "INSERT INTO rollouts (rollout_id, api_key, run_id, task_id, task, group_id, step, status, outcome,"
            " reward, attempt, flags, metadata, created_at, started_at, finished_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    client = TestClient(create_dashboard_app(tmp_path, ADMIN_KEY))
    client.get(f"/ui/?key={ADMIN_KEY}")
    for query in (
        {},
        {"page": "1500"},
        {"outcome": "policy_failure", "page": "40"},
        {"flagged": "1"},
        {"flag": "test_tampering", "order": "duration_desc"},
        {"order": "reward_asc", "page": "2"},
        {"step": "77"},
    ):
        response = client.get("/ui/rollouts", params=query)
        assert response.status_code == 200, query
        # One page: the table's 50 rows (the flag filter matches 100), never the whole run.
        assert response.text.count('href="/ui/rollouts/r') == 50, query
    assert "page 1500 of 2000 · 100000 rollouts" in client.get("/ui/rollouts", params={"page": "1500"}).text
    assert "100 rollouts" in client.get("/ui/rollouts", params={"flagged": "1"}).text
