"""JSON and server-sent events as every provider API writes them.

orjson: the answers carry hundreds of logprob entries, and ``json.dumps`` costs a large share of a
call's CPU at that size; a stream writes one event per delta, so the event helpers are on the
per-token path too.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from starlette.responses import Response

#: Headers of every streamed answer: no cache, and no buffering by a proxy in front of the gateway.
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

#: What ends an OpenAI-shaped stream (chat, completions).
DONE = "data: [DONE]\n\n"


def dumps(data: Any) -> bytes:
    try:
        return orjson.dumps(data)
    except TypeError:  # what orjson refuses (integers past 64 bits): the slower, lenient json
        return json.dumps(data, ensure_ascii=False).encode()


def sse(data: dict[str, Any]) -> str:
    """A ``data:`` event (OpenAI's streams)."""
    return "data: " + dumps(data).decode() + "\n\n"


def sse_event(payload: dict[str, Any]) -> str:
    """A named event, named by its ``type`` (Anthropic's and the Responses API's streams)."""
    return f"event: {payload['type']}\n" + sse(payload)


def json_response(payload: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    """A JSON answer (orjson: UTF-8, compact; what ``JSONResponse`` sends, several times faster)."""
    return Response(dumps(payload), media_type="application/json", headers=headers)
