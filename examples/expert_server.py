"""The OpenAI-compatible chat.completions server the examples' scripted experts are served by.

An expert is a function from a conversation (the request's ``messages``) to one assistant message
(``{"role": "assistant", "content": ..., "tool_calls"?: [...]}``); this module serves it as an
OpenAI-compatible server does, so the gateway's teacher mode (docs/gateway.md, ``[engine.teacher]``)
can point at it exactly as at a real provider. Used by ``examples/assistant/expert.py`` (Hermes
Agent's tool calls) and ``examples/search_agent/expert.py`` (mini-swe-agent's text actions).

Serves ``GET /v1/models`` (the gateway probes it at start) and ``POST /v1/chat/completions``, whole or
streamed (``stream: true``: role chunk, content or tool-call deltas, finish chunk, usage chunk when
``stream_options.include_usage``, ``[DONE]``). Sampling fields (temperature, max_tokens...) are read
and ignored: an expert answers the same way every time. A request without a non-empty list of
message objects gets a 400 in OpenAI's error shape; an expert that raises on a conversation, a 500
in that shape (``server_error``).
"""

from __future__ import annotations

import argparse
import json
import secrets
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

Answer = Callable[[list[dict[str, Any]]], dict[str, Any]]


def text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a list."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _usage(message: dict[str, Any]) -> dict[str, int]:
    # No tokenizer here: a rough count (characters / 4) so clients that read usage get numbers.
    size = len(json.dumps(message)) // 4
    return {"prompt_tokens": 0, "completion_tokens": size, "total_tokens": size}


def _chunks(message: dict[str, Any], head: dict[str, Any]) -> list[dict[str, Any]]:
    """The streamed deltas of ``message``: role, then the text or each tool call (its arguments in
    two pieces, as real servers split them), then the finish reason."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        half = len(arguments) // 2
        first = {"index": index, "id": call["id"], "type": "function"}
        deltas.append({"tool_calls": [{**first, "function": {"name": name, "arguments": arguments[:half]}}]})
        deltas.append({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]})
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    out = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    out.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return out


def _error(message: str, status: int) -> JSONResponse:
    """An error in OpenAI's shape: 400 ``invalid_request_error``, or 500 ``server_error``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
    try:
        body = await request.json()
        messages = body["messages"] if isinstance(body, dict) else None
    except (ValueError, KeyError):
        messages = None
    # An expert reads each message as an object: anything else is the request's fault (400), not a
    # crash inside the expert answered with a plain-text 500.
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return _error("expected a chat completion request with a non-empty list of message objects", 400)
    if not isinstance(body.get("stream_options") or {}, dict):
        return _error("stream_options must be an object", 400)
    try:
        message = request.app.state.answer(messages)
    except Exception as exc:  # the expert cannot answer this conversation: say so in the provider's shape
        return _error(f"the expert failed on this conversation: {type(exc).__name__}: {exc}", 500)
    head = {
        "id": f"chatcmpl-{secrets.token_hex(8)}",
        "created": int(time.time()),
        "model": body.get("model", request.app.state.model),
    }
    if not body.get("stream"):
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return JSONResponse(
            {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(message)}
        )
    with_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    async def events() -> AsyncIterator[str]:
        for chunk in _chunks(message, {**head, "object": "chat.completion.chunk"}):
            yield f"data: {json.dumps(chunk)}\n\n"
        if with_usage:
            usage = {**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage(message)}
            yield f"data: {json.dumps(usage)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def models(request: Request) -> JSONResponse:
    model = request.app.state.model
    return JSONResponse(
        {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "harnessrl"}]}
    )


def create_server(answer: Answer, model: str) -> Starlette:
    """The server: ``answer`` maps a request's messages to the assistant message it answers with."""
    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ]
    )
    app.state.answer, app.state.model = answer, model
    return app


def serve(app: Starlette, name: str, description: str, default_port: int = 8765) -> None:
    """``--port N`` (0: a free one), on 127.0.0.1 only, until Ctrl-C; prints ``NAME: serving URL``."""
    import uvicorn

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, default=default_port, help="0: a free port (the URL is printed)")
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))  # loopback only: the gateway is its one client
    print(f"{name}: serving http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True, file=sys.stdout)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])
