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
``NaN`` and ``Infinity`` are not JSON and are refused like any other bad payload: a logprob the server
could not compute must fail the call, not be recorded.

Bounds. A line is looked for only in the piece that just arrived (the pieces of a line not yet ended
are kept in a list and joined once, when it ends), so a long line fed in many pieces costs its length,
not its length times its pieces; and a line may hold at most ``MAX_LINE_BYTES`` (64 MiB, far past the
largest event a server sends: SGLang's cumulative stream repeats every token so far, ~40 bytes each,
so ~5 MB at 128 k tokens), past which :class:`LineTooLong` is raised rather than the gateway's memory
filled by a server that never ends its line.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

DONE = b"[DONE]"


#: The longest line (one event) a stream may send; see the module's docstring.
MAX_LINE_BYTES = 64 * 1024 * 1024


def _refuse_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


def loads(data: bytes | str) -> Any:
    """JSON from a server. orjson is strict JSON and ~10x faster than ``json`` on the token lists
    these servers send; what it refuses that is still JSON (a lone surrogate escape, ``"\\ud800"``)
    gets ``json``. ``NaN`` and ``Infinity``, which ``json`` would take, are refused by both
    (``json.JSONDecodeError``)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data, parse_constant=_refuse_constant)


class BadEvent(ValueError):
    """A ``data:`` payload is not JSON. ``parsed``: the events of the same read before it, which a
    line-by-line reader would have handed on before failing; ``payload``: the bad one."""

    def __init__(self, payload: bytes, parsed: list[Any]):
        super().__init__(f"bad stream event {payload[:120]!r}")
        self.payload = payload
        self.parsed = parsed


class LineTooLong(ValueError):
    """A stream's line (one event) grew past the most a line may hold (``SseLines.max_line_bytes``)."""


class SseLines:
    """The ``data:`` payloads of a body fed piece by piece; an incomplete last line waits for the next."""

    __slots__ = ("_pending", "_pending_bytes", "done", "max_line_bytes")

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        # The pieces of the line not yet ended, joined only when it ends: joining on every piece would
        # copy a long line once per piece (quadratic).
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.max_line_bytes = max_line_bytes
        self.done = False  # ``data: [DONE]`` was seen: the payloads after it are not events

    def feed(self, piece: bytes) -> list[bytes]:
        """The payloads of the lines ``piece`` completes, up to ``[DONE]`` (none once it was seen).
        :class:`LineTooLong` once the line not yet ended holds more than ``max_line_bytes``."""
        if self.done:
            return []
        cut = piece.rfind(b"\n")  # only the new piece: the pending ones hold no newline
        if cut < 0:
            if piece:
                self._pending.append(piece)
                self._pending_bytes += len(piece)
                if self._pending_bytes > self.max_line_bytes:
                    raise LineTooLong(f"a stream line grew past {self.max_line_bytes} bytes without ending")
            return []
        if self._pending:
            self._pending.append(piece)
            text = b"".join(self._pending)
            cut += len(text) - len(piece)
        else:
            text = piece
        rest = text[cut + 1 :]
        self._pending = [rest] if rest else []
        self._pending_bytes = len(rest)
        if self._pending_bytes > self.max_line_bytes:
            raise LineTooLong(f"a stream line grew past {self.max_line_bytes} bytes without ending")
        payloads = [line[5:].strip() for line in text[:cut].split(b"\n") if line[:5] == b"data:"]
        if DONE in payloads:
            self.done = True
            del payloads[payloads.index(DONE) :]
        return payloads

    def finish(self) -> bool:
        """At the body's end: whether the stream was complete (a last ``[DONE]`` line may lack its
        newline)."""
        last = b"".join(self._pending).strip()
        if not self.done and last[:5] == b"data:" and last[5:].strip() == DONE:  # as ``feed`` reads it
            self.done = True
        return self.done


def parse_events(payloads: list[bytes]) -> list[Any]:
    """The payloads as JSON values (orjson; ``json`` for what only it reads, ``loads``), or
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
