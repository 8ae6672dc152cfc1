"""The pause gate: hold new model calls while the policy is updated, without the harness noticing.

Every model call takes a ``Ticket`` before it generates. While the gate is open a ticket is
admitted at once (counted in flight); while paused it waits in a FIFO queue. ``pause`` closes the
gate and waits until the calls already in flight have finished (drained) or a timeout passes;
``resume`` admits every waiting ticket in arrival order, in one step, so a quick re-pause cannot
reorder them. ``close`` + ``drain`` are the two halves of ``pause`` for callers that must close the
gate synchronously and then wait; ``on_quiet`` is called each time the last call in flight ends while
closed (``gateway.control.cluster`` acks the pause then). Everything runs on the event loop: no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable


class Ticket:
    """One model call's place at the gate. ``release`` exactly once when the call ends (idempotent)."""

    def __init__(self, gate: PauseGate) -> None:
        self._gate = gate
        self._admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._released = False

    @property
    def admitted(self) -> bool:
        return self._admitted.done()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait to be admitted; ``False`` if ``timeout`` passed first (the ticket keeps its place)."""
        if self._admitted.done():
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._admitted), timeout)
        except TimeoutError:
            return False
        return True

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._admitted.done():
            self._gate._finished()
        else:
            self._gate._abandon(self)
            self._admitted.cancel()


class PauseGate:
    def __init__(self) -> None:
        self.paused = False
        self.in_flight = 0
        self._queue: deque[Ticket] = deque()
        self._idle = asyncio.Event()
        self._idle.set()
        self._reopened = asyncio.Event()  # set while open; lets a drain end early on resume
        self._reopened.set()
        self.on_quiet: Callable[[], None] = lambda: None

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def join(self) -> Ticket:
        """A ticket for one call: admitted now if the gate is open, else queued."""
        ticket = Ticket(self)
        if self.paused:
            self._queue.append(ticket)
        else:
            self._admit(ticket)
        return ticket

    async def pause(self, timeout: float) -> bool:
        """Close the gate; return whether in-flight calls drained within ``timeout`` seconds."""
        self.close()
        return await self.drain(timeout)

    def close(self) -> None:
        """Close the gate now (synchronously, so no other request can slip in between)."""
        self.paused = True
        self._reopened.clear()

    async def drain(self, timeout: float) -> bool:
        """Wait until no call is in flight: ``True`` once drained while closed; ``False`` after
        ``timeout`` seconds, or as soon as a ``resume`` reopened the gate (the drain is moot then)."""
        if self._idle.is_set() or not self.paused:
            return self._idle.is_set() and self.paused
        idle = asyncio.ensure_future(self._idle.wait())
        reopened = asyncio.ensure_future(self._reopened.wait())
        try:
            done, _ = await asyncio.wait({idle, reopened}, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            idle.cancel()
            reopened.cancel()
        return idle in done and self.paused

    def resume(self) -> int:
        """Open the gate and admit every waiting call in arrival order; returns how many."""
        self.paused = False
        self._reopened.set()
        released = 0
        while self._queue:
            self._admit(self._queue.popleft())
            released += 1
        return released

    def _admit(self, ticket: Ticket) -> None:
        self.in_flight += 1
        self._idle.clear()
        ticket._admitted.set_result(None)

    def _finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()
            if self.paused:
                self.on_quiet()

    def _abandon(self, ticket: Ticket) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(ticket)
