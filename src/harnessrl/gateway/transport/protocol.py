"""``GatewayProtocol``: uvicorn's httptools protocol with, per connection (the package docstring says why):

- **header timeout**: the request line and headers must arrive within ``header_timeout_s`` of the
  connection opening (first request) or of the request's first byte (later ones); else a 408 and
  the connection is closed.
- **body timeout**: the whole body must arrive within ``body_timeout_s`` of the headers; else the
  connection is closed (the route sees the client leave). Time during which the gateway itself has
  paused reading (the route has not consumed what came) does not count.
- **keep-alive timeout**: an idle connection is closed after ``keepalive_timeout_s`` (75 s, as
  common proxies use), longer than clients keep theirs, so it is the client that closes it.
- **connection cap**: past ``max_connections`` open connections in the process, the connection idle
  longest is closed to make room, those that never sent a whole request first; if every connection
  is busy with a request, the new one's request is answered 503 (``Retry-After: 1``) and it is
  closed. Refused connections count against the cap until they close (at most 5 s).
- **request heads** (``transport.heads``): a head past ``max_header_bytes`` or with more than
  ``max_headers`` headers is answered 431 and the connection closed, without reading on (a 64 MiB
  header line used to be read whole, seconds of CPU); an ``Upgrade`` the gateway does not speak
  (``curl --http2``'s ``h2c``) is ignored, where the parser used to drop the request's body.
- **the client, as the app sees it** (``client.ClientSide``, ``delivery.ClientConnection``): routes learn when the client
  leaves (FIN, half-close, RST) through ``watch`` instead of polling ``receive``, wait for a slow
  reader within a rate (``wait_writable``), and see how much of an answer is not yet acknowledged.

Everything else (parsing, flow control, the ASGI cycle) is uvicorn's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, ClassVar, Literal

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from harnessrl.gateway.pipeline.delivery import CONNECTION_KEY
from harnessrl.gateway.transport.answer_head import HeldHead
from harnessrl.gateway.transport.client import ClientSide
from harnessrl.gateway.transport.heads import UnsupportedUpgrade, head_without_upgrade, new_parser
from harnessrl.gateway.transport.limits import ConnectionLimits
from harnessrl.gateway.transport.refusals import openai_error, raw_response, too_many_connections

log = logging.getLogger("harnessrl.gateway")

#: Seconds a connection refused by the cap has to send its request head (to be answered 503).
REFUSED_HEAD_TIMEOUT_S = 5.0

#: Where a connection is in its current request: ``new`` (nothing received yet), ``head`` (reading
#: the request line and headers), ``body``, ``app`` (the route is answering), ``idle`` (keep-alive),
#: ``refused`` (its head was too large: answered 431, closing, nothing more is read).
Phase = Literal["new", "head", "body", "app", "idle", "refused"]


class GatewayProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with read timeouts and a connection cap (see the module docstring).

    ``limits`` is set on a subclass per server (``protocol_class``).
    """

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.keepalive_timeout_s  # type: ignore[assignment]
        self.phase: Phase = "new"
        self.refused = False  # over the connection cap: its request is answered 503, then it closes
        self.last_active = time.monotonic()
        self._deadline: asyncio.TimerHandle | None = None
        # The request head being read: bytes and headers so far (``on_url``/``on_header``), bytes
        # of chunks that ended inside it, why it is refused, and an Upgrade to ignore.
        self._head_bytes = 0
        self._head_headers = 0
        self._head_chunks = 0
        self._head_refusal: str | None = None
        self._upgrade_ignored = False
        # The client, as the app sees it (``delivery.ClientConnection``).
        self.client_side = ClientSide(self)

    # -- the read deadline ----------------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._deadline_passed)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self.transport is None or self.transport.is_closing():
            return
        if self.phase == "body":
            if self.flow.read_paused:
                # The route has not consumed what came: the wait is ours, not the client's.
                self._arm(self.limits.body_timeout_s)
                return
            log.debug("closing a connection from %s: its request body did not arrive in time", self._peer())
            self.transport.close()
        elif self.phase in ("new", "head"):
            log.debug("closing a connection from %s: no whole request head in time", self._peer())
            message = f"the request line and headers did not arrive within {self.limits.header_timeout_s:g} s"
            payload = openai_error(message, "invalid_request_error", "request_timeout")
            self.transport.write(raw_response(b"408 Request Timeout", payload))
            self.transport.close()

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "?"

    # -- connection and request events ------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s)
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            # Answered once its request head is in (a response written before the client's request
            # can be lost to the reset that closing then causes), and soon closed if it sends none.
            log.warning("refusing a connection: %d open, every one busy", len(self.connections) - 1)
            self.refused = True
            self.app = too_many_connections(self.limits.max_connections)  # type: ignore[assignment]
            self._arm(min(self.limits.header_timeout_s, REFUSED_HEAD_TIMEOUT_S))

    def _evictable(self) -> bool:
        if self.refused or self.transport is None or self.transport.is_closing() or self.pipeline:
            return False
        return self.phase in ("new", "head", "idle") and (self.cycle is None or self.cycle.response_complete)

    def _make_room(self) -> bool:
        """Close the connection idle longest (those that never sent a whole request first)."""
        candidates = [c for c in self.connections if c is not self and isinstance(c, GatewayProtocol)]
        candidates = [c for c in candidates if c._evictable()]
        if not candidates:
            return False
        victim = min(candidates, key=lambda c: (c.phase == "idle", c.last_active))
        log.debug(
            "closing the connection from %s (%s) to make room for a new one", victim._peer(), victim.phase
        )
        victim.transport.close()
        # Leave the set now: the transport reports the loss on a later loop iteration.
        self.connections.discard(victim)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        self.client_side.lost()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[CONNECTION_KEY] = self.client_side  # type: ignore[literal-required]
        self.last_active = time.monotonic()
        if self.phase != "new":  # a new connection's first request counts from the connection's start
            self._arm(self.limits.header_timeout_s)
        self.phase = "head"
        self._head_bytes = self._head_headers = self._head_chunks = 0
        self._upgrade_ignored = False

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_headers += 1
        self._head_bytes += len(name) + len(value) + 4  # "name: value\r\n"
        if self._head_refusal is not None:
            return
        if self._head_headers > self.limits.max_headers:
            self._head_refusal = f"the request has more than {self.limits.max_headers} headers"
        elif self._head_bytes > self.limits.max_header_bytes:
            self._head_refusal = f"the request line and headers exceed {self.limits.max_header_bytes} bytes"
        else:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._head_refusal is not None:
            self.phase = "refused"  # answered 431 once the parser returns (``data_received``)
            return
        if self.parser.should_upgrade():
            # No Upgrade is served here. The parser would skip the body as another protocol's
            # bytes; ``data_received`` parses the request again without the header instead.
            self._upgrade_ignored = True
            return
        self.phase = "body"
        self._arm(self.limits.body_timeout_s)
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:  # the request's cycle: its answer's head leaves with its body
            self.cycle.transport = HeldHead(self.transport, self.loop)  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        if self._head_refusal is None and not self._upgrade_ignored:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._head_refusal is not None or self._upgrade_ignored:
            return
        self._disarm()
        self.phase = "app"
        super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with the head caps and Upgrade handling of ``transport.heads``."""
        if self.phase == "refused":
            return  # answered 431 and closing: nothing more is read
        self._unset_keepalive_if_required()
        received = len(data)
        while data:
            try:
                self.parser.feed_data(data)
                data = b""
            except httptools.HttpParserUpgrade as exc:
                # Parse the request again, without its Upgrade, followed by what came after its head.
                rest = data[exc.args[0] :]
                try:
                    head = head_without_upgrade(self.parser, self.url, self.headers)
                except UnsupportedUpgrade as refused:
                    self.send_400_response(str(refused))
                    return
                self.parser = new_parser(self)
                data = head + rest
            except httptools.HttpParserError:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
                return
        if self.phase == "head" and self._head_refusal is None:
            # The head goes on past this chunk. The parser keeps a header's pieces until it is
            # whole, so count whole chunks (at most one more than the head holds) and stop here.
            self._head_chunks += received
            if self._head_chunks > self.limits.max_header_bytes:
                self._head_refusal = (
                    f"the request line and headers exceed {self.limits.max_header_bytes} bytes"
                )
        if self._head_refusal is not None:
            self._refuse_head()

    def _refuse_head(self) -> None:
        """Answer 431 and close without reading on."""
        message = self._head_refusal or "request head too large"
        log.debug("refusing a request head from %s: %s", self._peer(), message)
        self.phase = "refused"
        self._disarm()
        payload = openai_error(message, "invalid_request_error", "request_header_fields_too_large")
        self.transport.write(raw_response(b"431 Request Header Fields Too Large", payload))
        self.transport.close()

    def on_response_complete(self) -> None:
        self.last_active = time.monotonic()
        if self.phase == "app":
            self.phase = "idle"
        super().on_response_complete()
