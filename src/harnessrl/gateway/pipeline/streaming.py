"""A streamed call, for every API: its events from the gate to the record, pushed into its ``Outlet``.

The answer's opening, keep-alives at the gate, the events of each sampled piece, the record, the
tail; an error as the API's error event. The events go straight into the stream's ``Outlet``
(``coalesce``), whose writer sends whatever has gathered each time it runs: tokens that arrive
together (one read from the engine) leave in one write. The engine passes a read's tokens as one
batch (``Samples``) and the generation their pieces as one list, which the API takes at once
(``Answer.feed_all``: chat holds a batch's texts and logprob entries in a few C-level passes; the
others feed piece by piece): no ``async`` step per token (an await only per batch, and when the
buffer is full).

An answer may hold back what a piece adds (``Answer.held``: chat's content) instead of rendering an
event per token: the outlet's writer asks for the held events right before it writes, i.e. once the
tokens of one engine read were all fed, so they leave as one event (a chat chunk with their text and
one logprob entry per token). ``Outlet.settle`` allows for the client's delayed ACK of such a short
stream's last write (without that, p50 14 -> 86 ms when this was first tried).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from harnessrl.errors import HarnessRLError
from harnessrl.gateway.errors import error_shape, internal_error
from harnessrl.gateway.pipeline.answer import Answer
from harnessrl.gateway.pipeline.calls import PreparedCall
from harnessrl.gateway.pipeline.coalesce import Outlet
from harnessrl.gateway.pipeline.generation import Piece, close_stream

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
        batches = gen.batches()
        outlet.hold(answer.held)
        try:
            if answer.ping is None:
                feed_all, push, wake = answer.feed_all, outlet.push_all, outlet.wake
                async for pieces in batches:
                    events = feed_all(pieces)
                    full = push(events) if events else False
                    wake()  # it may hold pieces back: the writer takes them before writing
                    if full:
                        await outlet.wait_room()  # the client is behind: the generation waits
            else:
                await _with_pings(call, answer, batches, outlet, answer.ping)
        finally:
            # Close the engine's iterator even when the call is being cancelled (a drop); shielded
            # so the close itself is not cancelled (it frees the engine slot).
            await close_stream(batches)
        last, response, finish, tail = answer.finished(gen)
        outlet.push_all(last)
        await call.record(response, finish)  # durable before the client sees the end of the answer
        outlet.push_all(tail)
    except Exception as exc:
        try:
            held = answer.held()  # what was fed before the failure, as it would have been sent
        except Exception:  # what failed may be what renders them: the error alone
            held = []
        outlet.push_all([*held, answer.error(stream_error(call, exc))])


async def _with_pings(
    call: PreparedCall, answer: Answer, batches: AsyncIterator[list[Piece]], outlet: Outlet, ping: str
) -> None:
    """The pieces' events, and ``ping`` whenever tokens arrive but nothing was sent for ``keepalive_s``
    (neither events ``feed`` returned nor ones the writer took from ``held``)."""
    keepalive = call.state.keepalive_s
    last_sent = time.monotonic()
    async for pieces in batches:
        full = False
        for piece in pieces:
            events = answer.feed(piece)
            if events:
                full = outlet.push_all(events) or full
                last_sent = time.monotonic()
        if not full:
            outlet.wake()  # it may hold the pieces' events back: the writer takes them (``held``)
            if time.monotonic() - max(last_sent, outlet.wrote_at) < keepalive:
                continue
            full = outlet.push_all(answer.held() or [ping])  # a ping only when nothing is to be sent
            last_sent = time.monotonic()
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
