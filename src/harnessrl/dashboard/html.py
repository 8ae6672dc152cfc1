"""The dashboard's page shell (layout, navigation, CSS) and small HTML helpers.

Every value interpolated into HTML goes through ``esc`` (``html.escape`` with quotes), so text
from harnesses, models and tasks can never inject markup.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

CSS = """
:root { --fg:#111827; --muted:#6b7280; --line:#e5e7eb; --bg:#f9fafb; --accent:#2563eb; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color:var(--fg);
  background:var(--bg); }
header { background:#111827; color:#fff; padding:10px 20px; display:flex; gap:20px; align-items:center; }
header a { color:#d1d5db; text-decoration:none; } header a:hover { color:#fff; }
header .brand { font-weight:700; color:#fff; }
main { padding:16px 20px; max-width:1500px; }
h1 { font-size:20px; margin:4px 0 12px; } h2 { font-size:16px; margin:20px 0 8px; }
a { color:var(--accent); }
.card { background:#fff; border:1px solid var(--line); border-radius:8px; padding:12px 14px; margin:10px 0; }
.charts { display:flex; flex-wrap:wrap; gap:10px; }
.chart-group { font-size:13px; margin:12px 0 6px; color:var(--muted); }
.chart { background:#fff; border:1px solid var(--line); border-radius:6px; }
.chart-title { font-weight:600; font-size:12px; } .axis { font-size:10px; fill:#6b7280; }
.legend { font-size:11px; } .grid { stroke:#e5e7eb; } .muted { color:var(--muted); fill:#9ca3af; }
table { border-collapse:collapse; width:100%; background:#fff; }
th, td { border-bottom:1px solid var(--line); padding:4px 8px; text-align:left; vertical-align:top; }
th { background:#f3f4f6; font-weight:600; font-size:12px; } td.num { text-align:right;
  font-variant-numeric:tabular-nums; }
tr:hover td { background:#f9fafb; }
.badge { display:inline-block; padding:0 6px; border-radius:9px; font-size:12px; background:#e5e7eb; }
.b-success, .b-finished, .b-solved { background:#dcfce7; color:#166534; }
.b-partial { background:#fef9c3; color:#854d0e; } .b-unsolved { background:#f3f4f6; color:#374151; }
.b-policy_failure, .b-timeout { background:#fef3c7; color:#92400e; }
.b-infra_failure, .b-failed, .b-flag { background:#fee2e2; color:#991b1b; }
.b-running, .b-queued { background:#dbeafe; color:#1e40af; }
form.filters { display:flex; flex-wrap:wrap; gap:8px; align-items:end; margin-bottom:10px; }
form.filters label { font-size:12px; color:var(--muted); display:flex; flex-direction:column; }
input, select, button { font:inherit; padding:3px 6px; }
pre { white-space:pre-wrap; word-break:break-word; margin:4px 0; font:12px/1.4 ui-monospace, monospace; }
.msg { border-left:4px solid #d1d5db; padding:4px 10px; margin:8px 0; background:#fff; }
.msg .role { font-size:12px; font-weight:600; color:var(--muted); text-transform:uppercase; }
.msg.system { border-color:#9ca3af; } .msg.user { border-color:#2563eb; }
.msg.assistant { border-color:#16a34a; } .msg.tool { border-color:#ea580c; }
mark.hit { background:#fecaca; color:#7f1d1d; font-weight:700; }
.tokens { font:12px/1.9 ui-monospace, monospace; word-break:break-all; background:#fff; padding:8px;
  border:1px solid var(--line); border-radius:6px; }
.tok { white-space:pre-wrap; border-radius:2px; }
.tok.ctx { background:#f3f4f6; color:#4b5563; }
.tok.smp { background:#bbf7d0; color:#14532d; outline:1px solid #86efac; }
.tok.low { background:#fde68a; }
.brk { display:inline-block; background:#fee2e2; color:#991b1b; font-weight:700; font-size:11px; padding:0 4px;
  margin:0 2px; border-radius:3px; }
.pv { display:inline-block; background:#ede9fe; color:#5b21b6; font-size:11px; padding:0 4px; margin:0 2px;
  border-radius:3px; }
.compare { display:grid; grid-template-columns:1fr 1fr; gap:14px; }
.pager { margin:10px 0; display:flex; gap:12px; align-items:center; }
details > summary { cursor:pointer; color:var(--accent); }
.kv td:first-child { color:var(--muted); width:160px; }
.swatch { display:inline-block; width:12px; height:12px; border-radius:2px; margin-right:6px;
  vertical-align:-1px; }
th a.sort { color:inherit; }
"""


#: The headers of every HTML page. The pages hold no script at all, so none may run: a page shows
#: what a policy wrote, and were one value ever left unescaped, its ``<script>`` or ``onerror=``
#: would still be refused (``script-src`` falls back to ``'none'``). Styles are the inline CSS and
#: ``style`` attributes; nothing is fetched, a form submits only to this dashboard, and no other
#: site may frame a page (clickjacking).
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; "
        "base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def esc(value: Any) -> str:
    """HTML-escaped text of any value (``None`` → empty)."""
    return "" if value is None else escape(str(value), quote=True)


def url(path: str, **params: Any) -> str:
    """``path?query`` with the non-empty params, escaped for an attribute (0 is a value: step 0)."""
    query = urlencode({k: v for k, v in params.items() if v is not None and v is not False and v != ""})
    return esc(f"{path}?{query}" if query else path)


def trace_path(prefix: str, rollout_id: str) -> str:
    """A rollout's trace page: its id percent-encoded as one path segment (an id is the harness's or
    the trainer's to choose: a ``/``, ``?``, ``#`` or ``%`` in it must not change where the link goes)."""
    return f"{prefix}/rollouts/{quote(rollout_id, safe='')}"


def badge(text: Any, kind: str | None = None) -> str:
    if text in (None, ""):
        return ""
    return f'<span class="badge b-{esc(kind or text)}">{esc(text)}</span>'


def result_badge(reward: float | None, outcome: Any) -> str:
    """A rollout's result by its reward — ``solved`` (1), ``partial``, ``unsolved`` (0) — with how the
    harness ended on hover. The harness's exit status (``success`` = exited 0) says nothing of the
    task; with no reward (an infrastructure failure, a rollout still running) the outcome is shown."""
    if reward is None:
        return badge(outcome)
    kind = "solved" if reward >= 1 else "partial" if reward > 0 else "unsolved"
    ended = getattr(outcome, "value", outcome)
    return f'<span class="badge b-{kind}" title="harness: {esc(ended)}">{kind}</span>'


def pretty_json(value: Any, *, limit: int | None = None) -> str:
    """``value`` as indented JSON in a ``<pre>``. ``limit``: at most that many characters of JSON,
    never more work than that either: over it, the JSON is written without indentation (which
    multiplies with nesting: a 1 MB array nested 40 deep is 40 MB indented), and cut if still over."""
    if limit is None:
        return f"<pre>{esc(json.dumps(value, indent=2, ensure_ascii=False, default=str))}</pre>"
    text, cut = _json_upto(value, 2, limit)
    if cut:
        text, cut = _json_upto(value, None, limit)
    note = f"\n… (cut: the dashboard shows {limit:,} characters of it)" if cut else ""
    return f"<pre>{esc(text)}{esc(note)}</pre>"


def _json_upto(value: Any, indent: int | None, limit: int) -> tuple[str, bool]:
    """``value``'s JSON, encoded only until it passes ``limit`` characters: (its first ``limit``
    characters, whether it was longer)."""
    chunks, size = [], 0
    for chunk in json.JSONEncoder(indent=indent, ensure_ascii=False, default=str).iterencode(value):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return "".join(chunks)[:limit], True
    return "".join(chunks), False


def fmt_num(value: float | None, digits: int = 3) -> str:
    """A number to ``digits`` significant digits (thousands as whole numbers); empty for ``None``
    and for anything that is not a number a float can hold (a metric can be any JSON value)."""
    if not isinstance(value, int | float):
        return ""
    try:
        number = float(value)
    except OverflowError:
        return ""
    return f"{number:.{digits}g}" if abs(number) < 1000 else f"{number:,.0f}"


def page(
    title: str,
    body: str,
    *,
    prefix: str,
    refresh_s: int | None = None,
    home: str | None = None,
    run_nav: bool = True,
) -> str:
    """A full HTML page: header navigation under ``prefix`` (e.g. ``/ui``), then ``body``. ``home``:
    the several-runs overview (``/ui``) that a run's pages belong to, linked as "All runs";
    ``run_nav=False`` for the overview itself, which has no runs page or rollouts of its own."""
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s else ""
    live = (
        ' <span class="badge b-running" title="this page refreshes itself">live</span>' if refresh_s else ""
    )
    nav = f'<a href="{esc(home)}/">All runs</a>' if home is not None else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">{refresh}'
        f"<title>{esc(title)} · harnessrl</title><style>{CSS}</style></head><body>"
        f'<header><a class="brand" href="{esc(home or prefix)}/">harnessrl</a>{nav}'
        + (
            f'<a href="{esc(prefix)}/">Runs</a><a href="{esc(prefix)}/rollouts">Rollouts</a>'
            if run_nav
            else ""
        )
        + f"{live}</header>"
        f"<main>{body}</main></body></html>"
    )
