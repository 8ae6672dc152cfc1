"""A streamed call, for every API: its events from the gate to the record, pushed into its ``Outlet``.

The answer's opening, keep-alives at the gate, the events of each sampled piece, the record, the
tail; an error as the API's error event. The events go straight into the stream's ``Outlet``
(``coalesce``), whose writer sends whatever has gathered each time it runs: tokens that arrive
together (one read from the engine) leave in one write. Nothing between the engine and the outlet
is a generator of its own and no event is awaited on its own: the per-token path is the engine's
iterator, the API's ``feed`` and a list append (an await only when the buffer is full).

Each token stays its own event. Merging the tokens of one engine read into one chunk (tried: 3x
fewer bytes, less rendering) moved the end of a 256-token answer under one loopback segment, whose
ACK the client's kernel delays (~40 ms), and the record waits for that ACK (``Outlet.settle``):
p50 14 -> 86 ms in ``benchmarks/gateway_before_after.py``. It needs ``settle`` to allow for a
delayed ACK first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import anyio

from harnessrl.errors import HarnessRLError
from harnessrl.gateway.errors import error_shape, internal_error
from harnessrl.gateway.pipeline.answer import Answer
from harnessrl.gateway.pipeline.calls import PreparedCall
from harnessrl.gateway.pipeline.coalesce import Outlet
from harnessrl.gateway.pipeline.generation import Piece

log = logging.getLogger("harnessrl.gateway")


async def sse_events(call: PreparedCall, answer: Answer, outlet: Outlet) -> None:
    """Stream ``call`` into ``outlet`` (``delivery.CallStream`` runs this under the call's drops).

    The record follows every earlier event (``PreparedCall.record`` waits for the outlet to settle)
    and precedes the tail; a failure after the 200 ends the stream with the API's error event.
    """
    try:
        if outlet.push_all(answer.opening()):
            await outlet.wait_room()
        async for comment in call.admit(keepalive=True):
            if outlet.push_all(answer.waiting(comment)):
                await outlet.wait_room()
        gen = call.start()
        if outlet.push_all(answer.started(gen)):
            await outlet.wait_room()
        pieces = gen.pieces()
        try:
            if answer.ping is None:
                feed, push = answer.feed, outlet.push_all
                async for piece in pieces:
                    events = feed(piece)
                    if events and push(events):
                        await outlet.wait_room()  # the client is behind: the generation waits
            else:
                await _with_pings(call, answer, pieces, outlet, answer.ping)
        finally:
            # Close the engine's iterator even when the call is being cancelled (a drop); shielded
            # so the close itself is not cancelled (it frees the engine slot).
            with anyio.CancelScope(shield=True):
                await pieces.aclose()  # type: ignore[attr-defined]
        last, response, finish, tail = answer.finished(gen)
        outlet.push_all(last)
        await call.record(response, finish)  # durable before the client sees the end of the answer
        outlet.push_all(tail)
    except Exception as exc:
        outlet.push_all([answer.error(stream_error(call, exc))])


async def _with_pings(
    call: PreparedCall, answer: Answer, pieces: AsyncIterator[Piece], outlet: Outlet, ping: str
) -> None:
    """The pieces' events, and ``ping`` whenever tokens arrive but make no event for ``keepalive_s``."""
    keepalive = call.state.keepalive_s
    last_sent = time.monotonic()
    async for piece in pieces:
        events = answer.feed(piece)
        if events:
            full = outlet.push_all(events)
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent >= keepalive:
            full = outlet.push_all([ping])
            last_sent = time.monotonic()
        else:
            continue
        if full:
            await outlet.wait_room()


def stream_error(call: PreparedCall, exc: Exception) -> HarnessRLError:
    """The error a failed stream ends with, as an event in the provider's shape (its 200 is sent).

    Ours as it is; anything else is logged once, with its traceback, and becomes an internal error
    (its class named, its message not leaked). Every stream builds what it sends after the record
    before recording, so a stream that fails was never recorded as answered.
    """
    if not isinstance(exc, HarnessRLError):
        log.error(
            "unexpected error in a %s stream of rollout %s", call.api, call.rollout.rollout_id, exc_info=exc
        )
        exc = internal_error(exc)
    call.state.metrics.errors.labels(code=error_shape(exc).code).inc()
    return exc
