"""``CoalescingStreamingResponse``: chunks ready together go out in one write, a lone chunk at once,
the bytes are the same, and a failed send stops the body iterator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harnessrl.gateway.coalesce import CoalescingStreamingResponse


def bodies(messages: list[dict[str, Any]]) -> list[bytes]:
    assert messages[0]["type"] == "http.response.start"
    assert messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    return [m["body"] for m in messages[1:-1]]


def test_chunks_ready_together_are_sent_in_one_write() -> None:
    events = [f"data: {i}\n\n" for i in range(256)]

    async def body() -> AsyncIterator[str]:
        for event in events:
            yield event  # never waits: all of them are ready at once

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(CoalescingStreamingResponse(body()).stream_response(send))
    assert bodies(sent) == ["".join(events).encode()]


def test_a_lone_chunk_is_sent_before_the_next_one_is_made() -> None:
    async def main() -> list[bytes]:
        sent: list[dict[str, Any]] = []
        next_token = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message.get("body") == b"first":
                next_token.set()  # the engine "samples" the next token only once this one is out

        async def body() -> AsyncIterator[bytes]:
            yield b"first"
            await asyncio.wait_for(next_token.wait(), timeout=5)
            yield b"second"
            yield b"third"

        await CoalescingStreamingResponse(body()).stream_response(send)
        return bodies(sent)

    assert asyncio.run(main()) == [b"first", b"secondthird"]


def test_a_failed_send_stops_the_body_and_is_raised() -> None:
    made = 0

    async def body() -> AsyncIterator[str]:
        nonlocal made
        while True:  # endless: only the failed send can end it
            made += 1
            yield "x"
            await asyncio.sleep(0)

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            raise OSError("client went away")

    with pytest.raises(OSError, match="client went away"):
        asyncio.run(CoalescingStreamingResponse(body()).stream_response(send))
    assert made < 10
