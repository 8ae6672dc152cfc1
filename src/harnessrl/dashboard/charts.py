"""Run metrics for the dashboard: inline SVG line charts of a run's ``metrics.jsonl`` (read by
``metrics_log.MetricsLog``, or given as a list of records).

Plain SVG strings (no JavaScript, no CDN): each point carries a ``<title>`` so hovering shows the
step and value. A line of more than ``MAX_POINTS_DRAWN`` points is thinned to the lowest and the
highest point of each of equal runs of its points (spikes stay): a chart is 380 pixels wide, and a
run of 10,000 steps drew every point of every metric, an 87 MB runs page refreshed every 5 s. ``run_charts`` draws one run's metrics; ``overlay_charts`` draws several runs' on
the same charts, one colour per run (as W&B does), the metrics of a chart told apart by dashes.
"""

from __future__ import annotations

import math
import sys
from html import escape
from typing import Any, NamedTuple

from harnessrl.dashboard.metrics_log import MAX_POINTS_DRAWN, MetricsLog, Series, finite

#: What the charts draw from: a run's ``MetricsLog``, or its records as a list (read whole).
Metrics = MetricsLog | list[dict[str, Any]]


class Line(NamedTuple):
    """One line of a chart. A plain ``(label, points)`` pair is a line coloured by its position."""

    label: str
    points: Series
    color: str | None = None  # None: the palette colour of the line's position
    dashed: bool = False
    smoothed: dict[float, Series] | None = None  # averages computed as the points came (``MetricsLog``)


Chart = tuple[str, list[tuple[str, str]]]  # (title, [(metric key, legend label), ...])

