"""The model calls' fast lane: their POST routes dispatched without starlette's router.

Every model call of every rollout is one of a few POST routes (``/rollouts/{id}/v1/chat/completions``,
``/v1/messages``...). Starlette reaches them through its exception middleware, its router (a match
against each route's pattern) and ``request_response`` (two more layers of wrapped ``send``): ~25 us
of a call's ~1.8 ms of gateway CPU, for an outcome this can give directly. This ASGI middleware sits
innermost in the app's own stack (inside ``UnexpectedErrors`` and ``PerKeyLimit``, which still wrap
every request) and answers exactly those routes as starlette would: the handler's response, or a
``HarnessRLError`` through the same handler (``errors.handle_harnessrl_error``) that starlette's
exception middleware calls; anything else propagates to ``UnexpectedErrors`` as before. Everything
else (other methods, ``GET /models``, the probes, the control API, the dashboard, a ``root_path``,
unknown paths and their 404/405) goes on to starlette.

The handlers' responses raise nothing once sent: JSON answers are bytes, and a stream's errors are
events inside it (``pipeline.sse_events``); so, unlike ``request_response``, the response is not wrapped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from harnessrl.errors import HarnessRLError
from harnessrl.gateway.errors import handle_harnessrl_error

Handler = Callable[[Request], Awaitable[Response]]

_ROLLOUT_PREFIX = "/rollouts/"


class FastLane:
    """``routes``: the route after ``/v1`` (``/chat/completions``) -> its POST handler, served under
    ``/rollouts/{rollout_id}/v1`` and ``/v1`` alike (as ``app._model_routes`` declares them)."""

    def __init__(self, app: ASGIApp, routes: Mapping[str, Handler]) -> None:
        self.app = app
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            handler, params = self._match(scope["path"])
        if handler is None:
            await self.app(scope, receive, send)
            return
        scope["path_params"] = params
        request = Request(scope, receive, send)
        try:
            response = await handler(request)
        except HarnessRLError as exc:
            response = await handle_harnessrl_error(request, exc)
            exc.__traceback__ = None  # as starlette does: a reused exception would gather tracebacks
        await response(scope, receive, send)

    def _match(self, path: str) -> tuple[Handler | None, dict[str, str]]:
        if path.startswith("/v1/"):
            return self.routes.get(path[3:]), {}
        if path.startswith(_ROLLOUT_PREFIX):
            end = path.find("/", len(_ROLLOUT_PREFIX))
            if end > len(_ROLLOUT_PREFIX) and path.startswith("/v1/", end):
                return self.routes.get(path[end + 3 :]), {"rollout_id": path[len(_ROLLOUT_PREFIX) : end]}
        return None, {}
