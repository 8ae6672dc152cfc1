"""One keep-alive HTTP/1.1 connection to an inference server: an asyncio protocol fed to httptools.

The parser (llhttp, in C) calls back into :class:`Connection` with the answer's status, headers and
body pieces; the callbacks append to a list and wake the one coroutine waiting on the connection
(:class:`~harnessrl.engines.http_client.HttpClient`'s) when there is something for it: the whole
answer, or, streaming, its head and then each piece. Nothing is allocated per request but that
coroutine's future. The read timeout is one ``call_at`` handle per connection that survives from
request to request and is moved only when it fires before its time (bytes arrived meanwhile): a
busy connection pays nothing per request for it.

Also here: what can go wrong below HTTP, as :class:`HttpClientError` subclasses, and how a connection
tells a body that ends with the connection (no length, not chunked; HTTP/1.0) from one cut short.

One request, one answer: parsing stops where the answer ends. Bytes after it, in the same read or a
later one, were not asked for (a server that answered twice, or a stale answer): they never reach
the body, and the connection is not reused, since the next request would read them as its answer.
"""

from __future__ import annotations

import asyncio

import httptools

# A streamed answer the caller does not read fast enough stops the socket reads past this many bytes.
_STREAM_HIGH_WATER = 256 * 1024


class HttpClientError(Exception):
    """A request failed below HTTP: it was not answered, or not wholly."""


class ConnectFailed(HttpClientError):
    """No connection was made: refused, an unknown host, TLS refused, or the connect timeout passed."""


class ConnectionClosed(HttpClientError):
    """The server closed or reset the connection before the answer was complete. ``unanswered``: not
    one byte of the answer had arrived (a keep-alive connection the server had just closed)."""

    def __init__(self, message: str, *, unanswered: bool):
        super().__init__(message)
        self.unanswered = unanswered


class ReadTimeout(HttpClientError):
    """The server sent nothing for the read timeout."""


class ProtocolError(HttpClientError):
    """The server's bytes are not an HTTP/1.x answer."""


