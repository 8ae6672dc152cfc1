"""The dashboard's chart helpers: round ticks, TensorBoard-style smoothing, the wall-clock axis."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.dashboard.conftest import ADMIN_KEY, REPO, make_run_folder

from harnessrl.dashboard.charts import (
    MAX_TICKS,
    line_chart,
    nice_ticks,
    overlay_charts,
    run_charts,
    series,
    smoothed,
)
from harnessrl.dashboard.html import fmt_num


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


ULP = (0.3, 0.30000000000000004)  # one ulp apart: the old tick loop's step never moved its value


@pytest.mark.timeout(10)  # the old loop never ended: fail rather than hang
def test_ticks_of_a_range_of_one_ulp_or_of_every_float_are_bounded() -> None:
    assert nice_ticks(*ULP) == [0.3]  # drawn flat
    assert nice_ticks(-1e308, 1e308) == [-1e308, -5e307, 0.0, 5e307, 1e308]  # hi - lo is inf
    assert nice_ticks(-1.7e308, 1.7e308, 1) == [-1.7e308, 1.7e308]  # its round step is past the floats
    assert nice_ticks(0.0, float("nan")) == [0.0] and nice_ticks(float("-inf"), 1.0) == [float("-inf")]


@pytest.mark.timeout(60)
@given(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(1, 10),
)
def test_ticks_are_few_finite_and_ordered_for_any_range(a: float, b: float, count: int) -> None:
    ticks = nice_ticks(min(a, b), max(a, b), count)
    assert 1 <= len(ticks) <= MAX_TICKS and ticks == sorted(ticks)
    assert all(abs(t) <= sys.float_info.max for t in ticks)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "ys", [ULP, (-1e308, 1e308), (1.7e308, 1.7e308), (5e-324, 5e-324), (-1.7e308, 1.7e308)]
)
def test_a_chart_of_a_flat_or_overflowing_range_is_drawn(ys: tuple[float, float]) -> None:
    for points in ([(1.0, ys[0]), (2.0, ys[1])], [(1e300, ys[0]), (1e300, ys[1])]):
        svg = line_chart("m", [("m", points)])
        assert svg.count("<circle") == 2 and not re.search(r"nan|inf", svg)


def test_numbers_no_float_holds_show_empty() -> None:
    assert fmt_num(10**400) == "" and fmt_num("<b>") == "" and fmt_num([1]) == ""  # type: ignore[arg-type]
    assert fmt_num(0.5) == "0.5" and fmt_num(1234) == "1,234"  # control


def _limit_memory() -> None:
    """In the served child: a page that grows without end dies there, not on this machine."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_runs_page_of_extreme_metrics_answers_promptly(tmp_path: Path) -> None:
    """Served by ``harnessrl dashboard`` in a child process with a memory limit, read with a client
    timeout: a page that never finishes fails this test and is killed with the child."""
    rows = [
        {"step": 1, "time": 0.0, "reward/mean": ULP[0], "custom/huge": -1e308, "custom/odd": "x"},
        {"step": 2, "time": 1e308, "reward/mean": ULP[1], "custom/huge": 1e308, "custom/odd": [1]},
        {"step": float("inf"), "time": -1e308, "reward/mean": 0.5, "custom/bigint": 10**400},
    ]
    folder = make_run_folder(tmp_path / "run", "run", rows)  # type: ignore[arg-type]
    with (folder / "metrics.jsonl").open("a") as out:
        out.write(json.dumps({"step": 3, "custom/digits": 0}).replace("0}", "1" * 5000 + "}") + "\n")
    env = {**os.environ, "HARNESSRL_ADMIN_KEY": ADMIN_KEY}
    cmd = [sys.executable, "-m", "harnessrl", "dashboard", "--run-dir", str(folder), "--port", "0"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, preexec_fn=_limit_memory
    )
    try:
        url = re.search(r"(http://\S+)/ui/", proc.stderr.readline()).group(1)  # type: ignore[union-attr]
        page = httpx.get(f"{url}/ui/", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=20)
        assert page.status_code == 200 and 'aria-label="Reward"' in page.text
        assert 'aria-label="custom/huge"' in page.text and not re.search(r'="[^"]*(nan|inf)', page.text)
    finally:
        proc.kill()
        proc.wait(timeout=30)
