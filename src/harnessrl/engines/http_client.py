"""A minimal HTTP/1.1 client for one inference server: keep-alive connections on asyncio and httptools.

Every model call crosses this client with a ~100 KB token-ID prompt, and the gateway's CPU per call
is what harnessrl is measured on. aiohttp spent ~0.3 ms of it per call (request and response objects,
header multidicts, timers, payload streams); this client ~0.15 ms, most of which is serializing the
prompt and the ``send`` system call (a bare-bones httptools client: ~0.13 ms). The request head is one
bytes join, written with the body by one ``writelines``; the answer is parsed in C by httptools
(:mod:`~harnessrl.engines.http_connection`), which wakes the waiting coroutine once it is in.

What it does: a pool of keep-alive connections (most recently used first; one idle longer than
``idle_timeout_s`` is never reused, and closed by a sweep), at most ``limit`` connections (callers
past it wait for one), a request that meets a connection the server closed or reset before any byte
of the answer sent once more on a new connection (a refused connect is not: that server is down),
connect and read timeouts (the read timeout is the longest silence between bytes, as aiohttp's
``sock_read``), Content-Length, chunked and read-to-close bodies, ``Connection: close`` and HTTP/1.0
answers, write backpressure (a large body waits for the transport to drain; an answer that arrives
first ends the wait), and closing rather than pooling every connection whose answer was not read to
its end (an early exit from a stream, a cancelled call), which aborts the request server-side.

What it leaves out: proxies (``HttpUpstream`` sends an upstream behind a proxy through aiohttp),
compression (never asked for), ``HEAD``, pipelining, HTTP/2. Request bodies are JSON.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import NamedTuple
from urllib.parse import urlsplit

from harnessrl.engines.http_connection import ConnectFailed, Connection, ConnectionClosed, HttpClientError

__all__ = ["Answer", "ConnectFailed", "HttpClient", "HttpClientError", "Stream"]


class Answer(NamedTuple):
    status: int
    reason: str
    body: bytes


class Stream:
    """A streamed answer: its status, then its body as pieces in the order they arrived."""

    __slots__ = ("_conn", "status", "reason")

    def __init__(self, conn: Connection):
        self._conn = conn
        self.status = conn.status
        self.reason = conn.reason.decode("latin-1")

    async def chunks(self, interval_s: float = 0.0) -> AsyncIterator[bytes]:
        """The body's pieces as they arrive; with ``interval_s``, at most one piece per ``interval_s``:
        the first at once, then whatever arrived meanwhile (``Connection.gather``), the end at once."""
        conn = self._conn
        while True:
            if conn.body:
                yield conn.take_body()
                if interval_s:
                    await conn.gather(interval_s)
            elif conn.complete:
                return
            elif conn.error is not None:
                raise conn.error
            else:
                await conn.wait()

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.chunks()])


class HttpClient:
    """Keep-alive HTTP/1.1 to one server (``base_url``: scheme, host, port and a path prefix).

    ``request`` reads a whole answer; ``stream`` yields a :class:`Stream` after the answer's head.
    Failures below HTTP raise :class:`HttpClientError` subclasses; ``timeout_s`` on ``request``
    replaces the connect and read timeouts with one deadline for the whole call (``TimeoutError``).
    Bound to the event loop of its first call.
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float | None,
        read_timeout_s: float | None,
        idle_timeout_s: float,
        headers: dict[str, str] | None = None,
        limit: int = 1024,
    ):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/")
        host = f"[{self._host}]" if ":" in self._host else self._host
        if parts.port is not None and parts.port != (443 if self._ssl else 80):
            host = f"{host}:{parts.port}"
        lines = [f"host: {host}", "user-agent: harnessrl"]
        for name, value in (headers or {}).items():
            if any(c in f"{name}{value}" for c in "\r\n\0"):
                raise ValueError(f"header {name!r} has a line break or NUL")  # it would forge headers
            lines.append(f"{name}: {value}")
        fixed = "".join(f"{line}\r\n" for line in lines).encode("latin-1")
        self._head_json = fixed + b"content-type: application/json\r\ncontent-length: "
        self._head_empty = fixed + b"content-length: 0\r\n\r\n"
        self._head_get = fixed + b"\r\n"
        self._connect_timeout = connect_timeout_s
        self._read_timeout = read_timeout_s
        self._idle_timeout = idle_timeout_s
        self._limit = limit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[Connection] = []  # most recently used last
        self._conns: set[Connection] = set()  # every open (or opening) connection
        self._waiters: deque[asyncio.Future[None]] = deque()  # calls waiting for a connection slot
        self._sweeper: asyncio.TimerHandle | None = None
        self.closed = False

    async def request(
        self, method: str, path: str, body: bytes | None = None, *, timeout_s: float | None = None
    ) -> Answer:
        head = self._head(method, path, body)
        if timeout_s is None:
            conn = await self._send(head, body, False, self._connect_timeout, self._read_timeout)
        else:
            async with asyncio.timeout(timeout_s):
                conn = await self._send(head, body, False, None, None)
        answer = Answer(conn.status, conn.reason.decode("latin-1"), conn.take_body())
        self._release(conn)
        return answer

    @asynccontextmanager
    async def stream(self, method: str, path: str, body: bytes | None = None) -> AsyncIterator[Stream]:
        """The answer's status and its body piece by piece. Leaving before the body's end (or on an
        exception, or cancelled) closes the connection, so the server stops generating."""
        conn = await self._send(
            self._head(method, path, body), body, True, self._connect_timeout, self._read_timeout
        )
        try:
            yield Stream(conn)
        finally:
            conn.streaming = False
            self._release(conn)

    async def aclose(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._conns):
            conn.close()
        self._conns.clear()
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # they find the client closed

    # internals

    def _head(self, method: str, path: str, body: bytes | None) -> bytes:
        start = f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode("ascii")
        if body is not None:
            return b"".join((start, self._head_json, b"%d\r\n\r\n" % len(body)))
        return start + (self._head_get if method == "GET" else self._head_empty)

    async def _send(
        self,
        head: bytes,
        body: bytes | None,
        streaming: bool,
        connect_timeout: float | None,
        read_timeout: float | None,
    ) -> Connection:
        """A connection on which the request was sent and the answer (or its head) has arrived.

        A connection the server closed before answering (a keep-alive one it had just timed out) is
        replaced by a new one, once: the request never reached a server that was listening, so this is
        not a retry policy (that is the engine pool's). Once only, so a server that keeps hanging up is
        still an error.
        """
        for attempt in range(2):
            conn = await self._acquire(connect_timeout, fresh=attempt > 0)
            try:
                await conn.exchange(head, body, streaming, read_timeout)
                return conn
            except ConnectionClosed as exc:
                self._discard(conn)
                if attempt or not exc.unanswered:
                    raise
            except BaseException:
                self._discard(conn)  # cancelled or timed out: the answer would be half read
                raise
        raise AssertionError("unreachable")

    async def _acquire(self, connect_timeout: float | None, *, fresh: bool) -> Connection:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        while True:
            if self.closed:
                raise ConnectFailed("the client is closed")
            if not fresh:
                idle = self._idle
                now = loop.time()
                while idle:
                    conn = idle.pop()
                    if conn.closed or now - conn.last_io >= self._idle_timeout:
                        self._discard(conn)
                        continue
                    return conn
            if len(self._conns) < self._limit:
                return await self._connect(loop, connect_timeout)
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter  # a connection came back to the pool, or a slot freed
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif not waiter.cancelled():
                    self._wake_one()  # woken and cancelled at once: pass the wake-up on
                raise

    async def _connect(self, loop: asyncio.AbstractEventLoop, connect_timeout: float | None) -> Connection:
        conn = Connection(loop)
        self._conns.add(conn)  # counts toward the limit while connecting
        try:
            async with asyncio.timeout(connect_timeout):
                await loop.create_connection(
                    lambda: conn,
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None,
                )
        except (OSError, TimeoutError) as exc:
            self._forget(conn)
            raise ConnectFailed(
                f"cannot connect to {self._host}:{self._port}: {str(exc) or 'timed out'}"
            ) from exc
        except BaseException:
            self._forget(conn)
            conn.close()
            raise
        return conn

    def _release(self, conn: Connection) -> None:
        """Back to the pool if its answer was read to the end and it may stay open; closed otherwise."""
        conn.busy = False
        if self.closed or not conn.reusable():
            self._discard(conn)
            return
        if conn.reading_paused:
            conn.take_body()  # resumes reading
        self._idle.append(conn)
        if self._waiters:
            self._wake_one()
        if self._sweeper is None:
            self._sweeper = self._loop.call_at(conn.last_io + self._idle_timeout, self._sweep)  # type: ignore[union-attr]

    def _discard(self, conn: Connection) -> None:
        conn.close()
        self._forget(conn)

    def _forget(self, conn: Connection) -> None:
        self._conns.discard(conn)
        if self._waiters:
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _sweep(self) -> None:
        """Close the connections idle for longer than the idle timeout (oldest first), then come back
        when the next one will be."""
        self._sweeper = None
        idle = self._idle
        now = self._loop.time()  # type: ignore[union-attr]
        expired = 0
        while expired < len(idle) and (
            idle[expired].closed or now - idle[expired].last_io >= self._idle_timeout
        ):
            expired += 1
        for conn in idle[:expired]:
            self._discard(conn)
        del idle[:expired]
        if idle:
            self._sweeper = self._loop.call_at(idle[0].last_io + self._idle_timeout, self._sweep)  # type: ignore[union-attr]
