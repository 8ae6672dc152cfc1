"""Server-sent events from an inference server, parsed a network read at a time: JSON and ``data:`` lines.

Pure parsing, no I/O: :func:`harnessrl.engines.remote.HttpUpstream.stream_sse` feeds each piece of
the body to :class:`SseLines` as it arrives and parses the ``data:`` payloads found with
:func:`parse_events`. A streaming server sends one event per sampled token and a read of the socket
often holds many of them, so the work is done per read in C-level passes (one ``split``, one list
comprehension over the lines, ``orjson`` per payload in one more), not line by line in Python with an
``async`` hop per event: those cost more than the JSON itself.

What is accepted and refused is exactly what a line-by-line parse does: lines end in ``\\n`` (or
``\\r\\n``: the payload is stripped), lines other than ``data:`` ones (comments, ``event:``, blank
separators) are skipped, ``data: [DONE]`` ends the stream and nothing after it is parsed, and a
payload that is not JSON is an error raised after the events before it (:class:`BadEvent`).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

DONE = b"[DONE]"


def loads(data: bytes | str) -> Any:
    """JSON from a server. orjson is strict JSON and ~10x faster than ``json`` on the token lists
    these servers send; what it refuses (``NaN``, integers past 64 bits) gets the lenient parser."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


class BadEvent(ValueError):
    """A ``data:`` payload is not JSON. ``parsed``: the events of the same read before it, which a
    line-by-line reader would have handed on before failing; ``payload``: the bad one."""

    def __init__(self, payload: bytes, parsed: list[Any]):
        super().__init__(f"bad stream event {payload[:120]!r}")
        self.payload = payload
        self.parsed = parsed


class SseLines:
    """The ``data:`` payloads of a body fed piece by piece; an incomplete last line waits for the next."""

    __slots__ = ("_buffer", "done")

    def __init__(self) -> None:
        self._buffer = b""
        self.done = False  # ``data: [DONE]`` was seen: the payloads after it are not events

    def feed(self, piece: bytes) -> list[bytes]:
        """The payloads of the lines ``piece`` completes, up to ``[DONE]`` (none once it was seen)."""
        if self.done:
            return []
        text = self._buffer + piece if self._buffer else piece
        cut = text.rfind(b"\n")
        if cut < 0:
            self._buffer = text
            return []
        self._buffer = text[cut + 1 :]
        payloads = [line[5:].strip() for line in text[:cut].split(b"\n") if line[:5] == b"data:"]
        if DONE in payloads:
            self.done = True
            del payloads[payloads.index(DONE) :]
        return payloads

    def finish(self) -> bool:
        """At the body's end: whether the stream was complete (a last ``[DONE]`` line may lack its
        newline)."""
        if not self.done and self._buffer.strip() == b"data: " + DONE:
            self.done = True
        return self.done


def parse_events(payloads: list[bytes]) -> list[Any]:
    """The payloads as JSON values (orjson; the lenient parser for what it refuses), or
    :class:`BadEvent` at the first one neither reads, carrying those before it."""
    try:
        return [orjson.loads(payload) for payload in payloads]
    except orjson.JSONDecodeError:
        pass
    parsed: list[Any] = []
    for payload in payloads:
        try:
            parsed.append(loads(payload))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadEvent(payload, parsed) from exc
    return parsed
