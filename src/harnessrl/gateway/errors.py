"""The gateway's one error boundary: every failure leaves in the provider's error shape.

Anthropic Messages routes (``/v1/messages``...) answer ``{"type": "error", "error": {"type",
"message"}}`` with Anthropic's error types; every other route answers OpenAI's shape:

``{"error": {"message", "type", "code", "param"}}``. The status, ``type`` and ``code`` of each
``HarnessRLError`` class are in one table here (``ERROR_SHAPES``); the classes themselves carry no
HTTP status. Client mistakes are 4xx and carry ``x-should-retry: false`` so the OpenAI SDK (and
litellm, which wraps it) does not retry them; unexpected exceptions become a logged 500 in the
same shape (``UnexpectedErrors``, which keeps the keep-alive connection open). Streaming responses
that fail after their headers went out end with ``sse_error`` / ``anthropic_sse_error``.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harnessrl.errors import (
    BadRequest,
    ConfigError,
    Conflict,
    ContextLengthExceeded,
    Forbidden,
    GenerationAborted,
    HarnessRLError,
    InvalidGenerationRequest,
    InvalidTransition,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    UpstreamError,
)

log = logging.getLogger("harnessrl.gateway")

#: Seconds a client told to back off (429, 503, 529) should wait before retrying.
RETRY_AFTER_S = "1"


class RolloutClosed(Conflict):
    """A model call for a rollout that is finished, failed or cancelled."""


class GatewayLapsed(UpstreamError):
    """A call generated across a lapse of this gateway's lease (``control.heartbeat``'s fence):
    not recorded; the harness retries it (a 5xx)."""


class GatewayStopping(HarnessRLError):
    """A call held at the pause gate when the gateway began to shut down: answered at once, not
    generated, not recorded; the harness retries it (a 503) against whichever gateway serves next."""


class MethodNotAllowed(HarnessRLError):
    """A known route asked with a method it does not serve."""


class HTTPStatusError(BadRequest):
    """Starlette's own ``HTTPException`` with a 4xx status the table has no class for; keeps it."""

    def __init__(self, message: str, *, status: int):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ErrorShape:
    """How one error leaves the gateway: its HTTP status, OpenAI's ``type`` and the ``code``."""

    status: int
    type: str
    code: str


#: Each error class's status, ``type`` and ``code``. A class not listed answers as its nearest
#: listed base (its MRO), so a new subclass needs a row only when it should answer differently.
ERROR_SHAPES: dict[type[HarnessRLError], ErrorShape] = {
    HarnessRLError: ErrorShape(500, "server_error", "internal_error"),
    ConfigError: ErrorShape(500, "server_error", "bad_config"),
    BadRequest: ErrorShape(400, "invalid_request_error", "invalid_request"),
    ContextLengthExceeded: ErrorShape(400, "invalid_request_error", "context_length_exceeded"),
    PayloadTooLarge: ErrorShape(413, "invalid_request_error", "payload_too_large"),
    # The engine checks the prompt and max_tokens it is handed too (the embedded engine: empty,
    # outside the vocabulary); they came from the client's request, so 400 as a BadRequest would.
    InvalidGenerationRequest: ErrorShape(400, "invalid_request_error", "invalid_request"),
    Unauthorized: ErrorShape(401, "authentication_error", "invalid_api_key"),
    Forbidden: ErrorShape(403, "permission_error", "forbidden"),
    NotFound: ErrorShape(404, "not_found_error", "not_found"),
    MethodNotAllowed: ErrorShape(405, "invalid_request_error", "method_not_allowed"),
    Conflict: ErrorShape(409, "invalid_request_error", "conflict"),
    InvalidTransition: ErrorShape(409, "invalid_request_error", "invalid_transition"),
    RolloutClosed: ErrorShape(409, "invalid_request_error", "rollout_closed"),
    Overloaded: ErrorShape(429, "rate_limit_error", "overloaded"),
    UpstreamError: ErrorShape(502, "api_error", "upstream_error"),
    # The engine ended the generation itself (a pause with mode=abort before a weight update): 503
    # so the harness's SDK retries, and by then the gateway serves again.
    GenerationAborted: ErrorShape(503, "api_error", "engine_aborted"),
    GatewayStopping: ErrorShape(503, "api_error", "gateway_stopping"),
}


def error_shape(exc: HarnessRLError) -> ErrorShape:
    """The row of ``ERROR_SHAPES`` for ``exc``: its class's, or its nearest listed base's."""
    for cls in type(exc).__mro__:
        shape = ERROR_SHAPES.get(cls)  # type: ignore[call-overload]
        if shape is not None:
            if isinstance(exc, HTTPStatusError):
                return ErrorShape(exc.status, shape.type, shape.code)
            return shape
    raise TypeError(f"{type(exc).__name__} is not a HarnessRLError")


def error_body(exc: HarnessRLError) -> dict[str, Any]:
    """OpenAI's error object for ``exc``."""
    shape = error_shape(exc)
    return {
        "error": {
            "message": str(exc) or exc.__class__.__name__,
            "type": shape.type,
            "code": shape.code,
            "param": getattr(exc, "param", None),
        }
    }


