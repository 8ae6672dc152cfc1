"""The runs page and the rollouts table (filterable, sortable, paginated in SQL).

"step" here only ever means a policy (optimizer) step: a training rollout's step is the step at
which its group was created, a held-out rollout's the step it evaluated. Which training group a
rollout belongs to is its group (``group_id``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from harnessrl.dashboard.charts import run_charts
from harnessrl.dashboard.data import ORDERS, RESULTS, DashboardData, RolloutFilter, RolloutRow
from harnessrl.dashboard.html import badge, esc, fmt_num, pretty_json, result_badge, trace_path, url
from harnessrl.dashboard.metrics_log import SMOOTHING, MetricsLog
from harnessrl.schemas import Outcome, RolloutStatus

PAGE_SIZE = 50


def chart_options(params: dict[str, str]) -> tuple[str, float]:
    """``(x axis, smoothing)`` from the query string (``x=step|minutes``, ``smooth=0.9``); junk is ignored."""
    x = "minutes" if params.get("x") == "minutes" else "step"
    try:
        smooth = float(params.get("smooth", 0))
    except ValueError:
        smooth = 0.0
    return x, smooth if smooth in SMOOTHING else 0.0


def chart_form(prefix: str, x: str, smooth: float) -> str:
    axes = "".join(
        f'<option value="{a}"{" selected" if a == x else ""}>{a}</option>' for a in ("step", "minutes")
    )
    weights = "".join(
        f'<option value="{w:g}"{" selected" if w == smooth else ""}>{"off" if w == 0 else f"{w:g}"}</option>'
        for w in SMOOTHING
    )
    return (
        f'<form class="filters chart-options" method="get" action="{esc(prefix)}/">'
        f'<label>x axis<select name="x">{axes}</select></label>'
        f'<label>smoothing<select name="smooth">{weights}</select></label><button>apply</button></form>'
    )


def runs_body(
    data: DashboardData, metrics: MetricsLog | Path, prefix: str, params: dict[str, str] | None = None
) -> tuple[str, bool]:
    """The runs page body, and whether any run is still running (the page then refreshes itself).
    ``metrics``: the run's ``MetricsLog`` (kept between loads: only new lines are read), or the path
    of its ``metrics.jsonl`` (read whole)."""
    log = metrics if isinstance(metrics, MetricsLog) else MetricsLog(metrics)
    with log.lock:
        return _runs_body(data, log.refresh(), prefix, params or {})


def _runs_body(data: DashboardData, log: MetricsLog, prefix: str, params: dict[str, str]) -> tuple[str, bool]:
    runs = data.list_runs()
    x, smooth = chart_options(params)
    parts = ["<h1>Runs</h1>"]
    if not runs:
        parts.append('<p class="muted">No runs in this store yet.</p>')
    for run in runs:
        counts = data.run_counts(run.run_id)
        total = sum(counts.values())
        count_text = ", ".join(f"{n} {esc(status)}" for status, n in sorted(counts.items())) or "none"
        last = log.last
        parts.append(
            f'<div class="card run" id="run-{esc(run.run_id)}"><h2>{esc(run.run_id)} {badge(run.status)}</h2>'
            f'<p><a href="{url(prefix + "/rollouts", run=run.run_id)}">{total} rollouts</a> ({count_text})'
            f"{' · step ' + esc(last.get('step')) if last else ''}"
            f"{' · policy version ' + esc(last.get('policy_version')) if 'policy_version' in last else ''}</p>"
        )
        if len(runs) == 1 or _run_dir(run.config) == str(log.path.parent):
            parts.append(chart_form(prefix, x, smooth) + run_charts(log, x=x, smooth=smooth))
        parts.append(f"<details><summary>config</summary>{pretty_json(run.config)}</details></div>")
    return "".join(parts), any(run.status == "running" for run in runs)


def _run_dir(config: dict[str, object]) -> object:
    """A stored config's ``run.dir``; ``None`` where ``run`` is no object (a config is any JSON
    object its creator sent: ``{"run": "x"}`` failed the runs page with a 500)."""
    run = config.get("run")
    return run.get("dir") if isinstance(run, dict) else None


@dataclass(frozen=True, slots=True)
class TableQuery:
    filters: RolloutFilter
    page: int  # 1-based


def parse_table_query(params: dict[str, str]) -> TableQuery:
    """Filters from the query string; junk values are ignored rather than erroring."""

    def _int(name: str) -> int | None:
        try:
            return int(params.get(name, ""))
        except ValueError:
            return None

    status = params.get("status") or None
    outcome = params.get("outcome") or None
    filters = RolloutFilter(
        run_id=params.get("run") or None,
        status=status if status in set(RolloutStatus) else None,
        outcome=outcome if outcome in set(Outcome) else None,
        step=_int("step"),
        group_id=params.get("group") or None,
        flagged=params.get("flagged") in ("1", "on", "true"),
        flag=params.get("flag") or None,
        kind=params.get("split") if params.get("split") in SPLITS.values() else None,
        result=params.get("result") if params.get("result") in RESULTS else None,
        order=params.get("order") if params.get("order") in ORDERS else "newest",
    )
    return TableQuery(filters=filters, page=max(1, _int("page") or 1))


#: split filter: label -> the rollouts' metadata["kind"]
SPLITS = {"train": "train", "held-out": "eval"}


def _select(
    name: str, options: list[str], current: str | None, *, labels: list[str] | None = None, any_: bool = True
) -> str:
    opts = ['<option value="">any</option>'] if any_ else []
    opts += [
        f'<option value="{esc(o)}"{" selected" if o == current else ""}>{esc(label)}</option>'
        for o, label in zip(options, labels or options, strict=True)
    ]
    return f'<label>{esc(name)}<select name="{esc(name)}">{"".join(opts)}</select></label>'


#: The table's columns: (header, order when the header is clicked, the other way, hover text).
_COLUMNS: list[tuple[str, str | None, str | None, str]] = [
    ("rollout", None, None, ""),
    ("split", None, None, "train, or held-out (metadata.kind)"),
    (
        "step",
        None,
        None,
        "policy step: for a training rollout the step at which its group was created, "
        "for a held-out rollout the step it evaluated",
    ),
    (
        "group",
        None,
        None,
        "the training group (group_id); its rollouts share a task and an advantage baseline",
    ),
    ("task", None, None, ""),
    ("status / result", None, None, "result by reward; hover a badge for how the harness ended"),
    ("reward", "reward_desc", "reward_asc", ""),
    ("duration", "duration_desc", "duration_asc", "harness start to finish"),
    ("created", "newest", "oldest", "UTC"),
    ("calls", None, None, ""),
    ("tokens", None, None, "tokens the policy sampled; hover a cell for the last prompt's size"),
    (
        "samples",
        None,
        None,
        "chains of calls, counted from the bases the store recorded for each call (no token is read); "
        "the trace builds the samples themselves",
    ),
    ("flags", None, None, "audit flags"),
    ("policy versions", None, None, "versions of the policy that sampled the calls"),
]


def _split_of(rollout_kind: object) -> str:
    return next((label for label, kind in SPLITS.items() if kind == rollout_kind), "")


def _created(at: float) -> str:
    """When a rollout was created, as UTC; a time no calendar holds (a damaged row's 1e300, which
    failed the whole rollouts table with a 500) as the number it is."""
    try:
        return time.strftime("%m-%d %H:%M:%S", time.gmtime(at))
    except (OverflowError, ValueError, OSError):
        return esc(at)


def _row_html(row: RolloutRow, prefix: str) -> str:
    r = row.rollout
    flags = " ".join(badge(flag, "flag") for flag in r.flags)
    versions = ", ".join(str(v) for v in row.policy_versions)
    duration = "" if row.duration_s is None else f"{row.duration_s:.1f}s"
    task = r.task_id or str(r.task.get("prompt", ""))[:40]
    return (
        f'<tr class="rollout-row"><td><a class="trace-link" href="{esc(trace_path(prefix, r.rollout_id))}">'
        f"{esc(r.rollout_id)}</a></td><td>{esc(_split_of(r.metadata.get('kind')))}</td>"
        f"<td class=num>{esc(r.step)}</td>"
        f'<td><a href="{url(prefix + "/rollouts", group=r.group_id)}">{esc(r.group_id)}</a></td><td>{esc(task)}</td>'
        f"<td>{badge(r.status)} {result_badge(r.reward, r.outcome)}</td><td class=num>{fmt_num(r.reward)}</td>"
        f"<td class=num>{duration}</td><td class=num>{_created(r.created_at)}</td><td class=num>{row.calls}</td>"
        f'<td class=num title="last prompt {row.prompt_tokens} tokens">{row.sampled_tokens}</td>'
        f"<td class=num>{row.calls and row.samples}</td><td>{flags}</td><td>{esc(versions)}</td></tr>"
    )


def _header(params: dict[str, object], prefix: str, order: str) -> str:
    """The header row; a sortable column's header links to its order (clicked again: the other way)."""
    cells = []
    for label, first, second, hover in _COLUMNS:
        title = f' title="{esc(hover)}"' if hover else ""
        if first is None:
            cells.append(f"<th{title}>{esc(label)}</th>")
            continue
        target = second if order == first else first
        arrow = " ↓" if order == first else " ↑" if order == second else ""
        link = url(prefix + "/rollouts", **{**params, "order": None if target == "newest" else target})
        cells.append(
            f'<th{title}><a class="sort" data-order="{esc(target)}" href="{link}">{esc(label)}</a>{arrow}</th>'
        )
    return "<tr>" + "".join(cells) + "</tr>"


