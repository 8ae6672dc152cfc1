"""The retriever on the gateway: ``POST /rollouts/{rollout_id}/search`` for a rollout's own key, and
``GET /api/rollouts/{rollout_id}/tool_requests`` (admin) for what it asked and got.

A sandboxed harness reaches the gateway through the one relayed socket it has (docs/sandbox.md), so
serving the retriever here opens nothing: no port, no second socket. A search is authorized exactly
like a model call (the rollout's key, only under its own URL; the admin key is refused), refused
for a rollout that ended, rate-limited per rollout (a token bucket, 429 with ``Retry-After`` set to
the whole seconds until the bucket holds a search again),
bounded in size (413 past ``retrieval.max_query_chars``) and in number (409 ``conflict`` past
``retrieval.max_searches_per_rollout`` searches of one attempt: each is stored with its passages, so
a looping policy filled the store for its whole timeout), run off the event loop, and recorded in the
store (``ToolRequest``) before it is answered, like a call: a search still running when its rollout
(or attempt) ends is refused by the store under the same lock as the end (409), never recorded.

The gateway package never imports this module: whoever composes the app passes
``RetrievalRoutes(index, config)`` among its ``extra_routes`` (``controller.stack.local_stack``).
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from harnessrl.errors import BadRequest, Conflict, Overloaded, PayloadTooLarge
from harnessrl.gateway.auth import authorize_rollout, require_admin
from harnessrl.gateway.bodies import read_body
from harnessrl.gateway.errors import RolloutClosed, error_response, error_shape
from harnessrl.gateway.json_input import parse_json
from harnessrl.gateway.state import GatewayState
from harnessrl.retrieval.config import RetrievalConfig
from harnessrl.retrieval.index import RetrievalIndex
from harnessrl.schemas import TERMINAL_STATUSES, ToolRequest, now
from harnessrl.store.base import RolloutEnded
from harnessrl.store.damage import RolloutUnreadable

#: A search body is small: a query of ``max_query_chars`` characters and top_k. A character is at
#: most 12 bytes as a conforming JSON client may write it (a non-BMP one as two ``\uXXXX`` escapes,
#: what ``json.dumps`` sends by default), so the cap is 12 bytes a character plus this slack.
_BYTES_PER_CHAR = 12
_BODY_SLACK = 1024
#: ``?attempt=``: ASCII digits only (``str.isdigit`` also takes "²" and "٣", which ``int`` refuses).
_ATTEMPT = re.compile(r"[0-9]{1,18}")
#: Buckets kept per gateway process; the least recently used rollout's is dropped past this.
_MAX_BUCKETS = 100_000


@dataclass
class RateLimit:
    """A token bucket per rollout: ``rate`` tokens a second, at most ``burst`` saved up. ``clock`` is
    a seam (tests pass their own)."""

    rate: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    _buckets: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict)

    def take(self, key: str) -> float:
        """0 if ``key`` may go now (a token is spent), else the seconds until it may."""
        at = self.clock()
        tokens, last = self._buckets.pop(key, (float(self.burst), at))
        tokens = min(float(self.burst), tokens + (at - last) * self.rate)
        wait = 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens - 1.0 if wait == 0.0 else tokens, at)
        if len(self._buckets) > _MAX_BUCKETS:
            self._buckets.popitem(last=False)
        return wait


class SearchesSpent(Conflict):
    """The rollout attempt made its ``retrieval.max_searches_per_rollout`` searches (409: a retry
    cannot help, and the SDKs are told not to)."""


@dataclass
class SearchBudget:
    """Searches counted per rollout attempt against ``limit``. A count starts from what the store
    holds for that attempt (``seed``: a restarted gateway, a peer's searches) and then counts this
    process's own, so N gateways serving one rollout hold it within N x ``limit``. The least recently
    used counts are dropped past ``_MAX_BUCKETS`` (and read from the store again when next needed)."""

    limit: int
    _counts: OrderedDict[tuple[str, int], int] = field(default_factory=OrderedDict)

    def knows(self, key: tuple[str, int]) -> bool:
        return key in self._counts

    def seed(self, key: tuple[str, int], stored: int) -> None:
        """Start ``key``'s count at ``stored`` unless a concurrent search of it started it first."""
        self._counts.setdefault(key, stored)

    def take(self, key: tuple[str, int]) -> bool:
        """Whether ``key`` may search once more (then counted); call only after ``seed``."""
        used = self._counts.pop(key)
        self._counts[key] = used + 1 if used < self.limit else used
        if len(self._counts) > _MAX_BUCKETS:
            self._counts.popitem(last=False)
        return used < self.limit


def _top_k(body: dict[str, Any], config: RetrievalConfig) -> int:
    value = body.get("top_k", config.top_k)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= config.max_top_k:
        raise BadRequest(f"top_k must be an integer from 1 to {config.max_top_k}", param="top_k")
    return value


def _rate_limited(state: GatewayState, refusal: Overloaded, wait_s: float) -> Response:
    """The 429 the gateway's handler would answer for ``refusal``, with the bucket's own wait as
    ``Retry-After``: the handler's fixed "1" sent a client that obeys it (against ``rate_per_s = 0.1``,
    a 10 s wait) back to be refused again and again."""
    response = error_response(refusal)
    response.headers["retry-after"] = str(math.ceil(wait_s))  # whole seconds, as the header takes
    state.metrics.errors.labels(code=error_shape(refusal).code).inc()  # counted as the handler counts
    return response


class RetrievalRoutes:
    """The route factories for ``create_app(extra_routes=...)``: ``search`` (rollout key) and
    ``tool_requests`` (admin key). Not picklable (the tantivy index it holds is not): a process
    serving the routes opens its own index and builds its own ``RetrievalRoutes``."""

    def __init__(
        self, index: RetrievalIndex, config: RetrievalConfig, *, clock: Callable[[], float] | None = None
    ):
        self.index = index
        self.config = config
        self.limit = RateLimit(config.rate_per_s, config.burst, clock or time.monotonic)
        self.budget = SearchBudget(config.max_searches_per_rollout)

    def factories(self) -> list[Callable[..., BaseRoute]]:
        return [self.search_route, self.log_route]

    def search_route(self, store: Any, admin_key: str, engine: Any) -> BaseRoute:
        return Route("/rollouts/{rollout_id}/search", self.search, methods=["POST"])

    def log_route(self, store: Any, admin_key: str, engine: Any) -> BaseRoute:
        return Route("/api/rollouts/{rollout_id}/tool_requests", self.tool_requests, methods=["GET"])

    async def search(self, request: Request) -> Response:
        state: GatewayState = request.app.state.gateway
        started = now()
        rollout = await authorize_rollout(request, state, request.path_params["rollout_id"])
        if rollout.status in TERMINAL_STATUSES:
            raise RolloutClosed(
                f"rollout {rollout.rollout_id!r} is {rollout.status.value}; it takes no more searches"
            )
        wait = self.limit.take(rollout.rollout_id)
        if wait > 0:
            refusal = Overloaded(
                f"more than {self.config.rate_per_s:g} searches a second (burst {self.config.burst}) "
                f"from rollout {rollout.rollout_id!r}; retry in {wait:.2f} s"
            )
            return _rate_limited(state, refusal, wait)
        cfg = self.config
        raw = await read_body(request, cfg.max_query_chars * _BYTES_PER_CHAR + _BODY_SLACK)
        body = parse_json(raw)
        if not isinstance(body, dict):
            raise BadRequest('the body must be a JSON object {"query": "..."}')
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            raise BadRequest("query must be a non-empty string", param="query")
        if len(query) > cfg.max_query_chars:
            raise PayloadTooLarge(
                f"query of {len(query)} characters exceeds retrieval.max_query_chars ({cfg.max_query_chars})"
            )
        k = _top_k(body, cfg)
        await self._spend_one(state, rollout.rollout_id, rollout.attempt)
        hits = await anyio.to_thread.run_sync(
            lambda: self.index.search(query, k, max_terms=cfg.max_query_terms)
        )
        passages = [
            {
                "id": h.id,
                # The title is cut too: a FlashRAG ``contents`` without a newline is all title, and a
                # corpus's title may be any length; uncut, one search returned a 40,000-character one.
                "title": h.title[: cfg.max_passage_chars],
                "text": h.text[: cfg.max_passage_chars],
                "score": round(h.score, 4),
            }
            for h in hits
        ]
        answer = {"query": query, "passages": passages}
        record = ToolRequest(
            rollout_id=rollout.rollout_id,
            attempt=rollout.attempt,
            tool="search",
            request={"query": query, "top_k": k},
            response={"passages": passages},
            started_at=started,
            finished_at=now(),
        )
        try:  # durable before the answer; refused if the rollout ended while this one searched
            await state.in_thread(state.store.add_tool_request, record)
        except RolloutEnded:
            raise RolloutClosed(f"rollout {rollout.rollout_id!r} ended; it takes no more searches") from None
        return JSONResponse(answer)

    async def _spend_one(self, state: GatewayState, rollout_id: str, attempt: int) -> None:
        """Count one search of this attempt, or ``SearchesSpent`` past the budget."""
        key = (rollout_id, attempt)
        if not self.budget.knows(key):
            # Counted, not read: reading every search (passages and all, ~25 KB each) to count them
            # cost MBs, and one damaged row made every later search of the attempt a 409.
            stored = await state.in_thread(lambda: state.store.count_tool_requests(rollout_id, attempt=attempt))
            self.budget.seed(key, stored)
        if not self.budget.take(key):
            limit = self.config.max_searches_per_rollout
            raise SearchesSpent(
                f"rollout {rollout_id!r} made its {limit} searches (retrieval.max_searches_per_rollout); "
                "it takes no more: answer with what you found"
            )

    async def tool_requests(self, request: Request) -> Response:
        state: GatewayState = request.app.state.gateway
        require_admin(request, state)
        rollout_id = request.path_params["rollout_id"]
        attempt_text = request.query_params.get("attempt")
        attempt = None
        if attempt_text is not None:
            if not _ATTEMPT.fullmatch(attempt_text):
                raise BadRequest("attempt must be a non-negative integer", param="attempt")
            attempt = int(attempt_text)
        # 404 for an unknown rollout; one whose own row is damaged still has its requests served
        # (rows of their own), as ``/api/rollouts/{id}/calls`` serves its calls.
        with contextlib.suppress(RolloutUnreadable):
            await state.in_thread(state.store.get_rollout, rollout_id)
        rows = await state.in_thread(lambda: state.store.list_tool_requests(rollout_id, attempt=attempt))
        return JSONResponse([r.model_dump(mode="json") for r in rows])
