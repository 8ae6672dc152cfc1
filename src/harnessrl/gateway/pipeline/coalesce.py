"""``Outlet``: one streamed answer's way to its client — coalesced writes, a bounded buffer, slow readers.

A streamed answer is one SSE event per sampled token. Sent one by one, each event is an ASGI
``send`` through the middlewares and a socket write: at 256 tokens that was the largest share of a
streaming call's CPU in the gateway (``benchmarks/gateway_overhead.py``'s stream leg), more than
generating the events. The answer's events are produced in the request's own task and only the
sending is done by a writer task, which sends whatever has accumulated each time it gets to run.
Tokens that arrive together (one network read from the engine, a burst after a pause) leave together;
a lone token is sent as soon as it is put, so nothing waits for company (no timer, no added latency).
An answer may also hold back what its tokens add (``hold``, chat's content): the writer asks it for
the held events right before each write, so the tokens of one engine read become one event.

**Backpressure.** Events not yet handed to the socket wait in a buffer of at most ``buffer_bytes``
(``gateway.stream_buffer_bytes``); past it ``put`` waits until the writer takes them, so the
generation waits too (its next token is not read from the engine). What one stream holds in the
gateway is thus bounded by about twice ``buffer_bytes`` plus the transport's 64 KiB, whatever the
answer's length: it used to be the whole answer (~10 MB for 24 k tokens with logprobs).

**Slow readers.** While the socket is full the writer waits for the client; a client that takes the
waiting bytes slower than ``min_bytes_per_s`` over ``window_s`` (``gateway.slow_reader_bytes_per_s``
and ``slow_reader_window_s``) is given up on: ``on_slow`` is called (the call is dropped and the
connection cut). Not once the call is recorded (``recorded()``): what is left then (at most
``RECORD_SLACK_BYTES`` and the final event) is sent however slowly the client reads it, since cutting
it would leave a recorded call its client never got the end of.

**Before the final event** (``settle``): everything put so far has left the gateway, and the
client's TCP has acknowledged all but ``RECORD_SLACK_BYTES`` of it (Linux; elsewhere: left the
gateway), or all of it was sent and what is not acknowledged is no more than the client's TCP may
hold its ACK of (``ClientConnection.ack_delay_bytes``: two segments). A streamed call is recorded only
then, and its final event follows the commit, so a recorded call's client is at most that many bytes
plus the final event away from having it all.

Why the delayed ACK counts: a receiver may hold its ACK of less than two segments for ~40 ms (Linux
does between a request and its answer), and on loopback a segment is 32-64 KiB, so an answer whose
last write was 16-64 KiB waited ~40 ms to be recorded (p50 ~75 ms for a 256-token Messages or
Responses stream, ~45 KB). Those bytes were sent; on loopback they are in the client's kernel already.
On a real network two segments are ~3 KB, less than the slack.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from starlette.types import Send

if TYPE_CHECKING:
    from harnessrl.gateway.pipeline.delivery import ClientConnection

#: Bytes of an answer its client's TCP may not have acknowledged yet when the call is recorded: the
#: last events of a healthy stream are usually still unacknowledged (delayed ACKs), a few KiB.
RECORD_SLACK_BYTES = 16 * 1024

#: Longest pause between two looks at the kernel's send queue while a call waits to be recorded.
_SETTLE_POLL_S = 0.05


class ClientTooSlow(BaseException):  # noqa: N818 - it names what happened, like ``GeneratorExit``
    """Raised by ``put``/``settle`` once the client was given up on as too slow.

    A ``BaseException``: the APIs turn an ``Exception`` in a stream into an error event for the
    client, and this one has no client left to tell; the streaming driver catches it."""


class Outlet:
    """``put`` an answer's encoded events; a writer task sends them (see the module docstring).

    ``connection``: the client's connection (``delivery.ClientConnection``), or ``None`` when the app
    is served by something other than ``GatewayProtocol`` (then only the buffer bound applies).
    """

    def __init__(
        self,
        send: Send,
        connection: ClientConnection | None,
        *,
        buffer_bytes: int,
        min_bytes_per_s: float,
        window_s: float,
        on_slow: Callable[[], None],
        recorded: Callable[[], bool] = lambda: False,
    ) -> None:
        self._send = send
        self._connection = connection
        self._limit = buffer_bytes
        self._min_rate = min_bytes_per_s
        self._window_s = window_s
        self._on_slow = on_slow
        self._recorded = recorded
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._ready = asyncio.Event()  # something was put
        self._room = asyncio.Event()  # the buffer has room again
        self._room.set()
        self._idle = asyncio.Event()  # nothing pending and nothing being sent
        self._idle.set()
        self._closing = False
        self._held: Callable[[], Sequence[str | bytes]] | None = None
        self._woken = False  # ``wake`` was called since the writer last asked ``held``
        self.gave_up = False  # the client was too slow: ``on_slow`` was called
        self.wrote_at = 0.0  # ``time.monotonic()`` of the last write of events
        self._writer = asyncio.ensure_future(self._write())
        # Mark a failure as seen even when another exception ends the stream first (no "Task
        # exception was never retrieved" in the log); ``put``/``settle``/``close`` raise it.
        self._writer.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def put(self, chunk: bytes) -> None:
        """Queue ``chunk``; waits while the buffer is full (the client is behind)."""
        if self.push(chunk):
            await self.wait_room()

    def push(self, chunk: bytes) -> bool:
        """``put`` without the wait: queue ``chunk``; whether the buffer is full (then ``wait_room``
        before the next). A stream pushes one event per token: no coroutine per event."""
        self._check()
        self._pending.append(chunk)
        self._pending_bytes += len(chunk)
        self._idle.clear()
        self._ready.set()
        if self._pending_bytes >= self._limit:
            self._room.clear()
            return True
        return False

    def push_all(self, events: Sequence[str | bytes]) -> bool:
        """``push`` of several events at once (one per sampled piece, as the APIs make them; ``str``
        events are encoded here); whether the buffer is full. Nothing is queued for no events."""
        if not events:
            return False
        self._check()
        pending = self._pending
        size = 0
        for event in events:
            chunk = event.encode() if isinstance(event, str) else event
            pending.append(chunk)
            size += len(chunk)
        self._pending_bytes += size
        self._idle.clear()
        self._ready.set()
        if self._pending_bytes >= self._limit:
            self._room.clear()
            return True
        return False

    def hold(self, held: Callable[[], Sequence[str | bytes]]) -> None:
        """Before each write, ask ``held()`` for the events of what the producer holds back: what was
        fed since the last write (the tokens of one engine read) becomes one event, sent with the rest.
        The producer calls ``wake`` when it held something back, and takes back (and pushes) what it
        still holds before its own next event, so the events keep their order."""
        self._held = held

    def wake(self) -> None:
        """Something was held back (``hold``): the writer is to run once the producer yields. Called
        once per sampled token: only the first call after a write does anything."""
        if not self._woken:
            self._woken = True
            self._idle.clear()
            self._ready.set()

    async def wait_room(self) -> None:
        """Wait until the writer has taken the buffer (the client is behind until then)."""
        await self._room.wait()
        self._check()

    async def settle(self) -> None:
        """Wait until everything put has left the gateway and the client's TCP has acknowledged all
        but ``RECORD_SLACK_BYTES`` of it; a client slower than the rule meanwhile is given up on."""
        await self._idle.wait()
        self._check()
        if self._connection is None:
            return
        connection = self._connection
        unsent = connection.unsent_bytes()
        loop = asyncio.get_running_loop()
        since, unsent_then = loop.time(), unsent
        delay = 0.001
        while unsent > RECORD_SLACK_BYTES and unsent > connection.ack_delay_bytes():
            await asyncio.sleep(delay)  # the kernel tells no one when an ACK arrives: look again
            delay = min(2 * delay, _SETTLE_POLL_S)
            unsent = connection.unsent_bytes()
            if loop.time() - since >= self._window_s:
                if unsent_then - unsent < self._min_rate * self._window_s:
                    self._give_up()
                    self._check()
                since, unsent_then = loop.time(), unsent

    async def close(self) -> None:
        """Send what is left (the stream's end follows) and stop the writer."""
        self._closing = True
        self._ready.set()
        await self._writer

    def abandon(self) -> None:
        """Stop the writer without sending what is left (the call was dropped)."""
        if not self._writer.done():
            self._writer.cancel()

    def _give_up(self) -> None:
        if not self.gave_up:
            self.gave_up = True
            self._on_slow()

    def _check(self) -> None:
        if self.gave_up:
            raise ClientTooSlow
        if self._writer.done() and not self._writer.cancelled():
            exc = self._writer.exception()
            if exc is not None:
                raise exc

    async def _write(self) -> None:
        try:
            while True:
                if self._held is not None:
                    self._woken = False
                    for event in self._held():
                        chunk = event.encode() if isinstance(event, str) else event
                        self._pending.append(chunk)
                        self._pending_bytes += len(chunk)
                if not self._pending:
                    self._idle.set()
                    if self._closing:
                        return
                    await self._ready.wait()
                    self._ready.clear()
                    continue
                body = b"".join(self._pending)
                self._pending.clear()
                self._pending_bytes = 0
                self._room.set()
                connection = self._connection
                while connection is not None and not await connection.wait_writable(
                    self._window_s, 0.0 if self._recorded() else self._min_rate
                ):
                    if not self._recorded():  # (recorded meanwhile: wait on, as long as it takes)
                        self._give_up()
                        return
                await self._send({"type": "http.response.body", "body": body, "more_body": True})
                self.wrote_at = time.monotonic()
        finally:
            # Whatever ends the writer, nobody may wait for it any more.
            self._room.set()
            self._idle.set()