class Connection(asyncio.Protocol):
    """One keep-alive connection: its parser callbacks fill ``body`` and wake the one waiting coroutine."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False  # a request is using it
        self.streaming = False  # the caller reads the body piece by piece
        self.received = False  # a byte of the current answer has arrived
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.error: HttpClientError | None = None
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.buffered = 0  # streaming: bytes in ``body`` not yet taken
        self.last_io = loop.time()  # last byte received (or request sent): read timeout and idle age
        self.read_timeout: float | None = None
        self.write_paused = False
        self.reading_paused = False
        # Streaming: until when body pieces do not wake the waiting coroutine (``gather``); None: they do.
        self._gather_until: float | None = None
        self._gather_timer: asyncio.TimerHandle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.busy or self.complete:
            # Bytes nobody asked for (on an idle connection, or past the answer): it cannot be reused.
            self.keep_alive = False
            self.transport.abort()  # type: ignore[union-attr]
            return
        if self.error is not None:
            return
        self.last_io = self._loop.time()
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.complete:
                # Bytes after the answer in this same read (``on_message_begin`` stopped the parser
                # there, or they are not HTTP): the answer stands; the connection is not reused.
                self.keep_alive = False
            else:
                self._fail(ProtocolError(f"the server sent a malformed answer: {exc}"))
            self.transport.abort()  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost decides what the EOF meant

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.busy and not self.complete and self.error is None:
            if exc is None and self.headers_done and self._read_to_close():
                self._finish(keep_alive=False)  # a body without a length ends with the connection
            elif not self.received:
                self._fail(ConnectionClosed(f"closed before answering ({exc or 'EOF'})", unanswered=True))
            else:
                part = "body" if self.headers_done else "head"
                self._fail(ConnectionClosed(f"closed mid-{part} ({exc or 'EOF'})", unanswered=False))
        self._wake_drain()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.last_io = self._loop.time()  # the server is reading the body: not silent
        self._wake_drain()

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.complete:
            # A second answer starts in the read that ended this one: stop the parser here, before
            # its head and body are taken for this answer's (data_received drops the connection).
            raise _AnswerAlreadyComplete

    def on_status(self, reason: bytes) -> None:
        self.reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))  # looked at only if the connection closes mid-answer

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True
        if self.streaming:
            self._wake()

    def on_body(self, data: bytes) -> None:
        self.body.append(data)
        if self.streaming:
            self.buffered += len(data)
            if self.buffered > _STREAM_HIGH_WATER and not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]
                self._wake()  # even while gathering: nothing more is read until it is taken
            elif self._waiter is not None:
                until = self._gather_until
                if until is None or self._loop.time() >= until:
                    self._wake()
                else:  # the first piece of this gather sets its end
                    self._end_gather_at(until)

    def on_message_complete(self) -> None:
        if self.status < 200:  # 100 Continue and the like: the real answer follows
            self.headers_done = False
            self.headers.clear()
            self.body.clear()
            return
        self._finish(self._parser.should_keep_alive())

    # used by HttpClient

    def begin(self, streaming: bool, read_timeout: float | None, now: float) -> None:
        self.busy = True
        self.streaming = streaming
        self.received = self.headers_done = self.complete = self.keep_alive = False
        self.status = 0
        self.reason = b""
        self.headers.clear()
        self.body.clear()
        self.buffered = 0
        self.last_io = now
        self.read_timeout = read_timeout
        if read_timeout is not None and self._timer is None:
            self._timer = self._loop.call_at(now + read_timeout, self._check_read)

    async def exchange(
        self, head: bytes, body: bytes | None, streaming: bool, read_timeout: float | None
    ) -> None:
        """Send a request; return when its whole answer (or, ``streaming``, its head) is in."""
        transport = self.transport
        assert transport is not None
        if self.closed or transport.is_closing():
            raise ConnectionClosed("closed while idle", unanswered=True)
        self.begin(streaming, read_timeout, self._loop.time())
        try:
            if body:
                transport.writelines((head, body))
            else:
                transport.write(head)
        except RuntimeError as exc:  # uvloop: the transport closed under us
            raise ConnectionClosed(f"closed before writing ({exc})", unanswered=True) from exc
        if self.write_paused and not self.complete:
            # The body is larger than the transport's buffer limit: wait for the server to read it, or
            # for its answer (a server may answer before reading everything, e.g. to refuse it).
            self._drain = self._loop.create_future()
            await self._drain
        while not (self.complete or (streaming and self.headers_done)):
            if self.error is not None:
                raise self.error
            await self.wait()

    def wait(self) -> asyncio.Future[None]:
        self._waiter = waiter = self._loop.create_future()
        return waiter

    async def gather(self, seconds: float) -> None:
        """Streaming: let the body's pieces gather for ``seconds`` without waking the caller for each;
        return then if a piece came, else at the first piece after then, or sooner once the answer is
        complete, fails, or fills the read buffer (reading paused).

        Each piece still arrives as the server sends it (one socket read and a parser callback), but
        the caller, and whatever it does per piece, runs once for all of them. The end of the interval
        is a timer only once a piece arrived within it: pieces further apart than ``seconds`` (vLLM's
        events at a real decode pace) each wake the caller once, not once more at the interval's end."""
        if self.complete or self.error is not None or self.reading_paused:
            return
        waiter = self.wait()
        until = self._gather_until = self._loop.time() + seconds
        if self.body:  # pieces came while the caller handled the last ones: they gather from now
            self._end_gather_at(until)
        try:
            await waiter
        finally:
            self._gather_until = None
            if self._gather_timer is not None:
                self._gather_timer.cancel()
                self._gather_timer = None
            if self._waiter is waiter:
                self._waiter = None

    def take_body(self) -> bytes:
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        if self.reading_paused:
            self.reading_paused = False
            self.last_io = self._loop.time()
            self.transport.resume_reading()  # type: ignore[union-attr]
        return data

    def reusable(self) -> bool:
        # Unsent body bytes left behind an early answer would be read by the server as the next request.
        return (
            self.complete
            and self.keep_alive
            and not self.closed
            and self.transport.get_write_buffer_size() == 0  # type: ignore[union-attr]
        )

    def close(self) -> None:
        self.busy = False
        if not self.closed and self.transport is not None:
            self.transport.abort()

    # internals

    def _end_gather_at(self, until: float) -> None:
        """Wake the gathering coroutine at ``until`` (once per gather)."""
        if self._gather_timer is None:
            self._gather_timer = self._loop.call_at(until, _settle, self._waiter)

    def _finish(self, keep_alive: bool) -> None:
        self.complete = True
        self.keep_alive = keep_alive
        self._wake()
        self._wake_drain()

    def _fail(self, error: HttpClientError) -> None:
        if self.error is None:
            self.error = error
        self._wake()
        self._wake_drain()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        _settle(waiter)

    def _wake_drain(self) -> None:
        drain, self._drain = self._drain, None
        _settle(drain)

    def _read_to_close(self) -> bool:
        """Whether the answer's body is delimited by the connection's end (no length, not chunked)."""
        for name, value in self.headers:
            lower = name.lower()
            if lower == b"content-length" or lower == b"transfer-encoding" and b"chunked" in value.lower():
                return False
        return True

    def _check_read(self) -> None:
        """The read-timeout handle fired: time out, or move it to the last byte's time + the timeout."""
        self._timer = None
        if not self.busy or self.read_timeout is None or self.closed or self.complete:
            return  # armed again by the next request
        now = self._loop.time()
        if self.reading_paused:
            self.last_io = now  # the caller is slow to read, the server is not silent
        deadline = self.last_io + self.read_timeout
        if deadline > now:
            self._timer = self._loop.call_at(deadline, self._check_read)
            return
        self._fail(ReadTimeout(f"nothing received for {self.read_timeout:g} s"))
        self.transport.abort()  # type: ignore[union-attr]


class _AnswerAlreadyComplete(Exception):
    """Raised inside the parser to stop it at bytes that follow a complete answer."""


def _settle(future: asyncio.Future[None] | None) -> None:
    """Wake whoever awaits ``future`` (if anyone still does)."""
    if future is not None and not future.done():
        future.set_result(None)
