"""Run metrics for the dashboard: reading ``metrics.jsonl`` and drawing inline SVG line charts.

Plain SVG strings (no JavaScript, no CDN): each point carries a ``<title>`` so hovering shows the
step and value.
"""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path

Series = list[tuple[float, float]]

Chart = tuple[str, list[tuple[str, str]]]  # (title, [(metric key, legend label), ...])

#: The runs page's charts, in groups. A chart none of whose metrics was logged is left out (a run
#: without held-out tasks has no held-out chart); every other numeric metric gets a chart of its own
#: under "Other metrics", so nothing logged is invisible.
CHART_GROUPS: list[tuple[str, list[Chart]]] = [
    (
        "Reward",
        [
            ("Reward", [("reward/mean", "train"), ("heldout/reward", "held-out")]),
            ("Success rate", [("reward/success_rate", "train"), ("heldout/accuracy", "held-out")]),
            (
                "Reward spread",
                [("reward/std", "std"), ("advantage/zero_variance_share", "zero-variance groups")],
            ),
        ],
    ),
    (
        "Policy health",
        [
            ("Loss", [("loss", "loss")]),
            ("KL", [("kl", "to behaviour"), ("loss/kl_ref", "to reference")]),
            ("Entropy", [("entropy", "entropy")]),
            ("Grad norm", [("grad_norm", "grad norm")]),
            ("Clip fraction", [("loss/clip_fraction", "clipped")]),
            ("Learning rate", [("lr", "lr")]),
            ("Advantage", [("advantage/mean", "mean"), ("advantage/abs_mean", "mean |A|")]),
        ],
    ),
    (
        "Rollouts",
        [
            ("Samples per rollout", [("trajectory/samples_per_rollout", "samples/rollout")]),
            ("Response length (tokens)", [("response/length_mean", "mean"), ("response/length_max", "max")]),
            ("Truncated at max_tokens", [("response/truncated_share", "share")]),
            ("Prompt length (tokens)", [("prompt/length_mean", "mean"), ("prompt/length_max", "max")]),
            ("Staleness (policy versions)", [("staleness/mean", "mean"), ("staleness/max", "max")]),
        ],
    ),
    (
        "Throughput",
        [
            ("Throughput (tokens/s)", [("throughput/tokens_per_s", "tokens/s")]),
            ("Step time (s)", [("time/step_s", "step"), ("time/train_s", "train")]),
            ("Pause time (s)", [("time/pause_s", "pause")]),
            ("Generation time per call (s)", [("time/generation_s_mean", "mean")]),
        ],
    ),
]
#: Not charted under "Other metrics": the axes themselves and counters that only identify a row.
_NOT_CHARTED = frozenset({"step", "time", "policy_version"})
#: Always drawn, even before the first step (a new run shows where its reward will appear).
_ALWAYS = frozenset({"Reward"})
_COLORS = ("#2563eb", "#ea580c", "#16a34a", "#9333ea")


def read_metrics(path: Path) -> list[dict[str, float]]:
    """The lines of a ``metrics.jsonl``; a torn last line (a run still writing) is skipped."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def series(records: list[dict[str, float]], key: str, *, x: str = "step") -> Series:
    """``(x, value)`` points of one metric, finite numbers only. ``x``: ``"step"``, or ``"minutes"``
    (wall clock since the first record, from each record's ``time``)."""
    t0 = next((r["time"] for r in records if isinstance(r.get("time"), int | float)), None)
    points = []
    for record in records:
        value = record.get(key)
        at = record.get("step") if x == "step" else None
        if x == "minutes" and t0 is not None and isinstance(record.get("time"), int | float):
            at = (record["time"] - t0) / 60
        if isinstance(at, int | float) and isinstance(value, int | float) and math.isfinite(value):
            points.append((float(at), float(value)))
    return points


def smoothed(points: Series, weight: float) -> Series:
    """TensorBoard's smoothing: an exponential moving average with a bias correction, so the first
    points are not pulled toward 0. ``weight`` 0 returns the points as they are."""
    if weight <= 0 or not points:
        return points
    out, last, debias = [], 0.0, 0.0
    for xv, yv in sorted(points):
        last = last * weight + (1 - weight) * yv
        debias = debias * weight + (1 - weight)
        out.append((xv, last / debias))
    return out


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten) covering ``[lo, hi]``."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.2g}"
    return f"{value:.4g}"


