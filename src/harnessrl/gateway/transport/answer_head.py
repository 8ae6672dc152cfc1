"""``HeldHead``: an answer's head and the start of its body leave in one write.

uvicorn writes a response's status line and headers when the app sends ``http.response.start`` and
its body when the app sends ``http.response.body``: two writes, two system calls, and two wake-ups
of the client's reader, where one would do. A whole (non-streamed) answer's body follows its head
in the same step of the request's task (starlette's ``Response`` sends one right after the other),
so the head is held until that next write and leaves with it.

Nothing waits on the hold: the head is sent at the latest by a callback the event loop runs once
the task yields (``call_soon``), so a streamed answer whose first event comes later has its head
sent as before, one loop iteration later at most. Every later write of the request goes straight
to the transport, after the held head.
"""

from __future__ import annotations

import asyncio


class HeldHead:
    """The transport as one request's cycle (``RequestResponseCycle``) writes to it: its first
    write (the answer's head) is held until its next one, or until the event loop's next round."""

    __slots__ = ("_transport", "_loop", "_held", "_flush", "_first")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        if self._first:
            self._first = False
            self._held = data
            self._flush = self._loop.call_soon(self.flush)
            return
        held = self._held
        if held is None:
            self._transport.write(data)
            return
        self._held = None
        self._flush.cancel()  # type: ignore[union-attr]
        self._transport.writelines((held, data))  # one system call for both

    def flush(self) -> None:
        """Send the held head now (if the connection is still open)."""
        held, self._held = self._held, None
        if held is not None:
            if self._flush is not None:
                self._flush.cancel()
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()
