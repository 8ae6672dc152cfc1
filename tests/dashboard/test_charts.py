"""The dashboard's chart helpers: round ticks, TensorBoard-style smoothing, the wall-clock axis."""

from __future__ import annotations

import pytest

from harnessrl.dashboard.charts import line_chart, nice_ticks, overlay_charts, run_charts, series, smoothed


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (0.0, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0.5938, 109.9, [25.0, 50.0, 75.0, 100.0]),  # the odd ticks of the issue (0.5938, 109.9)
        (3.0, 4.0, [3.0, 3.2, 3.4, 3.6, 3.8, 4.0]),
    ],
)
def test_ticks_are_round_numbers_inside_the_range(lo: float, hi: float, expected: list[float]) -> None:
    assert nice_ticks(lo, hi) == expected


def test_step_ticks_are_whole_numbers() -> None:
    assert nice_ticks(1.0, 12.0) == [2.5, 5.0, 7.5, 10.0]
    assert nice_ticks(1.0, 12.0, integer=True) == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    assert nice_ticks(1.0, 3.0, integer=True) == [1.0, 2.0, 3.0]
    assert 'class="axis">7.5</text>' not in line_chart("r", [("r", [(float(s), 0.5) for s in range(1, 13)])])


def test_smoothing_is_debiased_and_zero_weight_is_the_identity() -> None:
    flat = [(float(i), 0.5) for i in range(5)]
    assert [v for _, v in smoothed(flat, 0.9)] == pytest.approx([0.5] * 5)  # no pull toward 0 at the start
    steps = [(0.0, 0.0), (1.0, 1.0), (2.0, 1.0)]
    assert smoothed(steps, 0.0) == steps
    values = [v for _, v in smoothed(steps, 0.5)]
    assert values[0] == 0.0 and 0.0 < values[1] < values[2] < 1.0


def test_minutes_axis_is_wall_clock_since_the_first_row() -> None:
    rows = [{"step": 1, "time": 100.0, "m": 1.0}, {"step": 2, "time": 220.0, "m": 2.0}, {"step": 3, "m": 3.0}]
    assert series(rows, "m") == [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]
    assert series(rows, "m", x="minutes") == [(0.0, 1.0), (2.0, 2.0)]  # a row without a time is left out


def test_overlay_charts_every_metric_any_run_logged() -> None:
    runs = [("a", [{"step": 1, "custom/a": 1.0}]), ("b", [{"step": 1, "custom/b": 2.0, "reward/mean": 0.5}])]
    html = overlay_charts(runs)
    assert "Other metrics (2)" in html and 'aria-label="custom/a"' in html and 'aria-label="custom/b"' in html
    assert "<title>b · train step 1: 0.5</title>" in html and "<title>a · train" not in html
    assert 'aria-label="Loss"' not in html  # neither run logged it


def test_charts_use_the_documented_names_and_still_draw_former_ones() -> None:
    new = run_charts([{"step": 1, "policy/loss": 0.5, "policy/entropy": 2.0, "heldout/success_rate": 0.5}])
    old = run_charts([{"step": 1, "loss": 0.5, "entropy": 2.0, "heldout/accuracy": 0.5}])
    for html in (new, old):
        assert 'aria-label="Loss"' in html and 'aria-label="Entropy (nats)"' in html
        assert "Other metrics" not in html  # a former name is not "another" metric
    assert "<title>entropy step 1: 2</title>" in new
    assert "<title>sampled-token NLL step 1: 2</title>" in old  # the old "entropy" was the sampled NLL
    assert "<title>held-out step 1: 0.5</title>" in new and "<title>held-out step 1: 0.5</title>" in old
