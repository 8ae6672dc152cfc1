"""A stream read with an interval (``Stream.chunks(interval_s)``, ``gateway.stream_interval_s``).

Against ``RawServer`` (test_http_client's scripted asyncio server): the first piece comes at once,
what arrives within an interval comes as one batch, the end is never held back, a full read buffer
is not waited out, the events are the same whatever the interval, and a call cancelled while its
pieces gather closes its connection (which aborts the request server-side).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.engines.test_http_client import Request, json_answer, run, serve

from harnessrl.engines.remote import HttpUpstream

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(n: int) -> bytes:
    return chunk(b'data: {"n": %d}\n\n' % n)


END = chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def paced(count: int, gap_s: float, *, before_end_s: float = 0.0, big: int = 0) -> Any:
    """A handler streaming ``count`` events ``gap_s`` apart (and, with ``big``, one event of that many
    bytes after the first), then ``[DONE]`` after ``before_end_s`` more; it notes when it sent the end."""
    sent: dict[str, float] = {}

    async def handler(request: Request) -> bool:
        await request.body()
        request.writer.write(HEAD + event(0))
        await request.writer.drain()
        if big:
            request.writer.write(chunk(b'data: {"big": "%s"}\n\n' % (b"x" * big)))
            await request.writer.drain()
        for n in range(1, count):
            await asyncio.sleep(gap_s)
            request.writer.write(event(n))
            await request.writer.drain()
        await asyncio.sleep(before_end_s)
        sent["end"] = time.monotonic()
        request.writer.write(END)
        await request.writer.drain()
        return True

    handler.sent = sent  # type: ignore[attr-defined]
    return handler


async def read_batches(upstream: HttpUpstream, interval_s: float) -> tuple[list[list[Any]], list[float]]:
    """Every batch of one streamed call, and when each arrived."""
    batches, times = [], []
    async with upstream.stream_sse("/v1/completions", {}, interval_s=interval_s) as stream:
        async for batch in stream:
            batches.append(batch)
            times.append(time.monotonic())
    return batches, times


def test_first_piece_at_once_the_rest_gathered_the_end_not_held() -> None:
    async def go() -> tuple[list[list[Any]], list[list[Any]], float]:
        server, url = await serve(paced(10, 0.03))
        upstream = HttpUpstream(url)
        gathered, _ = await read_batches(upstream, 0.0)  # control: a batch per piece as it arrives
        began = time.monotonic()
        batches, _ = await read_batches(upstream, 30.0)
        took = time.monotonic() - began
        await upstream.aclose()
        server.close()
        return gathered, batches, took

    each, batches, took = run(go)
    events = [{"n": n} for n in range(10)]
    assert [e for b in each for e in b] == [e for b in batches for e in b] == events
    assert len(each) >= 5  # 30 ms apart: (nearly) one batch per piece without an interval
    assert batches == [[{"n": 0}], events[1:]]  # the first at once, the rest as one batch
    assert took < 10  # the end came after ~0.3 s and was not held for the 30 s interval


def test_batches_come_about_an_interval_apart() -> None:
    async def go() -> list[float]:
        server, url = await serve(paced(12, 0.05))
        upstream = HttpUpstream(url)
        batches, times = await read_batches(upstream, 0.2)
        await upstream.aclose()
        server.close()
        assert [e for b in batches for e in b] == [{"n": n} for n in range(12)]
        return times

    times = run(go)
    # 12 pieces over ~0.55 s: ~4 batches at 0.2 s intervals (not 12), none closer than the interval
    # but the last (the end is passed on as soon as it comes).
    assert 2 <= len(times) <= 6
    assert all(b - a >= 0.19 for a, b in zip(times[:-2], times[1:-1], strict=True))


def test_a_full_read_buffer_is_passed_on_before_the_interval_ends() -> None:
    async def go() -> tuple[list[float], float]:
        handler = paced(1, 0.0, before_end_s=2.0, big=400 * 1024)  # past the 256 KiB read buffer
        server, url = await serve(handler)
        upstream = HttpUpstream(url)
        batches, times = await read_batches(upstream, 30.0)
        await upstream.aclose()
        server.close()
        assert batches[0] == [{"n": 0}] and batches[1][0]["big"] == "x" * 400 * 1024
        return times, handler.sent["end"]

    times, end_sent = run(go)
    assert times[1] < end_sent  # the big event came while the stream was still open, not at its end


def test_a_call_cancelled_while_its_pieces_gather_closes_its_connection() -> None:
    cut = asyncio.Event()
    streaming = asyncio.Event()  # the first event is sent: the call is gathering pieces

    async def handler(request: Request) -> bool:
        await request.body()
        if request.connection > 1:  # after the cancelled call: a plain answer on a new connection
            request.writer.write(json_answer())
            await request.writer.drain()
            return True
        request.writer.write(HEAD + event(0))
        streaming.set()
        try:
            for n in range(1, 3000):  # 30 s of events unless the client hangs up
                await asyncio.sleep(0.01)
                request.writer.write(event(n))
                await request.writer.drain()
        except ConnectionError:
            cut.set()
        return False

    async def go() -> tuple[int, Any]:
        server, url = await serve(handler)
        upstream = HttpUpstream(url)
        task = asyncio.ensure_future(read_batches(upstream, 30.0))
        await asyncio.wait_for(streaming.wait(), 60)  # a wait for a state, not a timing
        await asyncio.sleep(0.1)  # the first batch is in; the rest gathers for 30 s
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.wait_for(cut.wait(), 25)  # the request is aborted server-side (before its 30 s end)
        again = await upstream.request_json("GET", "/v1/models")  # and the client goes on
        await upstream.aclose()
        server.close()
        return server.connections, again

    connections, again = run(go)
    assert connections == 2 and again == {"ok": True}


def test_pieces_further_apart_than_the_interval_set_no_timer() -> None:
    """At a real decode pace vLLM's events (16 tokens each) come further apart than the interval:
    each is passed on as it arrives, and no timer wakes the reader at the end of an interval in
    which nothing came (each was a wake-up from idle through the whole generation). The control,
    pieces 10 ms apart, gathers them with a timer per interval."""
    from harnessrl.engines import http_connection

    async def go(gap_s: float, count: int) -> tuple[list[list[Any]], int]:
        loop = asyncio.get_running_loop()
        call_at, timers = loop.call_at, []

        def counting(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
            if callback is http_connection._settle:
                timers.append(when)
            return call_at(when, callback, *args, **kwargs)

        loop.call_at = counting  # type: ignore[method-assign]
        server, url = await serve(paced(count, gap_s))
        upstream = HttpUpstream(url)
        batches, _ = await read_batches(upstream, 0.05)
        await upstream.aclose()
        server.close()
        return batches, len(timers)

    apart, apart_timers = run(lambda: go(0.15, 5))
    assert apart == [[{"n": n}] for n in range(5)]  # each as it came
    assert apart_timers == 0
    close, close_timers = run(lambda: go(0.01, 30))
    assert [e for b in close for e in b] == [{"n": n} for n in range(30)]
    assert len(close) < 30 and close_timers >= 2  # the control: gathered, a timer per interval
