"""The dashboard's chart helpers: round ticks, TensorBoard-style smoothing, the wall-clock axis."""

from __future__ import annotations

import pytest

from harnessrl.dashboard.charts import nice_ticks, series, smoothed


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
