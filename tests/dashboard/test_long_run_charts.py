"""A long run's charts draw a bounded number of points: every point of every metric was a circle
with its own hover text, so a run of 10,000 steps and the trainer's ~70 metrics made an 87 MB runs
page, fetched again every 5 s while the run went on (3.4 MB now). Thinned, a line keeps its lowest
and highest points, so a spike still shows."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY, make_run_folder

from harnessrl.dashboard import create_dashboard_app

STEPS = 5_000
SPIKE_STEP = 2_345


def _reward(step: int) -> float:
    return 100.0 if step == SPIKE_STEP else -50.0 if step == 17 else (step % 7) / 7


def test_a_long_runs_page_draws_at_most_so_many_points_a_line_and_keeps_its_extremes(tmp_path: Path) -> None:
    metrics = [
        {"step": s, "time": 1000.0 + s, "reward/mean": _reward(s), "custom/x": float(s)} for s in range(STEPS)
    ]
    folder = make_run_folder(tmp_path / "run", "run", metrics)  # type: ignore[arg-type]
    with TestClient(create_dashboard_app(folder, ADMIN_KEY)) as client:
        page = client.get(f"/ui/?key={ADMIN_KEY}").text
    circles = page.count("<circle ")
    assert 0 < circles <= 1_000  # two lines (reward, custom/x) of 5,000 points, each thinned to 400
    assert f"train step {SPIKE_STEP}: 100</title>" in page and "train step 17: -50</title>" in page
    assert len(page) < 1_000_000


def test_thinning_keeps_the_lowest_and_highest_of_every_run_in_order() -> None:
    from harnessrl.dashboard.charts import thinned

    points = [(float(x), float((x * 37) % 101)) for x in range(10_000)]
    kept = thinned(points, 100)
    assert len(kept) <= 100 and kept == sorted(kept)
    assert max(points, key=lambda p: p[1])[1] == max(p[1] for p in kept)
    assert min(points, key=lambda p: p[1])[1] == min(p[1] for p in kept)
    assert thinned(points[:100], 100) == points[:100]  # few enough: all of them
