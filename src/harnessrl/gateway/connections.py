"""The gateway's HTTP connections: read timeouts, the idle keep-alive timeout, a cap on open connections.

uvicorn alone (0.54) has one connection timer, the keep-alive timeout, and arms it only after a
response: a connection that opens and never sends a whole request is held forever, so a few
hundred of them exhaust the process's file descriptors and lock every other client out. Its 5 s
keep-alive default also equals the idle time after which httpx and the OpenAI SDK stop reusing a
connection, so a client sometimes sends its next call on a connection the server is closing at
that instant, and gets a ``ReadError`` for a call that was never recorded.

``GatewayProtocol`` is uvicorn's httptools protocol with, per connection:

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

Everything else (parsing, flow control, the ASGI cycle) is uvicorn's.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from harnessrl.config import GatewayConfig

log = logging.getLogger("harnessrl.gateway")

#: File descriptors kept free beyond the connections (the store, the engine's sockets, logs, threads).
FD_RESERVE = 64

#: Seconds a connection refused by the cap has to send its request head (to be answered 503).
REFUSED_HEAD_TIMEOUT_S = 5.0

#: Where a connection is in its current request: ``new`` (nothing received yet), ``head`` (reading
#: the request line and headers), ``body``, ``app`` (the route is answering), ``idle`` (keep-alive).
Phase = Literal["new", "head", "body", "app", "idle"]


@dataclass(frozen=True)
class ConnectionLimits:
    """The connection settings of ``GatewayConfig``, as the protocol uses them."""

    keepalive_timeout_s: float = 75.0
    header_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    max_connections: int = 4096

    @classmethod
    def from_config(cls, config: GatewayConfig) -> ConnectionLimits:
        return cls(
            keepalive_timeout_s=config.keepalive_timeout_s,
            header_timeout_s=config.header_timeout_s,
            body_timeout_s=config.body_timeout_s,
            max_connections=config.max_connections,
        )


def _openai_error(message: str, kind: str, code: str) -> bytes:
    # No route is known yet (or ever): OpenAI's shape, the gateway's default.
    return orjson.dumps({"error": {"message": message, "type": kind, "code": code, "param": None}})


def _raw_response(status: bytes, payload: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(payload)).encode() + b"\r\nconnection: close\r\n\r\n"
    ) + payload


def _too_many_connections(limit: int) -> Any:
    """The ASGI app a connection over the cap gets instead of the gateway: a 503 that closes it."""
    payload = _openai_error(
        f"the gateway has {limit} connections open, all busy; retry",
        "rate_limit_error",
        "too_many_connections",
    )

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"retry-after", b"1"),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return refuse


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
            payload = _openai_error(message, "invalid_request_error", "request_timeout")
            self.transport.write(_raw_response(b"408 Request Timeout", payload))
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
            self.app = _too_many_connections(self.limits.max_connections)  # type: ignore[assignment]
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

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.last_active = time.monotonic()
        if self.phase != "new":  # a new connection's first request counts from the connection's start
            self._arm(self.limits.header_timeout_s)
        self.phase = "head"

    def on_headers_complete(self) -> None:
        self.phase = "body"
        self._arm(self.limits.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self.phase = "app"
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self.last_active = time.monotonic()
        if self.phase == "app":
            self.phase = "idle"
        super().on_response_complete()


def protocol_class(limits: ConnectionLimits) -> type[GatewayProtocol]:
    """A ``GatewayProtocol`` with these limits, for ``uvicorn.Config(http=...)``."""
    return type("GatewayProtocol", (GatewayProtocol,), {"limits": limits})


def fd_headroom(limits: ConnectionLimits) -> ConnectionLimits:
    """Raise this process's open-file limit to its hard limit if that is needed for ``max_connections``,
    and lower ``max_connections`` (with a warning) if the hard limit is too low for it.

    Past the fd limit the server cannot accept at all, and then no one gets in, not even to be
    answered 503; below it the cap decides who stays.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = limits.max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        allowed = max(1, soft - FD_RESERVE)
        log.warning(
            "gateway.max_connections = %d needs %d file descriptors; the limit is %d: capping at %d",
            limits.max_connections,
            wanted,
            soft,
            allowed,
        )
        return ConnectionLimits(
            keepalive_timeout_s=limits.keepalive_timeout_s,
            header_timeout_s=limits.header_timeout_s,
            body_timeout_s=limits.body_timeout_s,
            max_connections=allowed,
        )
    return limits


def uvicorn_config(
    app: Any, config: GatewayConfig, *, raise_fd_limit: bool = True, **kwargs: Any
) -> uvicorn.Config:
    """``uvicorn.Config`` serving ``app`` with the gateway's connection settings from ``config``.

    ``raise_fd_limit``: adjust the process's open-file limit to ``max_connections`` (``fd_headroom``).
    """
    limits = ConnectionLimits.from_config(config)
    if raise_fd_limit:
        limits = fd_headroom(limits)
    kwargs.setdefault("access_log", False)
    kwargs.setdefault("lifespan", "on")
    return uvicorn.Config(app, http=protocol_class(limits), **kwargs)