#: The order select's labels (the same orders as the sortable headers).
_ORDER_LABELS = {
    "newest": "created ↓ (newest)",
    "oldest": "created ↑",
    "reward_desc": "reward ↓",
    "reward_asc": "reward ↑",
    "duration_desc": "duration ↓",
    "duration_asc": "duration ↑",
}


def _table_params(f: RolloutFilter) -> dict[str, object]:
    """The query string of the current filters and order, for the pager and the sort links."""
    return {
        "run": f.run_id,
        "status": f.status,
        "outcome": f.outcome,
        "step": f.step,
        "group": f.group_id,
        "flagged": "1" if f.flagged else None,
        "flag": f.flag,
        "split": f.kind,
        "result": f.result,
        "order": None if f.order == "newest" else f.order,
    }


def _filter_form(f: RolloutFilter, prefix: str, flags: list[str]) -> str:
    return (
        f'<form class="filters" method="get" action="{esc(prefix)}/rollouts">'
        + (f'<input type="hidden" name="run" value="{esc(f.run_id)}">' if f.run_id else "")
        + _select("split", list(SPLITS.values()), f.kind, labels=list(SPLITS))
        + _select("result", list(RESULTS), f.result)
        + _select("status", [s.value for s in RolloutStatus], f.status)
        + _select("outcome", [o.value for o in Outcome], f.outcome)
        + f'<label title="policy step">step<input name="step" size="5" value="{esc(f.step)}"></label>'
        + f'<label>group<input name="group" size="12" value="{esc(f.group_id)}"></label>'
        + _select("flag", flags, f.flag)
        + f'<label>flagged<input type="checkbox" name="flagged" value="1"{" checked" if f.flagged else ""}></label>'
        + _select("order", list(ORDERS), f.order, labels=[_ORDER_LABELS[o] for o in ORDERS], any_=False)
        + f'<button type="submit">Filter</button> <a href="{esc(prefix)}/rollouts">clear</a></form>'
    )


