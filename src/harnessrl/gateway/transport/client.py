"""``ClientSide``: a connection's client as the routes see it (``delivery.ClientConnection``).

Routes learn when the client leaves (FIN, half-close, RST) through ``watch`` instead of polling
``receive``, wait for a slow reader within a rate (``wait_writable``), and see how much of an answer
its TCP has not acknowledged yet (``unsent_bytes``, ``ack_delay_bytes``). One per connection, made
by ``GatewayProtocol`` and handed to every request's scope; the protocol tells it when the
connection is lost (``lost``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from harnessrl.gateway.transport.heads import ack_delay_bytes, unacknowledged_bytes

if TYPE_CHECKING:
    from harnessrl.gateway.transport.protocol import GatewayProtocol

log = logging.getLogger("harnessrl.gateway")


class ClientSide:
    """The client of ``protocol``'s connection, as a route may ask about it."""

    def __init__(self, protocol: GatewayProtocol) -> None:
        self._protocol = protocol
        self._watchers: set[Callable[[], None]] = set()
        self._lost = False

    def lost(self) -> None:
        """The connection is gone: tell every watcher, once."""
        self._lost = True
        watchers, self._watchers = self._watchers, set()
        for callback in watchers:
            try:
                callback()
            except Exception:  # noqa: BLE001 - one watcher's failure must not skip the others
                log.exception("a client-gone watcher failed")

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` once when the client's connection is lost (FIN, half-close, RST, cut);
        at once (soon) if it already is. Returns the function that stops watching."""
        transport = self._protocol.transport
        if self._lost or transport is None or transport.is_closing():
            handle = self._protocol.loop.call_soon(callback)
            return handle.cancel
        self._watchers.add(callback)
        return lambda: self._watchers.discard(callback)

    async def wait_writable(self, window_s: float, min_bytes_per_s: float) -> bool:
        """Wait until the socket takes more bytes (uvicorn's write flow control); ``False`` when the
        client takes the waiting bytes slower than ``min_bytes_per_s``, measured over ``window_s``."""
        protocol = self._protocol
        while protocol.flow.write_paused and not self._lost:
            before = protocol.transport.get_write_buffer_size()
            try:
                await asyncio.wait_for(protocol.flow.drain(), window_s)
            except TimeoutError:
                if before - protocol.transport.get_write_buffer_size() < min_bytes_per_s * window_s:
                    return False
        return True

    def unsent_bytes(self) -> int:
        """Bytes of the answer not yet acknowledged by the client's TCP: the transport's buffer plus
        the kernel's send queue (Linux)."""
        transport = self._protocol.transport
        if transport is None or self._lost:
            return 0
        sock = transport.get_extra_info("socket")
        queued = unacknowledged_bytes(sock.fileno()) if sock is not None else 0
        return transport.get_write_buffer_size() + queued

    def ack_delay_bytes(self) -> int:
        """Of ``unsent_bytes``, what a delayed ACK may hold (``heads.ack_delay_bytes``; 0 if buffered)."""
        transport = self._protocol.transport
        if transport is None or self._lost or transport.get_write_buffer_size():
            return 0
        sock = transport.get_extra_info("socket")
        return ack_delay_bytes(sock) if sock is not None else 0

    def cut(self) -> None:
        """Drop the connection now, without flushing what is buffered (a reader too slow to wait for)."""
        transport = self._protocol.transport
        if transport is not None:
            transport.abort()
