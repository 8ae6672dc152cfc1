"""The dashboard's routes, mounted at ``/ui`` by the gateway or served alone for a run folder.

Routes (all behind the admin key, see ``dashboard.auth``): ``/ui/`` runs, ``/ui/rollouts`` table,
``/ui/rollouts/{rollout_id}`` trace, ``/ui/compare?a=ID&b=ID``, ``/ui/login`` (GET form, POST key).
Pages refresh themselves (``<meta http-equiv="refresh">``) while their run or rollout is going.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route

from harnessrl.dashboard import auth
from harnessrl.dashboard.data import DashboardData
from harnessrl.dashboard.html import esc, page
from harnessrl.dashboard.pages import parse_table_query, rollouts_body, runs_body
from harnessrl.dashboard.trace import compare_body, trace_body
from harnessrl.errors import NotFound
from harnessrl.schemas import TERMINAL_STATUSES
from harnessrl.trajectory import build_rollout_samples

if TYPE_CHECKING:
    from harnessrl.store.base import Store
    from harnessrl.tokenizer import PolicyTokenizer

PREFIX = "/ui"
REFRESH_S = 5


@dataclass
class Dashboard:
    """What the pages read: the store (read-only), the metrics file, and a tokenizer if one loads."""

    data: DashboardData | None  # None: the store is not a SQLite file (e.g. ":memory:")
    admin_key: str
    metrics_path: Path
    load_tokenizer: Callable[[], PolicyTokenizer | None] = lambda: None
    _token_text: dict[int, str] = field(default_factory=dict)

    def decode(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            tokenizer = self.load_tokenizer()
            text = f"⟨{token_id}⟩" if tokenizer is None else tokenizer.decode([token_id])
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


def _html(title: str, body: str, *, live: bool = False, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(page(title, body, prefix=PREFIX, refresh_s=REFRESH_S if live else None), status_code)


def _error(status_code: int, message: str) -> HTMLResponse:
    return _html("Error", f"<h1>{status_code}</h1><p>{esc(message)}</p>", status_code=status_code)


def _guarded(handler: Callable[[Request, Dashboard, DashboardData], Any], dash: Dashboard) -> Callable:
    """Auth first, then the page; a missing record is a 404 page."""

    async def endpoint(request: Request) -> Response:
        denied = auth.check(request, dash.admin_key, PREFIX)
        if denied is not None:
            return denied
        if dash.data is None:
            return _error(501, "The dashboard needs a SQLite store file; this gateway's store is not one.")
        try:
            return await handler(request, dash, dash.data)
        except NotFound as exc:
            return _error(404, str(exc))

    return endpoint


async def _runs(request: Request, dash: Dashboard, data: DashboardData) -> Response:
    body, running = await run_in_threadpool(
        runs_body, data, dash.metrics_path, PREFIX, dict(request.query_params)
    )
    return _html("Runs", body, live=running)


def _samples_of(data: DashboardData, rollout_ids: list[str]) -> dict[str, int]:
    counts = {}
    for rollout_id in rollout_ids:
        rollout = data.get_rollout(rollout_id)
        counts[rollout_id] = len(build_rollout_samples(rollout, data.list_calls(rollout_id)).samples)
    return counts


def _rollouts_page(data: DashboardData, params: dict[str, str]) -> tuple[str, bool]:
    query = parse_table_query(params)
    # Sample counts need the page's calls; find the page's ids first (one cheap query).
    from harnessrl.dashboard.pages import PAGE_SIZE

    total = data.count_rollouts(query.filters)
    page_no = min(query.page, max(1, -(-total // PAGE_SIZE)))
    ids = [
        r.rollout.rollout_id
        for r in data.page_rollouts(query.filters, limit=PAGE_SIZE, offset=(page_no - 1) * PAGE_SIZE)
    ]
    body = rollouts_body(data, query, PREFIX, _samples_of(data, ids))
    running = any(run.status == "running" for run in data.list_runs())
    return body, running


async def _rollouts(request: Request, dash: Dashboard, data: DashboardData) -> Response:
    body, running = await run_in_threadpool(_rollouts_page, data, dict(request.query_params))
    return _html("Rollouts", body, live=running)


def _trace_page(dash: Dashboard, data: DashboardData, rollout_id: str) -> tuple[str, bool]:
    rollout = data.get_rollout(rollout_id)
    body = trace_body(rollout, data.list_calls(rollout_id), dash.decode, PREFIX)
    return body, rollout.status not in TERMINAL_STATUSES


async def _trace(request: Request, dash: Dashboard, data: DashboardData) -> Response:
    body, live = await run_in_threadpool(_trace_page, dash, data, request.path_params["rollout_id"])
    return _html(f"Rollout {request.path_params['rollout_id']}", body, live=live)


def _compare_page(dash: Dashboard, data: DashboardData, a: str, b: str) -> tuple[str, bool]:
    pairs = [(data.get_rollout(rid), data.list_calls(rid)) for rid in (a, b)]
    live = any(rollout.status not in TERMINAL_STATUSES for rollout, _ in pairs)
    return compare_body(pairs, dash.decode, PREFIX), live


async def _compare(request: Request, dash: Dashboard, data: DashboardData) -> Response:
    a, b = request.query_params.get("a"), request.query_params.get("b")
    if not a or not b:
        return _error(400, "compare needs two rollouts: /ui/compare?a=ROLLOUT_ID&b=ROLLOUT_ID")
    body, live = await run_in_threadpool(_compare_page, dash, data, a, b)
    return _html("Compare", body, live=live)


def dashboard_routes(dash: Dashboard) -> list[Route]:
    """The routes of the ``/ui`` sub-app (paths relative to the mount)."""

    async def login_form(request: Request) -> Response:
        return auth.login_page(
            PREFIX,
            request.query_params.get("next", PREFIX + "/"),
            status_code=200,
            message="Enter the run's admin key.",
        )

    return [
        Route("/", _guarded(_runs, dash), methods=["GET"]),
        Route("/rollouts", _guarded(_rollouts, dash), methods=["GET"]),
        Route("/rollouts/{rollout_id}", _guarded(_trace, dash), methods=["GET"]),
        Route("/compare", _guarded(_compare, dash), methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", partial(auth.login, admin_key=dash.admin_key, prefix=PREFIX), methods=["POST"]),
    ]


def dashboard_mount(dash: Dashboard) -> Mount:
    return Mount(PREFIX, app=Starlette(routes=dashboard_routes(dash)))


def gateway_dashboard(store: Store, admin_key: str, engine: Any) -> Mount:
    """The ``/ui`` mount for a gateway: its store file (read-only) and its engine's tokenizer."""
    path = store.local_file
    data = DashboardData(path) if path is not None and path.is_file() else None

    def load_tokenizer() -> PolicyTokenizer | None:
        try:
            return engine.tokenizer
        except Exception:  # noqa: BLE001 - an engine not started yet: show token ids instead
            return None

    metrics = Path(path).parent / "metrics.jsonl" if data else Path("/nonexistent/metrics.jsonl")
    return dashboard_mount(
        Dashboard(data=data, admin_key=admin_key, metrics_path=metrics, load_tokenizer=load_tokenizer)
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
                tokenizer = PolicyTokenizer.from_dir(folder)
                break
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


def create_dashboard_app(run_dir: str | Path, admin_key: str) -> Starlette:
    """A standalone, read-only dashboard for one run folder (``harnessrl dashboard --run RUN_DIR``)."""
    run_dir = Path(run_dir)
    dash = Dashboard(
        data=DashboardData(run_dir / "harnessrl.db"),
        admin_key=admin_key,
        metrics_path=run_dir / "metrics.jsonl",
        load_tokenizer=_run_tokenizer_loader(run_dir),
    )

    async def root(request: Request) -> Response:
        return RedirectResponse(PREFIX + "/" + (f"?{request.url.query}" if request.url.query else ""), 307)

    return Starlette(routes=[Route("/", root), dashboard_mount(dash)])
