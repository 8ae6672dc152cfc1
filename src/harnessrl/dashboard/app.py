"""The dashboard's routes, mounted at ``/ui`` by the gateway or served alone for a run folder.

Routes (all behind the admin key, see ``dashboard.auth``): ``/ui/`` runs, ``/ui/rollouts`` table,
``/ui/rollouts/{rollout_id}`` trace, ``/ui/rollouts/{rollout_id}/logs/{attempt}/{stream}`` the
harness's stdout/stderr (``dashboard.logs``), ``/ui/compare?a=ID&b=ID``, ``/ui/login`` (GET form,
POST key). With several run folders, ``/ui/`` overlays their metrics (``dashboard.runs``) and each
run's routes move under ``/ui/runs/NAME``. Pages refresh themselves (``<meta http-equiv="refresh">``)
while their run or rollout is going. A rollout id may hold any character: links percent-encode it
(``html.trace_path``) and the trace and log routes take it as a ``path``, so a ``/`` in it works.
A store file gone since start (a run folder moved away) is a 404 page, one SQLite cannot read a 503.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route

from harnessrl.dashboard import auth
from harnessrl.dashboard.data import DamagedRollout, DashboardData
from harnessrl.dashboard.html import PAGE_HEADERS, esc, page
from harnessrl.dashboard.logs import attempt_logs, log_path, read_log_tail
from harnessrl.dashboard.metrics_log import MetricsLog
from harnessrl.dashboard.pages import parse_table_query, rollouts_body, runs_body
from harnessrl.dashboard.runs import STORE_FILE, RunSource, find_run_folders, name_runs, overview_body
from harnessrl.dashboard.trace import CompareSide, compare_body, trace_body
from harnessrl.dashboard.trace_calls import read_trace_calls
from harnessrl.errors import NotFound, UpstreamError
from harnessrl.schemas import TERMINAL_STATUSES, Rollout

if TYPE_CHECKING:
    from harnessrl.store.base import Store
    from harnessrl.tokenizer import PolicyTokenizer

PREFIX = "/ui"
REFRESH_S = 5


@dataclass
class Dashboard:
    """What the pages read: the store (read-only), the metrics file, the run folder (for the
    harness logs) and a tokenizer if one loads; and where its pages are (``prefix``)."""

    data: DashboardData | None  # None: the store is not a SQLite file (e.g. ":memory:")
    admin_key: str
    metrics_path: Path
    load_tokenizer: Callable[[], PolicyTokenizer | None] = lambda: None
    run_dir: Path | None = None  # None: no logs to link (a gateway store outside a run folder)
    prefix: str = PREFIX
    home: str | None = None  # the several-runs overview these pages belong to, if any
    _token_text: dict[int, str] = field(default_factory=dict)
    #: ``metrics_path`` as the runs page reads it: kept between loads, only new lines are read.
    metrics: MetricsLog = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = MetricsLog(self.metrics_path)

    def decode(self, token_id: int) -> str:
        """A token's text, or its id as ``⟨id⟩`` with no tokenizer or one that cannot decode it (a
        damaged call row's negative id raised ``OverflowError``: a 500 for the whole trace)."""
        text = self._token_text.get(token_id)
        if text is None:
            tokenizer = self.load_tokenizer()
            try:
                text = f"⟨{token_id}⟩" if tokenizer is None else tokenizer.decode([token_id])
            except Exception:  # noqa: BLE001 - the tokenizer library's own errors: show the id
                text = f"⟨{token_id}⟩"
            if len(self._token_text) < 200_000:
                self._token_text[token_id] = text
        return text


def _embedded(model: str) -> bool:
    """Whether a stored run's ``engine.model`` names weights this process could load."""
    from harnessrl.config import parse_engine_model

    try:
        return parse_engine_model(model).kind == "embedded"
    except ValueError:
        return False


def _html(
    dash: Dashboard, title: str, body: str, *, live: bool = False, status_code: int = 200
) -> HTMLResponse:
    refresh_s = REFRESH_S if live else None
    return HTMLResponse(
        page(title, body, prefix=dash.prefix, refresh_s=refresh_s, home=dash.home),
        status_code,
        headers=PAGE_HEADERS,
    )