def error_headers(status: int) -> dict[str, str]:
    # The SDKs retry 408/409/429/5xx by default; a 4xx here is the client's mistake or a closed
    # rollout, which retrying cannot fix. 429 (overload) is the one 4xx worth retrying.
    if 400 <= status < 500 and status != 429:
        return {"x-should-retry": "false"}
    if status in (429, 503, 529):
        # Some clients (Codex CLI) treat a 429 without Retry-After as fatal; tell them when to retry.
        return {"retry-after": RETRY_AFTER_S}
    return {}


def error_response(exc: HarnessRLError) -> JSONResponse:
    status = error_shape(exc).status
    return JSONResponse(error_body(exc), status_code=status, headers=error_headers(status))


# -- Anthropic's shape ------------------------------------------------------------------------------

_ANTHROPIC_ROUTE = re.compile(r"/v1/messages(/|$)")
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def is_anthropic_route(path: str) -> bool:
    return _ANTHROPIC_ROUTE.search(path) is not None


def anthropic_error_body(exc: HarnessRLError) -> dict[str, Any]:
    """Anthropic's error object for ``exc``; its ``type`` follows the HTTP status as Anthropic's does."""
    status = error_shape(exc).status
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": str(exc) or exc.__class__.__name__}}


def anthropic_error_response(exc: HarnessRLError) -> JSONResponse:
    status = error_shape(exc).status
    return JSONResponse(anthropic_error_body(exc), status_code=status, headers=error_headers(status))


def anthropic_sse_error(exc: HarnessRLError) -> str:
    """An ``error`` event inside an Anthropic stream whose 200 header is already sent."""
    return f"event: error\ndata: {json.dumps(anthropic_error_body(exc))}\n\n"


def _respond(request: Request, exc: HarnessRLError) -> JSONResponse:
    if is_anthropic_route(request.url.path):
        return anthropic_error_response(exc)
    return error_response(exc)


def sse_error(exc: HarnessRLError) -> str:
    """An error delivered inside an SSE stream whose 200 header is already sent (as the OpenAI SDK expects)."""
    return f"data: {json.dumps(error_body(exc))}\n\n"


def _count(request: Request, exc: HarnessRLError) -> None:
    # An app mounted in the gateway (the dashboard's /ui) raises into these handlers as request.app.
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is not None:
        gateway.metrics.errors.labels(code=error_shape(exc).code).inc()


async def handle_harnessrl_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HarnessRLError)
    _count(request, exc)
    status = error_shape(exc).status
    if status >= 500:
        log.warning("%s %s -> %d: %s", request.method, request.url.path, status, exc)
    return _respond(request, exc)


async def handle_http_exception(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own 404/405 (unknown route, wrong method) in the same shape."""
    assert isinstance(exc, HTTPException)
    mapped: HarnessRLError
    if exc.status_code == 404:
        mapped = NotFound(f"no route {request.method} {request.url.path}")
    elif exc.status_code == 405:
        mapped = MethodNotAllowed(f"method {request.method} not allowed on {request.url.path}")
    elif exc.status_code == 401:
        mapped = Unauthorized(exc.detail)
    elif exc.status_code == 403:
        mapped = Forbidden(exc.detail)
    elif exc.status_code == 413:
        mapped = PayloadTooLarge(exc.detail)
    else:
        mapped = HTTPStatusError(exc.detail, status=exc.status_code)
    return await handle_harnessrl_error(request, mapped)


def internal_error(exc: BaseException) -> HarnessRLError:
    """What the client is told about an unexpected exception: its class, not its message (internals
    are logged, not leaked)."""
    return HarnessRLError(f"internal error: {exc.__class__.__name__}")


async def handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    internal = internal_error(exc)
    _count(request, internal)
    return _respond(request, internal)


EXCEPTION_HANDLERS = {
    HarnessRLError: handle_harnessrl_error,
    HTTPException: handle_http_exception,
}


class UnexpectedErrors:
    """ASGI middleware: an unexpected exception becomes a logged 500 in the provider's shape.

    It sits inside starlette's ``ServerErrorMiddleware``, which answers a 500 too but then re-raises,
    and uvicorn closes the connection of any request whose app raised: the client's next request on
    that keep-alive connection was reset. Here the exception ends with the answer, so the connection
    stays usable. An exception after the response started (a stream) cannot be answered any more:
    it is logged and re-raised, and uvicorn closes the connection, the only way left to tell the
    client the body is incomplete (the streaming paths send an error event themselves first).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except Exception as exc:
            request = Request(scope)
            if started:
                log.error(
                    "unexpected error on %s %s after the response started",
                    request.method,
                    request.url.path,
                    exc_info=exc,
                )
                raise
            if isinstance(exc, ClientDisconnect):
                return  # the client left mid-request: there is no one to answer
            response = await handle_unexpected(request, exc)
            await response(scope, receive, send)
