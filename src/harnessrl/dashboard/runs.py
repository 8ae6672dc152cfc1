"""Several run folders in one dashboard: finding them, naming them, and the page that overlays them.

``harnessrl dashboard --run-dir A --run-dir B`` (or ``--run-dir PARENT`` of run folders) serves an
overview at ``/ui/``: a table of the runs, which doubles as the colour legend, above every chart of
their ``metrics.jsonl`` overlaid (``charts.overlay_charts``). Each run keeps its own pages (runs,
rollouts, traces) under ``/ui/runs/NAME/``; a name is the folder's, made URL-safe and unique.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harnessrl.dashboard.charts import COLORS, overlay_charts
from harnessrl.dashboard.data import DashboardData
from harnessrl.dashboard.html import badge, esc, fmt_num
from harnessrl.dashboard.metrics_log import MetricsLog
from harnessrl.dashboard.pages import chart_form, chart_options
from harnessrl.errors import HarnessRLError, NotFound

STORE_FILE = "harnessrl.db"


@dataclass(frozen=True, slots=True)
class RunSource:
    """One run folder the dashboard serves, and the name its pages are under."""

    name: str
    path: Path


def find_run_folders(paths: Sequence[str | Path]) -> list[Path]:
    """Each path is a run folder (it holds ``harnessrl.db``) or a folder of run folders (its
    sub-folders that hold one, by name). ``NotFound`` names a path that is neither."""
    found: list[Path] = []
    for given in map(Path, paths):
        if (given / STORE_FILE).is_file():
            folders = [given]
        else:
            children = sorted(given.iterdir()) if given.is_dir() else []
            folders = [child for child in children if (child / STORE_FILE).is_file()]
        if not folders:
            raise NotFound(
                f"no store at {str(given / STORE_FILE)!r} nor in its sub-folders: is {str(given)!r} a run folder?"
            )
        found += [folder for folder in folders if folder.resolve() not in {f.resolve() for f in found}]
    return found


def name_runs(folders: Sequence[Path]) -> list[RunSource]:
    """Folder names as URL path segments: other characters become ``-``, a repeat gets ``-2``, ``-3``."""
    sources: list[RunSource] = []
    taken: set[str] = set()
    for folder in folders:
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", folder.name).strip("-.") or "run"
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}-{n}"
        taken.add(name)
        sources.append(RunSource(name, folder))
    return sources


def _run_row(i: int, source: RunSource, log: MetricsLog, prefix: str) -> tuple[str, bool]:
    """A line of the runs table (the chart legend: the run's colour), and whether the run is running."""
    try:
        data = DashboardData(source.path / STORE_FILE)
        runs = data.list_runs()
        rollouts = sum(sum(data.run_counts(run.run_id).values()) for run in runs)
    except HarnessRLError as exc:  # one run folder moved away or broken: the others still show
        return _missing_row(i, source, exc), False
    last = log.last
    held_out = log.latest.get("heldout/reward")
    home = f"{prefix}/runs/{source.name}"
    row = (
        f'<tr class="run-row" data-run="{esc(source.name)}">'
        f'<td><span class="swatch" style="background:{COLORS[i % len(COLORS)]}"></span>'
        f'<a href="{esc(home)}/">{esc(source.name)}</a></td>'
        f"<td>{' '.join(badge(run.status) for run in runs)}</td><td class=num>{esc(last.get('step'))}</td>"
        f"<td class=num>{fmt_num(last.get('reward/mean'))}</td><td class=num>{fmt_num(held_out)}</td>"
        f'<td class=num><a href="{esc(home)}/rollouts">{rollouts}</a></td>'
        f'<td class="muted">{esc(source.path)}</td></tr>'
    )
    return row, any(run.status == "running" for run in runs)


def _missing_row(i: int, source: RunSource, exc: HarnessRLError) -> str:
    """A run whose store cannot be read now: named, with why, in the table's other cells."""
    return (
        f'<tr class="run-row run-missing" data-run="{esc(source.name)}">'
        f'<td><span class="swatch" style="background:{COLORS[i % len(COLORS)]}"></span>{esc(source.name)}</td>'
        f'<td><span class="badge b-failed">missing</span></td><td colspan="4" class="muted">{esc(exc)}</td>'
        f'<td class="muted">{esc(source.path)}</td></tr>'
    )


def overview_body(
    sources: Sequence[RunSource],
    prefix: str,
    params: dict[str, str],
    logs: dict[str, MetricsLog] | None = None,
) -> tuple[str, bool]:
    """The several-runs page body, and whether any run is still running (the page then refreshes).
    ``logs``: each run's ``MetricsLog`` by name, kept between loads (only new lines are read); one
    missing is made (and kept there)."""
    logs = {} if logs is None else logs
    for source in sources:
        logs.setdefault(source.name, MetricsLog(source.path / "metrics.jsonl"))
    with contextlib.ExitStack() as held:  # in the sources' order, as every caller takes them
        for source in sources:
            held.enter_context(logs[source.name].lock)
        return _overview_body(sources, prefix, params, [logs[source.name].refresh() for source in sources])


def _overview_body(
    sources: Sequence[RunSource], prefix: str, params: dict[str, str], logs: list[MetricsLog]
) -> tuple[str, bool]:
    x, smooth = chart_options(params)
    metrics = [(source.name, log) for source, log in zip(sources, logs, strict=True)]
    rows, running = [], False
    for i, (source, log) in enumerate(zip(sources, logs, strict=True)):
        row, live = _run_row(i, source, log, prefix)
        rows.append(row)
        running = running or live
    head = (
        "<tr><th>run</th><th>status</th><th>step</th><th>reward (last)</th><th>held-out reward (last)</th>"
        "<th>rollouts</th><th>folder</th></tr>"
    )
    return (
        f"<h1>Runs ({len(sources)})</h1><table id=runs>{head}{''.join(rows)}</table>"
        + chart_form(prefix, x, smooth)
        + overlay_charts(metrics, x=x, smooth=smooth)
    ), running