def line_chart(
    title: str,
    lines: list[tuple[str, Series]],
    *,
    width: int = 380,
    height: int = 200,
    x_label: str = "step",
    smooth: float = 0.0,
) -> str:
    """An SVG line chart of ``(label, points)`` lines; says so when there is no data. With ``smooth``
    each line is drawn faint as logged and solid as its moving average (``smoothed``)."""
    left, right, top, bottom = 48, 10, 26, 30
    pw, ph = width - left - right, height - top - bottom
    points = [p for _, pts in lines for p in pts]
    head = (
        f'<svg class="chart" role="img" aria-label="{escape(title)}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
        f'<text x="{left}" y="16" class="chart-title">{escape(title)}</text>'
    )
    if not points:
        return (
            head
            + f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="muted">no data</text></svg>'
        )
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    y_ticks = nice_ticks(y0, y1)
    y0, y1 = min(y0, y_ticks[0]), max(y1, y_ticks[-1])

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    parts = [head]
    for y in y_ticks:  # y grid with round labels
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="grid"/>')
        parts.append(
            f'<text x="{left - 4}" y="{sy(y) + 4:.1f}" text-anchor="end" class="axis">{_fmt(y)}</text>'
        )
    for x in nice_ticks(x0, x1, 5):
        if x0 <= x <= x1:
            parts.append(
                f'<text x="{sx(x):.1f}" y="{height - 12}" text-anchor="middle" class="axis">{_fmt(x)}</text>'
            )
    parts.append(
        f'<text x="{left + pw / 2}" y="{height - 1}" text-anchor="middle" class="axis">{escape(x_label)}</text>'
    )
    for i, (label, pts) in enumerate(lines):
        color = _COLORS[i % len(_COLORS)]
        if pts:
            raw = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(pts))
            if smooth > 0:
                parts.append(
                    f'<polyline points="{raw}" fill="none" stroke="{color}" stroke-width="1" opacity="0.3"/>'
                )
                line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in smoothed(pts, smooth))
                parts.append(
                    f'<polyline class="smoothed" points="{line}" fill="none" stroke="{color}" stroke-width="2"/>'
                )
            else:
                parts.append(f'<polyline points="{raw}" fill="none" stroke="{color}" stroke-width="2"/>')
            for x, y in pts:
                parts.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{2 if smooth > 0 else 3}" fill="{color}">'
                    f"<title>{escape(label)} {escape(x_label)} {_fmt(x)}: {_fmt(y)}</title></circle>"
                )
        parts.append(
            f'<text x="{left + pw - 4}" y="{top + 12 + 14 * i}" text-anchor="end" fill="{color}" '
            f'class="legend">{escape(label)}{"" if pts else " (none)"}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def run_charts(records: list[dict[str, float]], *, x: str = "step", smooth: float = 0.0) -> str:
    """The runs page's charts for one run's metric records: one section per group of
    ``CHART_GROUPS`` (charts with no data left out, except "Reward"), then "Other metrics": a chart
    for every other numeric metric the run logged."""
    x_label = "minutes" if x == "minutes" else "step"
    used: set[str] = set()
    sections = []
    for group, charts in CHART_GROUPS:
        drawn = []
        for title, keys in charts:
            used.update(key for key, _ in keys)
            lines = [(label, series(records, key, x=x)) for key, label in keys]
            if title in _ALWAYS or any(pts for _, pts in lines):
                drawn.append(line_chart(title, lines, x_label=x_label, smooth=smooth))
        if drawn:
            sections.append(
                f'<h3 class="chart-group">{escape(group)}</h3><div class="charts">{"".join(drawn)}</div>'
            )
    others = sorted(
        {
            key
            for record in records
            for key, value in record.items()
            if key not in used
            and key not in _NOT_CHARTED
            and isinstance(value, int | float)
            and not isinstance(value, bool)
        }
    )
    if others:
        drawn = [
            line_chart(key, [(key, series(records, key, x=x))], x_label=x_label, smooth=smooth)
            for key in others
        ]
        sections.append(
            f'<details class="chart-group"><summary>Other metrics ({len(others)})</summary>'
            f'<div class="charts">{"".join(drawn)}</div></details>'
        )
    return "".join(sections)
