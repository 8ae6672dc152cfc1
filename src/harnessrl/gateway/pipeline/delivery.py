"""A call is training data only if its harness received it: the two drivers every model call runs in.

A call ends without reaching its harness in three ways, and then it is **dropped**: its generation
is cancelled at the engine (the engine iterator is closed, which aborts a remote request), nothing
is recorded, and it is counted by reason (``harnessrl_calls_dropped_total{api,reason}``, the
rollout's ``metadata.dropped_calls``, the trainer's ``trajectory/calls_dropped/*``):

- ``client_gone``: the client's connection is gone (FIN, half-close, RST — an SDK's read timeout
  closes it), streamed or not, while the call waits at a paused gateway, generates, or waits for
  its client to take the answer;
- ``slow_reader``: a streaming client takes its answer slower than ``gateway.slow_reader_bytes_per_s``
  (``coalesce.Outlet``); its connection is cut;
- ``rollout_ended``: the rollout was finished or cancelled (or its attempt requeued) meanwhile.
  The gateway cancels the calls it is answering for that rollout as soon as it hears of the end
  (this process's store object, ``Store.watch_rollout_ends``); a call whose end it did not hear
  of (another process finished the rollout) is refused by the store when it comes to be recorded
  (``RolloutEnded``). The client, if still there, gets 409 ``rollout_closed`` (an error event in a
  stream). Cancelling rather than letting the finish wait: a rollout ends when its harness has
  exited (its calls' clients are gone already) or when the run gives up on it; either way nobody
  will build on the answer, and waiting would only hold the finish and an engine slot.
- ``gateway_lapsed``: this gateway's lease lapsed while the call generated (a stalled process:
  ``control.heartbeat``'s fence), so a pause may have counted the gateways drained without it and
  the weights may have changed under the answer. Found when it comes to be recorded; the client
  gets a 502 (an error event in a stream) and retries.
- ``gateway_stopping``: the gateway began to shut down (SIGTERM) while the call waited at the pause
  gate (``GatewayState.stop``): it would otherwise wait out uvicorn's graceful timeout and then be
  cut. The client gets a 503 ``gateway_stopping`` at once (an error event in a stream) and retries.
  Calls already generating are not touched: they finish and are recorded as the shutdown waits.

``respond_whole`` drives a non-streaming call and ``CallStream`` a streaming one: each runs the
call inside a cancel scope that any of the reasons cancels (``PreparedCall.cancel``), and
learns that the client left from the connection itself (``ClientConnection.watch``: uvicorn tells
the protocol the moment the socket closes) rather than from a task polling ``receive``.

**The window between record and final event.** A call is recorded before its answer's last part
is sent (so a SIGKILL never loses an answered call): a non-streaming answer is one write right
after the commit; a stream is recorded only once every earlier event has left the gateway and its
client's TCP has acknowledged all but ``coalesce.RECORD_SLACK_BYTES`` (16 KiB) of them (or all were
sent and a delayed ACK may hold the rest: ``coalesce.Outlet.settle``), and its final
event follows the commit. A client that leaves inside that window leaves a recorded call; the
window is the commit (about a millisecond) plus, for a stream, at most 16 KiB and the final event
of reading, which a client not cut as a slow reader does in 16 s at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Literal, Protocol

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from harnessrl.errors import HarnessRLError
from harnessrl.gateway.pipeline.coalesce import ClientTooSlow, Outlet

if TYPE_CHECKING:
    from harnessrl.gateway.pipeline.calls import PreparedCall

log = logging.getLogger("harnessrl.gateway")

#: The ASGI scope key under which ``GatewayProtocol`` hands routes the client's connection.
CONNECTION_KEY = "harnessrl.connection"

#: ``store.base.DROP_REASONS`` (and ``gateway_stopping``, which the store counts as any other)
DropReason = Literal["client_gone", "slow_reader", "rollout_ended", "gateway_lapsed", "gateway_stopping"]

#: The status a dropped non-streaming call "answers": nobody is there to read it (nginx's 499).
CLIENT_GONE_STATUS = 499


class ClientConnection(Protocol):
    """What a route may ask of its client's connection (``connections.GatewayProtocol``)."""

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` once when the connection is lost; returns the function that stops it."""

    async def wait_writable(self, window_s: float, min_bytes_per_s: float) -> bool:
        """Wait until the socket takes more; ``False`` for a client slower than the rate."""

    def unsent_bytes(self) -> int:
        """Bytes written that the client's TCP has not acknowledged yet."""

    def ack_delay_bytes(self) -> int:
        """How many of those a healthy client's TCP may be holding its ACK of (a delayed ACK)."""

    def cut(self) -> None:
        """Drop the connection without flushing."""


def watch_client(
    scope: Scope, receive: Receive, on_gone: Callable[[], None]
) -> tuple[ClientConnection | None, Callable[[], None]]:
    """Call ``on_gone()`` if the client leaves, until the returned function is called; and the
    client's connection.

    Under ``GatewayProtocol`` the connection itself tells (no task). Served otherwise (an app driven
    in-process by a test), a task waits for ASGI's ``http.disconnect``; then the connection is
    ``None``.
    """
    connection: ClientConnection | None = scope.get(CONNECTION_KEY)
    if connection is not None:
        return connection, connection.watch(on_gone)

    async def listen() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        on_gone()

    return None, asyncio.ensure_future(listen()).cancel


@contextlib.asynccontextmanager
async def watching_client(
    scope: Scope, receive: Receive, on_gone: Callable[[], None]
) -> AsyncIterator[ClientConnection | None]:
    """``watch_client`` while the block runs; yields the client's connection."""
    connection, stop = watch_client(scope, receive, on_gone)
    try:
        yield connection
    finally:
        stop()


class CallsInFlight:
    """The model calls one gateway is answering, by rollout, so a rollout's end cancels its calls."""

    def __init__(self) -> None:
        self._by_rollout: dict[str, set[PreparedCall]] = {}

    def add(self, call: PreparedCall) -> None:
        self._by_rollout.setdefault(call.rollout.rollout_id, set()).add(call)

    def discard(self, call: PreparedCall) -> None:
        calls = self._by_rollout.get(call.rollout.rollout_id)
        if calls is not None:
            calls.discard(call)
            if not calls:
                del self._by_rollout[call.rollout.rollout_id]

    def stop_held(self) -> int:
        """Drop every call waiting at the pause gate (``gateway_stopping``); returns how many."""
        held = [call for calls in self._by_rollout.values() for call in calls if call.held]
        for call in held:
            call.cancel("gateway_stopping")
        return len(held)

    def end_rollout(self, rollout_id: str) -> int:
        """Cancel every call of ``rollout_id`` in flight here (``rollout_ended``); returns how many."""
        calls = list(self._by_rollout.get(rollout_id, ()))
        for call in calls:
            call.cancel("rollout_ended")
        return len(calls)

    def __len__(self) -> int:
        return sum(len(calls) for calls in self._by_rollout.values())


async def respond_whole(
    call: PreparedCall, request: Request, work: Callable[[], Awaitable[Response]]
) -> Response:
    """Drive a non-streaming call: ``work`` waits at the gate, generates, builds the answer and
    records the call; a drop cancels it wherever it is (``client_gone``: a 499 nobody reads;
    ``rollout_ended``: 409 ``rollout_closed``; ``gateway_stopping``: 503)."""
    answer: Response | None = None
    try:
        with anyio.CancelScope() as cancel:
            call.attach(cancel)
            _, stop = watch_client(request.scope, request.receive, lambda: call.cancel("client_gone"))
            try:
                answer = await work()
            finally:
                stop()
    finally:
        call.finish()
    if answer is None:
        error = await call.drop_error()
        if error is not None:
            raise error
        return Response(status_code=CLIENT_GONE_STATUS)
    add_headers(answer, call.headers())  # with the call's seq, known once it is recorded
    return answer


def add_headers(response: Response, headers: Mapping[str, str]) -> None:
    """``response.headers.update(headers)``: appended to its raw headers where it has none of those
    names yet (an answer has its content type and length only), without a ``MutableHeaders``."""
    raw = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    present = {name for name, _ in response.raw_headers}
    if present.isdisjoint(name for name, _ in raw):
        response.raw_headers.extend(raw)
    else:
        response.headers.update(headers)


class CallStream(Response):
    """Drive a streaming call: ``events(outlet)`` (``streaming.sse_events``) pushes its events, already in
    the provider's shape, into an ``Outlet``; a drop cancels the call and ends the stream
    (``rollout_ended``, ``gateway_stopping``: ``closing(exc)``, the provider's error event, is sent
    first; ``slow_reader``: the connection is cut)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        call: PreparedCall,
        events: Callable[[Outlet], Awaitable[None]],
        *,
        closing: Callable[[HarnessRLError], str],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)  # no body: no content-length
        self.call = call
        self.events = events
        self.closing = closing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call, config = self.call, self.call.state.config
        connection: ClientConnection | None = None
        outlet: Outlet | None = None
        try:
            with anyio.CancelScope() as cancel:
                call.attach(cancel)
                connection, stop = watch_client(scope, receive, lambda: call.cancel("client_gone"))
                try:
                    await send(
                        {
                            "type": "http.response.start",
                            "status": self.status_code,
                            "headers": self.raw_headers,
                        }
                    )
                    outlet = Outlet(
                        send,
                        connection,
                        buffer_bytes=config.stream_buffer_bytes,
                        min_bytes_per_s=config.slow_reader_bytes_per_s,
                        window_s=config.slow_reader_window_s,
                        on_slow=lambda: call.cancel("slow_reader"),
                        recorded=lambda: call.committed,
                    )
                    call.outlet = outlet
                    try:
                        await self.events(outlet)  # the engine's stream is closed when this returns
                        await outlet.close()
                    except ClientTooSlow:
                        pass  # ``on_slow`` dropped the call (or it was recorded: only the end is lost)
                finally:
                    stop()
        finally:
            if outlet is not None:
                outlet.abandon()
            call.finish()
        if outlet is not None and outlet.gave_up and connection is not None:
            connection.cut()
        elif call.stored is None and cancel.cancelled_caught and (error := await call.drop_error()):
            # The harness may still be there (the run cancelled its rollout, the gateway is stopping):
            # tell it, if it reads. Only when the drop cut the events short: a rollout ended where
            # this gateway did not hear it is refused by the store at record time, and the events
            # end with that error.
            body = self.closing(error).encode()
            with anyio.move_on_after(config.slow_reader_window_s):
                await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
