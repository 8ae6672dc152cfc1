"""``create_app``: the gateway's ASGI app (starlette), its routes, and the lifespan owning the engine.

Model API (rollout key): ``/rollouts/{rollout_id}/v1/...`` and, attributed by the key alone,
``/v1/...``. Control API (admin key): ``/api/...`` and ``/metrics``; ``/api/health`` is open.
Every error leaves through ``gateway.errors`` in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route

from harnessrl.config import GatewayConfig
from harnessrl.engines.base import Engine
from harnessrl.errors import ConfigError
from harnessrl.gateway.apis import anthropic
from harnessrl.gateway.apis.chat import chat_completions
from harnessrl.gateway.apis.completions import completions, list_models, retrieve_model
from harnessrl.gateway.apis.responses import responses
from harnessrl.gateway.control import api as control
from harnessrl.gateway.errors import EXCEPTION_HANDLERS, UnexpectedErrors
from harnessrl.gateway.fast_lane import FastLane
from harnessrl.gateway.key_limits import PerKeyLimit
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.teacher import Teacher
from harnessrl.store.base import Store

log = logging.getLogger("harnessrl.gateway")

#: Builds a route the app serves beside its own from the gateway's store, admin key and engine
#: (``harnessrl.dashboard.gateway_dashboard``: the ``/ui`` mount). Whoever composes the gateway
#: (the CLI, ``controller.stack.local_stack``) passes these in, so the gateway imports no web UI.
RouteFactory = Callable[[Store, str, Engine], BaseRoute]


#: The model API's POST routes, under ``/rollouts/{rollout_id}/v1`` and ``/v1``: every model call takes
#: one (``fast_lane.FastLane`` answers them without starlette's router; the routes stay declared).
MODEL_POSTS = {
    "/chat/completions": chat_completions,
    "/completions": completions,
    "/responses": responses,
    "/messages": anthropic.messages,
    "/messages/count_tokens": anthropic.count_tokens,
}


def _model_routes(prefix: str) -> list[Route]:
    return [
        *(Route(f"{prefix}{path}", handler, methods=["POST"]) for path, handler in MODEL_POSTS.items()),
        Route(f"{prefix}/models", list_models, methods=["GET"]),
        # ``:path``: a model name may hold a slash (``Qwen/Qwen3-8B``; the SDK sends it as %2F).
        Route(f"{prefix}/models/{{model_id:path}}", retrieve_model, methods=["GET"]),
        Route(prefix, anthropic.probe, methods=["HEAD"]),
    ]


class GatewayApp(Starlette):
    """The gateway's ASGI app, carrying its ``GatewayState`` (``gateway``; the handlers reach it as
    ``request.app.state.gateway``), so whoever serves it reads its connection settings from it."""

    def __init__(self, gateway: GatewayState, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gateway = gateway
        self.state.gateway = gateway


def create_app(
    config: GatewayConfig,
    store: Store,
    engine: Engine,
    *,
    keepalive_s: float = 10.0,
    shared_store: bool = False,
    extra_routes: Sequence[RouteFactory] = (),
    teacher: Teacher | None = None,
) -> GatewayApp:
    """The gateway app. The caller owns ``store`` (and closes it); the app starts and closes ``engine``.

    ``keepalive_s``: seconds between SSE keep-alive comments to streaming calls held by a pause.
    ``shared_store``: other gateway processes use ``store`` too though it is a file (``--workers``);
    a server store (PostgreSQL) is taken as shared anyway (``gateway.control.cluster``).
    ``extra_routes``: more routes to serve, each built from ``(store, admin_key, engine)``.
    ``teacher``: teacher mode, chat calls answered by this upstream (``gateway.teacher``); the app
    checks it answers at start and closes it.
    """
    if not config.admin_key:
        raise ConfigError(
            "gateway.admin_key is required (set HARNESSRL_ADMIN_KEY or let run_gateway make one)"
        )
    state = GatewayState(
        config=config, store=store, engine=engine, keepalive_s=keepalive_s, shared_store=shared_store
    )
    state.teacher = teacher
    cluster = state.cluster
    cluster.heartbeat.url = config.public_url or ""  # its gateway_id names the host and process

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await engine.start()
        if teacher is not None:
            await teacher.start()  # an unreachable upstream is a ConfigError naming engine.teacher
        loop = state.loop = asyncio.get_running_loop()

        def rollout_ended(rollout_id: str) -> None:  # on the thread that ended it (the store's writer)
            loop.call_soon_threadsafe(state.calls.end_rollout, rollout_id)

        # The calls still generating for a rollout that ends (finished, cancelled, requeued through
        # this store object: the control API, an in-process controller) are dropped at once.
        stop_watching = store.watch_rollout_ends(rollout_ended)
        # The gate's state before the first call: a gateway (re)started during a pause comes up paused.
        await cluster.start()
        state.ready = True
        log.info("gateway ready: model %s, policy version %d", engine.model_name, engine.policy_version)
        try:
            yield
        finally:
            stop_watching()
            state.ready = False
            await cluster.stop()  # leaves the gateways: no pause waits for this one any more
            state.gate.resume()  # let anything still held run into the shutdown instead of hanging
            await engine.aclose()
            if teacher is not None:
                await teacher.aclose()
            await anyio.to_thread.run_sync(state.writer.close)  # write what is queued
            await state.drops_written()

    routes = [
        *_model_routes("/rollouts/{rollout_id}/v1"),
        *_model_routes("/v1"),
        Route("/", anthropic.probe, methods=["HEAD"]),
        Route("/rollouts/{rollout_id}", anthropic.probe, methods=["HEAD"]),
        Route("/api/health", control.health, methods=["GET"]),
        Route("/api/rollouts", control.create_rollout, methods=["POST"]),
        Route("/api/rollouts", control.list_rollouts, methods=["GET"]),
        Route("/api/rollouts/{rollout_id}", control.get_rollout, methods=["GET"]),
        Route("/api/rollouts/{rollout_id}/calls", control.list_calls, methods=["GET"]),
        Route("/api/rollouts/{rollout_id}/finish", control.finish_rollout, methods=["POST"]),
        Route("/api/rollouts/{rollout_id}/cancel", control.cancel_rollout, methods=["POST"]),
        Route("/api/pause", control.pause, methods=["POST"]),
        Route("/api/resume", control.resume, methods=["POST"]),
        Route("/api/state", control.get_state, methods=["GET"]),
        Route("/metrics", control.metrics, methods=["GET"]),
        *(build(store, config.admin_key, engine) for build in extra_routes),
    ]
    return GatewayApp(
        state,
        routes=routes,
        exception_handlers=EXCEPTION_HANDLERS,
        # Outermost first: unexpected errors become a 500 inside uvicorn's view of a normal answer.
        middleware=[
            Middleware(UnexpectedErrors),
            Middleware(
                PerKeyLimit,
                limit=config.max_requests_per_key,
                # The labelled counter appears in /metrics only once a request was refused.
                on_refused=lambda: state.metrics.errors.labels(code="overloaded").inc(),
            ),
            Middleware(FastLane, routes=MODEL_POSTS),  # innermost: inside both of the above
        ],
        lifespan=lifespan,
    )
