"""Answers the connection writes itself, before or instead of the app: a request head that came too
late (408) or too large (431), and a connection over the cap (503).

No route is known yet (or ever), so they are in OpenAI's error shape, the gateway's default.
"""

from __future__ import annotations

from typing import Any

import orjson


def openai_error(message: str, kind: str, code: str) -> bytes:
    """An OpenAI-shaped error body."""
    return orjson.dumps({"error": {"message": message, "type": kind, "code": code, "param": None}})


def raw_response(status: bytes, payload: bytes) -> bytes:
    """A whole HTTP/1.1 response with a JSON ``payload`` that closes the connection."""
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(payload)).encode() + b"\r\nconnection: close\r\n\r\n"
    ) + payload


def too_many_connections(limit: int) -> Any:
    """The ASGI app a connection over the cap gets instead of the gateway: a 503 that closes it."""
    payload = openai_error(
        f"the gateway has {limit} connections open, all busy; retry",
        "rate_limit_error",
        "too_many_connections",
    )

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"retry-after", b"1"),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return refuse
