"""``CoalescingStreamingResponse``: a stream's chunks that are ready together go out in one write.

A streamed answer is one SSE event per sampled token. Sent one by one, each event is an ASGI
``send`` through the middlewares and a socket write: at 256 tokens that was the largest share of a
streaming call's CPU in the gateway (``benchmarks/gateway_overhead.py``'s stream leg), more than
generating the events. Here the body iterator runs as before, in the request's own task, and only
the sending moves to a writer task, which sends whatever has accumulated each time it gets to run.
Tokens that arrive together (one network read from the engine, a burst after a pause) leave together;
a lone token is sent as soon as the iterator yields it, so nothing waits for company (no timer, no
added latency). The bytes the client receives are the same, only cut into fewer writes.

Nothing but the answer's length (``max_tokens``) bounds how far the iterator runs ahead of a slow
client: it pauses only at the engine, so one answer's events may wait in memory. A failed send
(the client left) stops the iterator at its next chunk and is raised as before, so ``starlette``
still turns it into ``ClientDisconnect``.
"""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse
from starlette.types import Send


class CoalescingStreamingResponse(StreamingResponse):
    """``StreamingResponse`` whose ready chunks are joined into one ``http.response.body`` message."""

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        pending: list[bytes] = []
        ready = asyncio.Event()
        closing = False

        async def write() -> None:
            while True:
                if not pending:
                    if closing:
                        return
                    await ready.wait()
                    ready.clear()
                    continue
                body = b"".join(pending)
                pending.clear()
                await send({"type": "http.response.body", "body": body, "more_body": True})

        writer = asyncio.ensure_future(write())
        # Mark a failure as seen even when another exception ends the stream first (no "Task
        # exception was never retrieved" in the log); it is raised below otherwise.
        writer.add_done_callback(lambda task: task.cancelled() or task.exception())
        try:
            async for chunk in self.body_iterator:
                if writer.done():
                    break  # the last send failed: raised by the await below
                pending.append(chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset))
                ready.set()
            closing = True
            ready.set()
            await writer
        finally:
            if not writer.done():
                writer.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
