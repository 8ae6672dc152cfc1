"""The runs page reads a run's ``metrics.jsonl`` incrementally and keeps a bounded amount of it.

It parsed the whole file on every load (a 10,000-step run's 33 MB file: ~100 MB of memory a load,
every 5 s while the run goes on). Now a ``MetricsLog`` kept by the dashboard parses only the lines
appended since the last load, and keeps each metric thinned as the chart draws it. Measured here by
work (lines parsed) and memory (peak allocated during a load against the file's size), not time.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY, make_run_folder

from harnessrl.dashboard import create_dashboard_app
from harnessrl.dashboard.data import DashboardData
from harnessrl.dashboard.metrics_log import MAX_POINTS_DRAWN, MetricsLog
from harnessrl.dashboard.pages import runs_body

STEPS = 3_000
METRICS = 40


def _record(step: int) -> dict[str, float]:
    record = {"step": step, "time": 1_000.0 + 7 * step, "reward/mean": (step % 13) / 13}
    record |= {f"custom/m{j:02d}": (step * (j + 3)) % 101 / 7 for j in range(METRICS)}
    if step == 1_234:
        record["reward/mean"] = 99.0  # a spike the thinning must keep
    return record


def _append(path: Path, steps: range) -> None:
    with path.open("a") as file:
        file.write("".join(json.dumps(_record(s)) + "\n" for s in steps))


def test_a_reload_parses_only_the_appended_lines(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run", "run", [])
    metrics = folder / "metrics.jsonl"
    _append(metrics, range(STEPS))
    log = MetricsLog(metrics)
    data = DashboardData(folder / "harnessrl.db")
    first, _ = runs_body(data, log, "/ui")
    assert log.lines_parsed == STEPS
    assert runs_body(data, log, "/ui")[0] == first  # nothing new: nothing parsed, the same page
    assert log.lines_parsed == STEPS
    _append(metrics, range(STEPS, STEPS + 2))
    page, _ = runs_body(data, log, "/ui")
    assert log.lines_parsed == STEPS + 2
    assert f"step {STEPS + 1}" in page and "train step 1234: 99</title>" in page
    metrics.write_text(json.dumps(_record(5)) + "\n")  # replaced (a new run in the folder): read again
    page, _ = runs_body(data, log, "/ui")
    assert log.lines_parsed == STEPS + 3 and "step 5" in page and "step 1234" not in page


def test_a_torn_last_line_is_read_once_it_is_whole(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    line = json.dumps(_record(1))
    metrics.write_text(json.dumps(_record(0)) + "\n" + line[:20])
    log = MetricsLog(metrics).refresh()
    assert log.last["step"] == 0 and log.points("reward/mean") == [(0.0, 0.0)]
    with metrics.open("a") as file:
        file.write(line[20:] + "\n")
    assert log.refresh().last["step"] == 1 and len(log.points("reward/mean")) == 2


def test_what_a_log_keeps_is_bounded_and_keeps_the_extremes(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    _append(metrics, range(STEPS))
    log = MetricsLog(metrics).refresh()
    kept = log.stored_points()
    _append(metrics, range(STEPS, 4 * STEPS))
    assert log.refresh().stored_points() <= kept * 1.1  # four times the steps, not four times the points
    series = (METRICS + 3) * 5  # every metric, step and time included, raw and four averages
    assert log.stored_points() <= series * 2 * (MAX_POINTS_DRAWN + 1)
    points = log.points("reward/mean")
    assert len(points) <= 2 * MAX_POINTS_DRAWN and (1234.0, 99.0) in points and (0.0, 0.0) in points
    assert points == sorted(points)


def _peak_of_a_reload(client: TestClient, metrics: Path) -> int:
    """Bytes allocated at most while the page loads after the run logged one more step."""
    steps = sum(1 for _ in metrics.open())
    tracemalloc.start()
    try:
        _append(metrics, range(steps, steps + 1))
        page = client.get("/ui/")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert page.status_code == 200 and f"step {steps}" in page.text
    return peak


def test_a_runs_page_load_takes_no_more_memory_as_the_run_goes_on(tmp_path: Path) -> None:
    """A load parsed the whole file into dicts (about three times its size at once); now a load's
    memory is the page's, whatever the length of the run."""
    folder = make_run_folder(tmp_path / "run", "run", [], status="running")
    metrics = folder / "metrics.jsonl"
    _append(metrics, range(STEPS))
    with TestClient(create_dashboard_app(folder, ADMIN_KEY)) as client:
        client.get(f"/ui/?key={ADMIN_KEY}")  # logs in (a cookie)
        short = _peak_of_a_reload(client, metrics)
        _append(metrics, range(STEPS + 1, 4 * STEPS))
        client.get("/ui/")  # the run went on, the page refreshed
        long = _peak_of_a_reload(client, metrics)
    assert long < 1.3 * short, (
        f"a load took {short / 1e6:.1f} MB, four times the steps later {long / 1e6:.1f} MB"
    )
