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

#: (title, [(metric key, legend label), ...]) for each chart on the runs page.
RUN_CHARTS: list[tuple[str, list[tuple[str, str]]]] = [
    ("Reward", [("reward/mean", "train"), ("heldout/reward", "held-out")]),
    ("Samples per rollout", [("trajectory/samples_per_rollout", "samples/rollout")]),
    ("Staleness (policy versions)", [("staleness/mean", "mean"), ("staleness/max", "max")]),
    ("Throughput (tokens/s)", [("throughput/tokens_per_s", "tokens/s")]),
    ("Step time (s)", [("time/step_s", "step"), ("time/train_s", "train")]),
    ("Pause time (s)", [("time/pause_s", "pause")]),
]
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


def series(records: list[dict[str, float]], key: str) -> Series:
    """``(step, value)`` points of one metric, finite numbers only."""
    points = []
    for record in records:
        step, value = record.get("step"), record.get(key)
        if isinstance(step, int | float) and isinstance(value, int | float) and math.isfinite(value):
            points.append((float(step), float(value)))
    return points


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def line_chart(title: str, lines: list[tuple[str, Series]], *, width: int = 380, height: int = 200) -> str:
    """An SVG line chart of ``(label, points)`` lines over steps; says so when there is no data."""
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

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    parts = [head]
    for frac in (0.0, 0.5, 1.0):  # y grid with labels
        y = y0 + frac * (y1 - y0)
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="grid"/>')
        parts.append(
            f'<text x="{left - 4}" y="{sy(y) + 4:.1f}" text-anchor="end" class="axis">{_fmt(y)}</text>'
        )
    for x in sorted({x0, x1}):
        parts.append(
            f'<text x="{sx(x):.1f}" y="{height - 12}" text-anchor="middle" class="axis">{_fmt(x)}</text>'
        )
    parts.append(f'<text x="{left + pw / 2}" y="{height - 1}" text-anchor="middle" class="axis">step</text>')
    for i, (label, pts) in enumerate(lines):
        color = _COLORS[i % len(_COLORS)]
        if pts:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(pts))
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
            for x, y in pts:
                parts.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}">'
                    f"<title>{escape(label)} step {_fmt(x)}: {_fmt(y)}</title></circle>"
                )
        parts.append(
            f'<text x="{left + pw - 4}" y="{top + 12 + 14 * i}" text-anchor="end" fill="{color}" '
            f'class="legend">{escape(label)}{"" if pts else " (none)"}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def run_charts(records: list[dict[str, float]]) -> list[str]:
    """The runs page's charts for one run's metric records."""
    return [
        line_chart(title, [(label, series(records, key)) for key, label in keys])
        for title, keys in RUN_CHARTS
    ]