#: The runs page's charts, in groups, by the names of docs/metrics.md. A chart none of whose metrics
#: was logged is left out (a run without held-out tasks has no held-out line); every other numeric
#: metric gets a chart of its own under "Other metrics", so nothing logged is invisible.
CHART_GROUPS: list[tuple[str, list[Chart]]] = [
    (
        "Reward",
        [
            ("Reward", [("reward/mean", "train"), ("heldout/reward", "held-out")]),
            ("Success rate", [("reward/success_rate", "train"), ("heldout/success_rate", "held-out")]),
            (
                "Reward spread",
                [("reward/std", "std"), ("advantage/zero_variance_share", "zero-variance groups")],
            ),
        ],
    ),
    (
        "Policy health",
        [
            ("Loss", [("policy/loss", "loss")]),
            ("KL", [("policy/approx_kl", "to the proximal policy"), ("policy/kl_ref", "to the reference")]),
            ("Entropy (nats)", [("policy/entropy", "entropy"), ("policy/sampled_nll", "sampled-token NLL")]),
            ("Grad norm", [("policy/grad_norm", "grad norm")]),
            (
                "Clip fraction",
                [("policy/clip_fraction", "clipped"), ("policy/dual_clip_fraction", "dual clip")],
            ),
            ("Importance ratio", [("policy/ratio_mean", "mean"), ("policy/ratio_max", "max")]),
            ("Learning rate", [("policy/lr", "lr")]),
            ("Advantage", [("advantage/mean", "mean"), ("advantage/abs_mean", "mean |A|")]),
        ],
    ),
    (
        "Rollouts",
        [
            ("Rollouts per step", [("rollouts/total", "total"), ("rollouts/trained", "trained")]),
            ("Samples per rollout", [("trajectory/samples_per_rollout", "samples/rollout")]),
            ("Calls per rollout", [("calls/per_rollout", "calls")]),
            (
                "Calls dropped, not trained on",
                [
                    ("trajectory/calls_dropped/client_gone", "client gone"),
                    ("trajectory/calls_dropped/slow_reader", "slow reader"),
                    ("trajectory/calls_dropped/rollout_ended", "rollout ended"),
                    ("trajectory/calls_dropped/gateway_lapsed", "gateway lapsed"),
                    ("trajectory/calls_unseen", "unseen by the evaluator"),
                ],
            ),
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
#: What run folders from before the one-name-per-quantity renaming logged instead, so their charts
#: still draw (the old ``entropy`` was the mean sampled-token NLL, hence its new name).
FORMER_NAMES = {
    "heldout/success_rate": "heldout/accuracy",
    "policy/loss": "loss",
    "policy/approx_kl": "kl",
    "policy/kl_ref": "loss/kl_ref",
    "policy/sampled_nll": "entropy",
    "policy/grad_norm": "grad_norm",
    "policy/clip_fraction": "loss/clip_fraction",
    "policy/lr": "lr",
}
#: Not charted under "Other metrics": the axes themselves and counters that only identify a row.
_NOT_CHARTED = frozenset({"step", "time", "policy_version"})
#: Always drawn, even before the first step (a new run shows where its reward will appear).
_ALWAYS = frozenset({"Reward"})
#: Line colours; the overlay gives run i colour i, so ten runs get ten colours before any repeats.
COLORS = (
    "#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626",
    "#0891b2", "#ca8a04", "#db2777", "#4b5563", "#65a30d",
)  # fmt: skip
_DASH = ' stroke-dasharray="6 3"'


_finite = finite


def series(records: list[dict[str, float]], key: str, *, x: str = "step") -> Series:
    """``(x, value)`` points of one metric, finite numbers only. ``x``: ``"step"``, or ``"minutes"``
    (wall clock since the first record, from each record's ``time``)."""
    t0 = next((t for r in records if (t := _finite(r.get("time"))) is not None), None)
    points = []
    for record in records:
        value = _finite(record.get(key))
        at = _finite(record.get("step")) if x == "step" else None
        time = _finite(record.get("time"))
        if x == "minutes" and t0 is not None and time is not None:
            at = _finite((time - t0) / 60)  # two finite times can still be an infinite span apart
        if at is not None and value is not None:
            points.append((at, value))
    return points


def _log(metrics: Metrics) -> MetricsLog:
    return metrics if isinstance(metrics, MetricsLog) else MetricsLog.of(metrics)


def _line(log: MetricsLog, label: str, key: str, x: str, smooth: float, **style: Any) -> Line:
    """A metric's line from a log, by its current name, else by its former name (``FORMER_NAMES``),
    with its moving average for ``smooth`` as the log computed it."""
    if not log.points(key, x) and key in FORMER_NAMES:
        key = FORMER_NAMES[key]
    averaged = log.smoothed(key, x, smooth) if smooth > 0 else None
    return Line(label, log.points(key, x), smoothed=None if averaged is None else {smooth: averaged}, **style)


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


def thinned(points: Series, limit: int = MAX_POINTS_DRAWN) -> Series:
    """``points`` (sorted by x) if there are at most ``limit``; else, of each of ``limit // 2`` equal
    runs of them, the lowest and the highest (in x order), so the drawn line keeps every extreme."""
    if len(points) <= limit:
        return points
    buckets = max(1, limit // 2)
    out: Series = []
    for b in range(buckets):
        run = points[b * len(points) // buckets : (b + 1) * len(points) // buckets]
        if not run:
            continue
        low = min(range(len(run)), key=lambda i: run[i][1])
        high = max(range(len(run)), key=lambda i: run[i][1])
        out += [run[i] for i in sorted({low, high})]
    return out


#: The most ticks an axis gets, whatever its range (``nice_ticks`` makes about ``count``).
MAX_TICKS = 12
#: A range narrower than this share of its values' size is drawn as flat: round steps inside it
#: would be below a float's resolution (0.3 to 0.30000000000000004 is one ulp).
_FLAT = 1e-9


def _is_flat(lo: float, hi: float) -> bool:
    return hi - lo <= max(abs(lo), abs(hi)) * _FLAT


def nice_ticks(lo: float, hi: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten) covering ``[lo, hi]``. ``integer``:
    whole numbers only (steps: no tick at step 2.5), so a spacing of 2.5 becomes 2 and 0.5 becomes 1.

    At least one and at most ``MAX_TICKS``, made from an integer index, so no range can make it
    loop: a range that is not finite, empty or flat (``_is_flat``) gets ``[lo]``, one too wide or
    narrow for a float power of ten gets its two ends."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo or _is_flat(lo, hi):
        return [lo]
    step = _round_step((hi / 2 - lo / 2) / max(1, count) * 2)  # halves: hi - lo overflows at ±1e308
    if step is None:
        return [lo, hi]
    num, den = step
    if integer:
        num, den = max(1.0, float(math.floor(num / den))), 1.0
    first = math.ceil(lo * den / num - 1e-9)
    last = math.floor(hi * den / num + 1e-9)
    ticks = [(first + i) * num / den for i in range(max(0, min(last - first + 1, MAX_TICKS)))]
    return ticks or [lo]  # no round step inside (a count of 1, whole steps of a range below 1)


def _round_step(raw: float) -> tuple[float, float] | None:
    """The round step (1, 2, 2.5, 5 or 10 times a power of ten) at or above ``raw``, as ``(num,
    den)``: a tick is ``index * num / den``, and dividing by an exact power of ten rounds once, so
    3 * 2 / 10 is 0.6 where 3 * 0.2 is 0.6000000000000001. ``None`` past the floats' range."""
    if not (math.isfinite(raw) and raw > 0):
        return None
    exponent = math.floor(math.log10(raw))
    if not -308 <= exponent <= 308:  # 10.0 ** 309 overflows
        return None
    multiple = next(m for m in (1, 2, 2.5, 5, 10) if m * 10.0**exponent >= raw)
    num, den = (multiple, 10.0**-exponent) if exponent < 0 else (multiple * 10.0**exponent, 1.0)
    return (num, den) if math.isfinite(num) else None  # 2e308: a range of nearly every float


def _widened(lo: float, hi: float, pad: float) -> tuple[float, float]:
    """``[lo, hi]``; a flat one (``_is_flat``) widened by ``pad`` each way, or by more where ``pad``
    is below the values' resolution, kept inside the floats."""
    if not _is_flat(lo, hi):
        return lo, hi
    pad = max(pad, abs(lo) * _FLAT * 10, abs(hi) * _FLAT * 10, 1e-300)
    return max(-sys.float_info.max, lo - pad), min(sys.float_info.max, hi + pad)


def _share(value: float, lo: float, hi: float) -> float:
    """Where ``value`` lies from ``lo`` (0) to ``hi`` (1); in halves, as ``hi - lo`` may overflow."""
    return (value / 2 - lo / 2) / (hi / 2 - lo / 2)


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.2g}"
    return f"{value:.4g}"


def line_chart(
    title: str,
    lines: list[Line] | list[tuple[str, Series]],
    *,
    width: int = 380,
    height: int = 200,
    x_label: str = "step",
    smooth: float = 0.0,
    legend: list[Line] | None = None,
) -> str:
    """An SVG line chart of ``(label, points)`` lines (or ``Line``s); says so when there is no data.
    With ``smooth`` each line is drawn faint as logged and solid as its moving average
    (``smoothed``). ``legend``: the entries to list instead of one per line (the overlay lists its
    metrics' dash styles, the runs' colours being on the page)."""
    drawn = [Line(*line) for line in lines]
    left, right, top, bottom = 48, 10, 26, 30
    pw, ph = width - left - right, height - top - bottom
    points = [p for line in drawn for p in line.points]
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
    x0, x1 = _widened(min(xs), max(xs), 1.0)
    y0, y1 = _widened(min(ys), max(ys), abs(min(ys)) * 0.1 or 1.0)
    y_ticks = nice_ticks(y0, y1)
    y0, y1 = min(y0, y_ticks[0]), max(y1, y_ticks[-1])

    def sx(x: float) -> float:
        return left + _share(x, x0, x1) * pw

    def sy(y: float) -> float:
        return top + ph - _share(y, y0, y1) * ph

    parts = [head]
    for y in y_ticks:  # y grid with round labels
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="grid"/>')
        parts.append(
            f'<text x="{left - 4}" y="{sy(y) + 4:.1f}" text-anchor="end" class="axis">{_fmt(y)}</text>'
        )
    for x in nice_ticks(x0, x1, 5, integer=x_label == "step"):
        if x0 <= x <= x1:
            parts.append(
                f'<text x="{sx(x):.1f}" y="{height - 12}" text-anchor="middle" class="axis">{_fmt(x)}</text>'
            )
    parts.append(
        f'<text x="{left + pw / 2}" y="{height - 1}" text-anchor="middle" class="axis">{escape(x_label)}</text>'
    )
    for i, line in enumerate(drawn):
        color = line.color or COLORS[i % len(COLORS)]
        dash = _DASH if line.dashed else ""
        if line.points:
            shown = thinned(sorted(line.points))
            raw = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in shown)
            if smooth > 0:
                parts.append(
                    f'<polyline points="{raw}" fill="none" stroke="{color}" stroke-width="1" opacity="0.3"{dash}/>'
                )
                # Smoothed over every point, then thinned: the average is the same as unthinned.
                average = (line.smoothed or {}).get(smooth)
                average = (
                    thinned(sorted(average))
                    if average is not None
                    else thinned(smoothed(line.points, smooth))
                )
                ema = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in average)
                parts.append(
                    f'<polyline class="smoothed" points="{ema}" fill="none" stroke="{color}" stroke-width="2"{dash}/>'
                )
            else:
                parts.append(
                    f'<polyline points="{raw}" fill="none" stroke="{color}" stroke-width="2"{dash}/>'
                )
            for x, y in shown:
                parts.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{2 if smooth > 0 else 3}" fill="{color}">'
                    f"<title>{escape(line.label)} {escape(x_label)} {_fmt(x)}: {_fmt(y)}</title></circle>"
                )
    for i, entry in enumerate(drawn if legend is None else legend):
        parts.append(_legend_entry(entry, i, x=left + pw - 4, y=top + 12 + 14 * i, sample=legend is not None))
    parts.append("</svg>")
    return "".join(parts)


def _legend_entry(line: Line, i: int, *, x: float, y: float, sample: bool) -> str:
    """A right-aligned legend label in its line's colour; with ``sample``, after a short stretch of
    the line's stroke (solid or dashed), which is how the overlay tells a chart's metrics apart."""
    color = line.color or COLORS[i % len(COLORS)]
    stroke = ""
    if sample:
        stroke = (
            f'<line x1="{x - 18}" x2="{x}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" stroke-width="2"'
            f"{_DASH if line.dashed else ''}/>"
        )
        x -= 22
    return stroke + (
        f'<text x="{x}" y="{y}" text-anchor="end" fill="{color}" class="legend">'
        f"{escape(line.label)}{'' if line.points else ' (none)'}</text>"
    )


def run_charts(metrics: Metrics, *, x: str = "step", smooth: float = 0.0) -> str:
    """The runs page's charts for one run's metrics: one section per group of
    ``CHART_GROUPS`` (charts with no data left out, except "Reward"), then "Other metrics": a chart
    for every other numeric metric the run logged."""
    log = _log(metrics)
    x_label = _x_label(x)
    sections = []
    for group, charts in CHART_GROUPS:
        drawn = []
        for title, keys in charts:
            lines = [_line(log, label, key, x, smooth) for key, label in keys]
            if title in _ALWAYS or any(line.points for line in lines):
                drawn.append(line_chart(title, lines, x_label=x_label, smooth=smooth))
        sections.append(_section(group, drawn))
    others = _other_metrics([log])
    drawn = [
        line_chart(key, [_line(log, key, key, x, smooth)], x_label=x_label, smooth=smooth) for key in others
    ]
    return "".join(sections) + _others_section(drawn)


def overlay_charts(runs: list[tuple[str, Metrics]], *, x: str = "step", smooth: float = 0.0) -> str:
    """The charts of several runs overlaid: the same groups as ``run_charts``, run i drawn in
    ``COLORS[i]`` on every chart (the page shows which colour is which run), and the second metric
    of a chart (held-out beside train, max beside mean) dashed, as the chart's legend says."""
    logs = [(name, _log(metrics)) for name, metrics in runs]
    x_label = _x_label(x)
    big = {"width": 400, "height": 230, "x_label": x_label, "smooth": smooth}  # three a row at 1280 px
    sections = []
    for group, charts in CHART_GROUPS:
        drawn = []
        for title, keys in charts:
            lines = [
                _line(log, f"{name} · {label}", key, x, smooth, color=COLORS[i % len(COLORS)], dashed=j > 0)
                for i, (name, log) in enumerate(logs)
                for j, (key, label) in enumerate(keys)
            ]
            if title in _ALWAYS or any(line.points for line in lines):
                legend = [
                    Line(label, [p for line in lines[j :: len(keys)] for p in line.points], "#4b5563", j > 0)
                    for j, (_, label) in enumerate(keys)
                ]
                drawn.append(line_chart(title, lines, legend=legend if len(keys) > 1 else [], **big))
        sections.append(_section(group, drawn))
    drawn = [
        line_chart(
            key,
            [
                _line(log, name, key, x, smooth, color=COLORS[i % len(COLORS)])
                for i, (name, log) in enumerate(logs)
            ],
            legend=[],
            **big,
        )
        for key in _other_metrics([log for _, log in logs])
    ]
    return "".join(sections) + _others_section(drawn)


def _x_label(x: str) -> str:
    return "minutes" if x == "minutes" else "step"


def _section(group: str, drawn: list[str]) -> str:
    if not drawn:
        return ""
    return f'<h3 class="chart-group">{escape(group)}</h3><div class="charts">{"".join(drawn)}</div>'


def _others_section(drawn: list[str]) -> str:
    if not drawn:
        return ""
    return (
        f'<details class="chart-group"><summary>Other metrics ({len(drawn)})</summary>'
        f'<div class="charts">{"".join(drawn)}</div></details>'
    )


def _other_metrics(logs: list[MetricsLog]) -> list[str]:
    """Numeric metrics that no chart of ``CHART_GROUPS`` names, over all the runs' logs."""
    named = {key for _, charts in CHART_GROUPS for _, keys in charts for key, _ in keys} | set(
        FORMER_NAMES.values()
    )
    return sorted({key for log in logs for key in log.numeric_keys} - named - _NOT_CHARTED)
