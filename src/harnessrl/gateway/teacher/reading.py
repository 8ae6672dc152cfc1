"""Reading a teacher upstream's answer within bounds: a whole body or an event stream's lines, each
cut at ``gateway.max_body_bytes`` (an upstream that sends without end is an upstream error, never
the gateway's memory), and lone UTF-16 surrogates in parsed JSON made U+FFFD (``without_surrogates``).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx

from harnessrl.errors import UpstreamError

#: An upstream answer is read up to ``gateway.max_body_bytes`` (the ``limit`` of ``read_bounded``
#: and ``bounded_lines``): a whole answer's body, or one line of a stream (a native Responses
#: stream's last event holds the whole answer again). Past it the call is an upstream error,
#: unrecorded: an upstream that sent without end (a line never ended, a body never closed) grew the
#: gateway's memory until the process died, with every rollout it served. The harness's next call
#: carries the answer in its body, which the same limit bounds (413), so a longer answer could not be
#: continued anyway; a fixed 64 MiB, held (and copied while parsed) per call at once whatever that
#: limit said, let a few hundred calls to a misbehaving upstream take tens of GB.
#: A stream in all is read up to ``STREAM_ANSWERS`` times the limit, and never less than
#: ``MIN_STREAM_BYTES`` (its events repeat their JSON around every delta: a long reasoning answer's
#: stream is tens of MB); that is a count of what passed, not memory held.
STREAM_ANSWERS = 4
MIN_STREAM_BYTES = 256 * 1024 * 1024

#: Where an SSE line ends: CRLF, LF or CR.
LINE_END = re.compile("\r\n|\r|\n")


#: A UTF-16 surrogate on its own in a parsed string (JSON's ``"\\ud83d"`` without its pair).
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_surrogates(value: Any) -> Any:
    """``value`` (parsed JSON) with each lone UTF-16 surrogate in its strings as U+FFFD.

    JSON may escape half a pair (an upstream that cut a string inside an emoji); Python parses it
    into a string no UTF-8 can encode. The gateway could not write such an answer to the harness:
    a whole one was a 500 after it had been recorded (the harness retried: another recorded call it
    never got), a translated stream was cut without its error event."""
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [without_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {without_surrogates(k): without_surrogates(v) for k, v in value.items()}
    return value


async def read_bounded(reply: httpx.Response, limit: int) -> bytes:
    """``reply``'s whole body, or ``UpstreamError`` once it is over ``limit`` bytes."""
    pieces: list[bytes] = []
    size = 0
    async for piece in reply.aiter_bytes():
        size += len(piece)
        if size > limit:
            raise UpstreamError(f"teacher upstream's answer is over {limit} bytes")
        pieces.append(piece)
    return b"".join(pieces)


async def bounded_lines(reply: httpx.Response, limit: int) -> AsyncIterator[str]:
    """The lines of ``reply``'s event stream (UTF-8, as SSE is; ended by CRLF, LF or CR), as
    ``httpx.Response.aiter_lines`` gives them, with ``UpstreamError`` for a line over ``limit``
    bytes or a stream over ``stream_bytes(limit)``."""
    most = stream_bytes(limit)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    line: list[str] = []  # the line being read, in pieces (joined once: a long line is not quadratic)
    size = total = 0
    held = ""  # a CR that ended a piece: a LF beginning the next one belongs to it
    async for data in reply.aiter_bytes():
        total += len(data)
        if total > most:
            raise UpstreamError(f"teacher upstream's stream is over {most} bytes")
        text = held + decoder.decode(data)
        held = "\r" if text.endswith("\r") else ""
        pieces = LINE_END.split(text[:-1] if held else text)
        for piece in pieces[:-1]:
            line.append(piece)
            yield "".join(line)
            line, size = [], 0
        line.append(pieces[-1])
        size += len(pieces[-1])
        if size > limit:
            raise UpstreamError(f"teacher upstream sent a line over {limit} bytes")
    pieces = LINE_END.split(held + decoder.decode(b"", final=True))
    for piece in pieces[:-1]:
        line.append(piece)
        yield "".join(line)
        line = []
    if rest := "".join([*line, pieces[-1]]):
        yield rest


def stream_bytes(limit: int) -> int:
    """The most of one stream read in all, for answers of at most ``limit`` bytes."""
    return max(MIN_STREAM_BYTES, STREAM_ANSWERS * limit)