def _error(dash: Dashboard, status_code: int, message: str) -> HTMLResponse:
    return _html(dash, "Error", f"<h1>{status_code}</h1><p>{esc(message)}</p>", status_code=status_code)


def _guarded(handler: Callable[[Request, Dashboard, DashboardData], Any], dash: Dashboard) -> Callable:
    """Auth first, then the page; a missing record (or store file) is a 404 page, a store that
    cannot be read a 503 page."""

    async def endpoint(request: Request) -> Response:
        denied = auth.check(request, dash.admin_key, dash.prefix)
        if denied is not None:
            return denied
        if dash.data is None:
            return _error(
                dash, 501, "The dashboard needs a SQLite store file; this gateway's store is not one."
            )
        try:
            return await handler(request, dash, dash.data)
        except NotFound as exc:
            return _error(dash, 404, str(exc))
        except UpstreamError as exc:  # DashboardData's translation of a store SQLite cannot read
            return _error(dash, 503, str(exc))

    return endpoint


async def _runs(request: Request, dash: Dashboard, data: DashboardData) -> Response:
    body, running = await run_in_threadpool(
        runs_body, data, dash.metrics, dash.prefix, dict(request.query_params)
    )
    return _html(dash, "Runs", body, live=running)


def _rollouts_page(data: DashboardData, params: dict[str, str], prefix: str) -> tuple[str, bool]:
    body = rollouts_body(data, parse_table_query(params), prefix)
    running = any(run.status == "running" for run in data.list_runs())
    return body, running


async def _rollouts(request: Request, dash: Dashboard, data: DashboardData) -> Response:
    body, running = await run_in_threadpool(_rollouts_page, data, dict(request.query_params), dash.prefix)
    return _html(dash, "Rollouts", body, live=running)


def _trace_page(
    dash: Dashboard, data: DashboardData, rollout_id: str, sample: int | None
) -> tuple[str, bool]:
    rollout = data.get_rollout(rollout_id)
    logs = attempt_logs(dash.run_dir, rollout)
    cap = data.sample_token_caps().get(rollout.run_id) if rollout.run_id is not None else None
    calls = read_trace_calls(data, rollout_id, rollout, max_sample_tokens=cap)
    requests = data.list_tool_requests(rollout_id)
    body = trace_body(
        rollout,
        calls,
        dash.decode,
        dash.prefix,
        logs=logs,
        tool_requests=requests.shown,
        tool_requests_total=requests.total,
        sample=sample,
        max_sample_tokens=cap,
    )
    return body, rollout.status not in TERMINAL_STATUSES


def _sample_param(request: Request) -> int | None:
    """``?sample=K``: show that sample's token view alone; junk is ignored (every sample)."""
    try:
        return int(request.query_params.get("sample", ""))
    except ValueError:
        return None


async def _trace(request: Request, dash: Dashboard, data: DashboardData) -> Response:
    rollout_id = request.path_params["rollout_id"]
    body, live = await run_in_threadpool(_trace_page, dash, data, rollout_id, _sample_param(request))
    return _html(dash, f"Rollout {request.path_params['rollout_id']}", body, live=live)


def _read_log(dash: Dashboard, data: DashboardData, rollout_id: str, attempt: int, stream: str) -> str:
    if dash.run_dir is None:
        raise NotFound("this dashboard has no run folder, so no harness logs")
    path = log_path(dash.run_dir, data.get_rollout(rollout_id), attempt, stream)
    try:
        return read_log_tail(path)
    except OSError as exc:  # gone, or a link swapped in since log_path looked
        raise NotFound(f"rollout {rollout_id!r} has no readable {stream} log of attempt {attempt}") from exc


async def _log(request: Request, dash: Dashboard, data: DashboardData) -> Response:
    """A harness log as plain text: never rendered as HTML (the harness wrote it), never framed."""
    p = request.path_params
    text = await run_in_threadpool(_read_log, dash, data, p["rollout_id"], p["attempt"], p["stream"])
    headers = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'; sandbox"}
    return PlainTextResponse(text, headers=headers)


