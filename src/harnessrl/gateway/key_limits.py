"""A cap on the model requests one API key has in flight at once (``gateway.max_requests_per_key``).

A rollout is one agent: a handful of concurrent calls at most (parallel tool calls, subagents). A
buggy or hostile harness that opens hundreds at once with its key would otherwise take the gateway's
connections, threads and engine slots from every other rollout. Past the cap the request is
answered 429 ``overloaded`` with ``retry-after: 1`` in the provider's shape (the SDKs retry it)
before any work is done. Counted per key as sent (valid or not), from the request's arrival to its
answer's last byte, streams included: an ASGI middleware, because only there does a stream's end show.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harnessrl.errors import Overloaded
from harnessrl.gateway.auth import header_key
from harnessrl.gateway.errors import anthropic_error_response, error_response, is_anthropic_route

_MODEL_PREFIXES = ("/v1/", "/rollouts/")


class PerKeyLimit:
    """ASGI middleware: at most ``limit`` model requests in flight per API key; ``on_refused()`` is
    called for each request it answers 429 (the app counts it in its error metrics)."""

    def __init__(self, app: ASGIApp, limit: int, on_refused: Callable[[], None] = lambda: None) -> None:
        self.app = app
        self.limit = limit
        self.on_refused = on_refused
        self.in_flight: dict[bytes, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = None
        if scope["type"] == "http" and scope["path"].startswith(_MODEL_PREFIXES):
            key = header_key(scope["headers"])
        if key is None:
            await self.app(scope, receive, send)
            return
        count = self.in_flight.get(key, 0)
        if count >= self.limit:
            exc = Overloaded(
                f"this API key has {count} model requests in flight, the most the gateway serves at once "
                "for one key (gateway.max_requests_per_key); retry when one has finished"
            )
            self.on_refused()
            anthropic = is_anthropic_route(scope["path"])
            response = anthropic_error_response(exc) if anthropic else error_response(exc)
            await response(scope, receive, send)
            return
        self.in_flight[key] = count + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                left = self.in_flight[key] - 1
                if left:
                    self.in_flight[key] = left
                else:
                    del self.in_flight[key]

        async def send_releasing(message: Message) -> None:
            # Released as the answer's last byte goes out, not when the route returns a moment
            # later: a client that sends its next call as soon as it has the answer is not refused.
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                release()
            await send(message)

        try:
            await self.app(scope, receive, send_releasing)
        finally:
            release()