def _pager(params: dict[str, object], prefix: str, page_no: int, pages: int, total: int) -> str:
    prev_link = (
        f'<a rel="prev" href="{url(prefix + "/rollouts", **params, page=page_no - 1)}">← prev</a>'
        if page_no > 1
        else "<span class=muted>← prev</span>"
    )
    next_link = (
        f'<a rel="next" href="{url(prefix + "/rollouts", **params, page=page_no + 1)}">next →</a>'
        if page_no < pages
        else "<span class=muted>next →</span>"
    )
    return f'<div class="pager">{prev_link}<span>page {page_no} of {pages} · {total} rollouts</span>{next_link}</div>'


def rollouts_body(data: DashboardData, query: TableQuery, prefix: str) -> str:
    """The rollouts table page: one page of rows, each with its call statistics and sample count
    (``DashboardData.page_rollouts``: read from the store's columns, no call decoded)."""
    f = query.filters
    total = data.count_rollouts(f)
    pages = max(1, -(-total // PAGE_SIZE))
    page_no = min(query.page, pages)
    rows = data.page_rollouts(f, limit=PAGE_SIZE, offset=(page_no - 1) * PAGE_SIZE)
    params = _table_params(f)
    pager = _pager(params, prefix, page_no, pages, total)
    body_rows = "".join(_row_html(row, prefix) for row in rows) or (
        f'<tr><td colspan="{len(_COLUMNS)}" class="muted">no rollouts match</td></tr>'
    )
    compare = ""
    # Of the rewarded rollouts shown: an unrewarded one (running, failed) is neither best nor worst,
    # and the worst is another rollout than the best (a group of equal rewards compared one with itself).
    rewarded = [row for row in rows if row.rollout.reward is not None]
    if f.group_id and len(rewarded) >= 2:
        best = max(rewarded, key=lambda row: row.rollout.reward or 0.0)
        worst = min((row for row in rewarded if row is not best), key=lambda row: row.rollout.reward or 0.0)
        compare = (
            f'<p><a href="{url(prefix + "/compare", a=best.rollout.rollout_id, b=worst.rollout.rollout_id)}">'
            "compare best vs worst of this group</a></p>"
        )
    return (
        f"<h1>Rollouts</h1>{_filter_form(f, prefix, data.list_flags())}{compare}{pager}"
        f"<table id=rollouts>{_header(params, prefix, f.order)}{body_rows}</table>{pager}"
    )