def _compare_side(data: DashboardData, rollout_id: str, caps: dict[str, int]) -> CompareSide:
    """One side of a compare: its rollout and calls, or, for a rollout row that cannot be read
    (``DamagedRollout``), what is wrong with it and its calls (the other side is still shown)."""
    try:
        rollout: Rollout | str = data.get_rollout(rollout_id)
    except DamagedRollout as exc:
        rollout = str(exc)
    readable = rollout if isinstance(rollout, Rollout) else None
    cap = caps.get(readable.run_id) if readable is not None and readable.run_id is not None else None
    calls = read_trace_calls(data, rollout_id, readable, max_sample_tokens=cap)
    return CompareSide(rollout_id, rollout, calls)


def _compare_page(dash: Dashboard, data: DashboardData, a: str, b: str) -> tuple[str, bool]:
    caps = data.sample_token_caps()
    sides = [_compare_side(data, rid, caps) for rid in (a, b)]
    live = any(isinstance(s.rollout, Rollout) and s.rollout.status not in TERMINAL_STATUSES for s in sides)
    return compare_body(sides, dash.decode, dash.prefix, caps), live


async def _compare(request: Request, dash: Dashboard, data: DashboardData) -> Response:
    a, b = request.query_params.get("a"), request.query_params.get("b")
    if not a or not b:
        return _error(
            dash, 400, f"compare needs two rollouts: {dash.prefix}/compare?a=ROLLOUT_ID&b=ROLLOUT_ID"
        )
    body, live = await run_in_threadpool(_compare_page, dash, data, a, b)
    return _html(dash, "Compare", body, live=live)


def dashboard_routes(dash: Dashboard) -> list[Route]:
    """The routes of the ``/ui`` sub-app (paths relative to the mount)."""

    return [
        Route("/", _guarded(_runs, dash), methods=["GET"]),
        Route("/rollouts", _guarded(_rollouts, dash), methods=["GET"]),
        # ``path``: a rollout id may hold a ``/`` (its links percent-encode it, the server decodes
        # it); the logs route is tried first, so an id never swallows ``/logs/N/STREAM``.
        Route(
            "/rollouts/{rollout_id:path}/logs/{attempt:int}/{stream}", _guarded(_log, dash), methods=["GET"]
        ),
        Route("/rollouts/{rollout_id:path}", _guarded(_trace, dash), methods=["GET"]),
        Route("/compare", _guarded(_compare, dash), methods=["GET"]),
        *_login_routes(dash.admin_key, dash.prefix),
    ]


def _login_routes(admin_key: str, prefix: str) -> list[Route]:
    async def login_form(request: Request) -> Response:
        return auth.login_page(
            prefix,
            request.query_params.get("next", prefix + "/"),
            status_code=200,
            message="Enter the run's admin key.",
        )

    return [
        Route("/login", login_form, methods=["GET"]),
        Route("/login", partial(auth.login, admin_key=admin_key, prefix=prefix), methods=["POST"]),
    ]


def dashboard_mount(dash: Dashboard) -> Mount:
    return Mount(dash.prefix, app=Starlette(routes=dashboard_routes(dash)))


def gateway_dashboard(store: Store, admin_key: str, engine: Any) -> Mount:
    """The ``/ui`` mount for a gateway: its store file (read-only) and its engine's tokenizer."""
    path = store.local_file
    data = DashboardData(path) if path is not None and path.is_file() else None

    def load_tokenizer() -> PolicyTokenizer | None:
        try:
            return engine.tokenizer
        except Exception:  # noqa: BLE001 - an engine not started yet: show token ids instead
            return None

    # A run's store is RUN_DIR/harnessrl.db: its metrics and harness logs are beside it.
    run_dir = Path(path).parent if data else None
    metrics = run_dir / "metrics.jsonl" if run_dir else Path("/nonexistent/metrics.jsonl")
    return dashboard_mount(
        Dashboard(
            data=data,
            admin_key=admin_key,
            metrics_path=metrics,
            load_tokenizer=load_tokenizer,
            run_dir=run_dir,
        )
    )


