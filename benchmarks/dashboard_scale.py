"""What a page of the dashboard's rollouts table costs with 100k rollouts, side by side with 1k, in one run.

The rollouts table pages with SQL ``LIMIT``/``OFFSET`` and one aggregate over the page's calls
(``dashboard/data.py``), so a page should cost about the same however many rollouts the run has. Two
SQLite stores are filled with the same synthetic rollouts (``--small`` and ``--large`` of them), and
each of the table's views (first page, a deep page, filters, orders) is requested through the real
dashboard app (Starlette's test client, no network), ``--repeats`` times each; the median of each
view at both sizes and their ratio are printed.

    .venv/bin/python benchmarks/dashboard_scale.py                  # 1k vs 100k, ~1 min
    .venv/bin/python benchmarks/dashboard_scale.py --large 20000    # quicker

Writes ``benchmarks/results/dashboard_scale.json``. (This replaced a test that asserted each page took
under a second: a benchmark in a test.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from harnessrl.dashboard import create_dashboard_app
from harnessrl.store.sqlite import SQLiteStore

ADMIN_KEY = "dashboard-scale-admin-key"
#: The table's views: first page, a deep page, filters and orders (the page numbers scale with size).
VIEWS: dict[str, dict[str, str]] = {
    "first_page": {},
    "deep_page": {"page": "{last}"},
    "outcome_filter": {"outcome": "policy_failure", "page": "2"},
    "flagged": {"flagged": "1"},
    "flag_by_duration": {"flag": "test_tampering", "order": "duration_desc"},
    "reward_order": {"order": "reward_asc", "page": "2"},
    "one_step": {"step": "7"},
}


def fill_store(folder: Path, n: int) -> None:
    """A run ``big`` with ``n`` finished rollouts: 500 tasks, groups of 8, 20 steps and 100 flagged
    rollouts whatever ``n`` (so every view fills a whole page at both sizes)."""
    SQLiteStore(folder / "harnessrl.db").create_run("big", {})
    now = time.time()
    per_step, flag_every = n // 20, n // 100
    rows = [
        (
            f"r{i:06d}", f"key{i}", "big", f"t{i % 500}", json.dumps({"prompt": "p"}), f"g{i // 8:05d}", i // per_step,
            "finished", "success" if i % 3 else "policy_failure", (i % 7) / 7, 0,
            '["test_tampering"]' if i % flag_every == 0 else "[]", "{}", now, now, now + 2.5,
        )
        for i in range(n)
    ]  # fmt: skip
    with sqlite3.connect(folder / "harnessrl.db") as conn:
        conn.executemany(
            "INSERT INTO rollouts (rollout_id, api_key, run_id, task_id, task, group_id, step, status, outcome,"
            " reward, attempt, flags, metadata, created_at, started_at, finished_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )


def page_times(folder: Path, n: int, repeats: int) -> dict[str, float]:
    """Median seconds per view of the rollouts table (50 rollouts a page)."""
    client = TestClient(create_dashboard_app(folder, ADMIN_KEY))
    client.get(f"/ui/?key={ADMIN_KEY}")  # the login cookie
    last = str(max(1, n // 50 * 3 // 4))
    medians = {}
    for name, query in VIEWS.items():
        params = {k: v.replace("{last}", last) for k, v in query.items()}
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            response = client.get("/ui/rollouts", params=params)
            seconds.append(time.perf_counter() - started)
            response.raise_for_status()
        medians[name] = statistics.median(seconds)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "dashboard_scale.json"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        times: dict[int, dict[str, float]] = {}
        for n in (args.small, args.large):
            folder = Path(tmp) / str(n)
            folder.mkdir()
            fill_store(folder, n)
            times[n] = page_times(folder, n, args.repeats)
    views: dict[str, Any] = {}
    for name in VIEWS:
        small, large = times[args.small][name], times[args.large][name]
        views[name] = {
            "small_s": round(small, 4),
            "large_s": round(large, 4),
            "ratio": round(large / small, 2),
        }
        print(f"{name:18} {small * 1000:8.1f} ms  {large * 1000:8.1f} ms  x{large / small:.2f}")
    result = {
        "benchmark": "dashboard_scale",
        "rollouts": {"small": args.small, "large": args.large},
        "repeats": args.repeats,
        "views": views,
        "worst_ratio": max(v["ratio"] for v in views.values()),
        "worst_large_s": max(v["large_s"] for v in views.values()),
        "load_average": os.getloadavg(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"worst ratio {result['worst_ratio']}x, worst page at {args.large}: {result['worst_large_s'] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
