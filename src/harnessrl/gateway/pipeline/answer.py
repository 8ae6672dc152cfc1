"""What a provider API renders for the pipeline: one call's answer, whole or as server-sent events.

The pipeline (``driver``, ``streaming``) drives every call the same way and asks the call's
``Answer`` for its shapes at each step; an event is ``str`` or, on the per-token path, already
encoded ``bytes`` (a pre-encoded template filled in, not a dict encoded again per token).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol, TypeVar

from starlette.responses import Response

from harnessrl.errors import HarnessRLError
from harnessrl.gateway.pipeline.generation import Generation, Piece

#: One server-sent event, text or already UTF-8 (``coalesce.Outlet`` takes both).
Event = str | bytes

#: An API's own event type (``str`` for most; chat's per-token path makes ``bytes``).
AnyEvent = TypeVar("AnyEvent", bound=Event)

#: Most pieces (or events) an answer holds back for ``held``: while the client is behind, the writer
#: does not ask for them (``coalesce.Outlet.hold``), so ``feed`` returns them itself past this many
#: (and the outlet's buffer bound applies to them).
HOLD_AT_MOST = 256


class Streamed(NamedTuple):
    """How a stream ends: events that complete its content (sent before the record), the recorded
    response and finish reason, and the events sent after the record (built before it)."""

    last: list[Event]
    response: dict[str, Any]
    finish_reason: str
    tail: list[Event]


class Whole(NamedTuple):
    """A whole answer: the client's reply (built before the record), the recorded response and
    finish reason."""

    reply: Response
    response: dict[str, Any]
    finish_reason: str


def feed_each(feed: Callable[[Piece], list[AnyEvent]], pieces: Iterable[Piece]) -> list[AnyEvent]:
    """``feed`` of each piece in turn, their events joined: ``Answer.feed_all`` piece by piece."""
    events: list[AnyEvent] = []
    for piece in pieces:
        events += feed(piece)
    return events


class Answer(Protocol):
    """One call's answer in its API's shape, whole or as server-sent events."""

    #: Headers of the answer besides the call's own (``PreparedCall.headers``).
    headers: dict[str, str]
    #: Sent when tokens arrive but make no event for ``keepalive_s`` (a tool call held back until
    #: it closes); ``None``: never.
    ping: str | None
    #: Whether a whole answer is built from the generation's pieces (else from its final text).
    whole_from_pieces: bool

    def opening(self) -> list[Event]:
        """Events sent before the call waits at the gate."""

    def waiting(self, comment: str) -> list[Event]:
        """What is sent for each keep-alive ``comment`` while the call waits at a paused gate."""

    def started(self, gen: Generation) -> list[Event]:
        """Events sent once the generation starts."""

    def feed(self, piece: Piece) -> list[Event]:
        """The events one sampled piece completes (what it may hold back is ``held``'s)."""

    def feed_all(self, pieces: list[Piece]) -> list[Event]:
        """The events of an engine batch's pieces: exactly those of ``feed`` of each in turn
        (``feed_each``), where an API has a faster way to take a batch."""

    def held(self) -> list[Event]:
        """The events of what ``feed`` held back, taken (the stream's writer asks right before it
        writes, so the tokens of one engine read become one event); ``finished`` and ``feed``'s own
        next events include them first. ``[]`` for an answer that holds nothing back."""

    def finished(self, gen: Generation) -> Streamed:
        """The end of a stream (after every piece was fed)."""

    def whole(self, gen: Generation) -> Whole:
        """The whole answer of a finished generation."""

    def error(self, exc: HarnessRLError) -> str:
        """``exc`` as the event that ends a stream (its 200 was sent)."""