def _run_tokenizer_loader(run_dir: Path) -> Callable[[], PolicyTokenizer | None]:
    """A loader trying the run's checkpoints, then its configured tokenizer or model (once, cached)."""
    cache: list[PolicyTokenizer | None] = []

    def load() -> PolicyTokenizer | None:
        if cache:
            return cache[0]
        from harnessrl.tokenizer import PolicyTokenizer

        candidates = [run_dir / "checkpoints" / "final", run_dir / "checkpoints" / "latest"]
        try:
            engine = json.loads((run_dir / "config.json").read_text()).get("engine", {})
        except (OSError, json.JSONDecodeError):
            engine = {}
        if engine.get("tokenizer"):
            candidates.append(Path(engine["tokenizer"]))
        tokenizer = None
        for folder in candidates:
            if (folder / "tokenizer.json").is_file():
                try:
                    tokenizer = PolicyTokenizer.from_dir(folder)
                    break
                except Exception:  # noqa: BLE001 - a damaged or half-copied checkpoint: try the next
                    continue  # (it failed every trace page with a 500; the view shows ids without one)
        if tokenizer is None and engine.get("model") and _embedded(str(engine["model"])):
            try:
                from harnessrl.engines.models import resolve_model_dir

                tokenizer = PolicyTokenizer.from_dir(
                    resolve_model_dir(engine["model"], engine.get("cache_dir"))
                )
            except Exception:  # noqa: BLE001 - no tokenizer at hand: the token view shows ids
                tokenizer = None
        cache.append(tokenizer)
        return tokenizer

    return load


def _folder_dashboard(
    run_dir: Path, admin_key: str, *, prefix: str = PREFIX, home: str | None = None
) -> Dashboard:
    return Dashboard(
        data=DashboardData(run_dir / STORE_FILE),
        admin_key=admin_key,
        metrics_path=run_dir / "metrics.jsonl",
        load_tokenizer=_run_tokenizer_loader(run_dir),
        run_dir=run_dir,
        prefix=prefix,
        home=home,
    )


def _overview_mount(sources: list[RunSource], admin_key: str) -> Mount:
    """``/ui/``: the runs overlaid; ``/ui/runs/NAME/...``: each run's own pages."""

    logs: dict[str, MetricsLog] = {}  # each run's metrics, read on as the runs go on

    async def overview(request: Request) -> Response:
        denied = auth.check(request, admin_key, PREFIX)
        if denied is not None:
            return denied
        body, running = await run_in_threadpool(
            overview_body, sources, PREFIX, dict(request.query_params), logs
        )
        refresh_s = REFRESH_S if running else None
        return HTMLResponse(
            page("Runs", body, prefix=PREFIX, refresh_s=refresh_s, home=PREFIX, run_nav=False),
            headers=PAGE_HEADERS,
        )

    runs = [
        Mount(
            f"/runs/{s.name}",
            app=Starlette(
                routes=dashboard_routes(
                    _folder_dashboard(s.path, admin_key, prefix=f"{PREFIX}/runs/{s.name}", home=PREFIX)
                )
            ),
        )
        for s in sources
    ]
    return Mount(
        PREFIX, routes=[Route("/", overview, methods=["GET"]), *_login_routes(admin_key, PREFIX), *runs]
    )


def create_dashboard_app(run_dirs: str | Path | Sequence[str | Path], admin_key: str) -> Starlette:
    """A standalone, read-only dashboard (``harnessrl dashboard --run-dir DIR [--run-dir DIR ...]``).

    One run folder: its pages at ``/ui/``. Several (or a folder of run folders): their metrics
    overlaid at ``/ui/``, each run's pages under ``/ui/runs/NAME/``. ``NotFound`` names a path that
    holds no run."""
    paths = [run_dirs] if isinstance(run_dirs, str | Path) else list(run_dirs)
    folders = find_run_folders(paths)

    async def root(request: Request) -> Response:
        return RedirectResponse(PREFIX + "/" + (f"?{request.url.query}" if request.url.query else ""), 307)

    if len(folders) == 1:
        return Starlette(routes=[Route("/", root), dashboard_mount(_folder_dashboard(folders[0], admin_key))])
    return Starlette(routes=[Route("/", root), _overview_mount(name_runs(folders), admin_key)])
