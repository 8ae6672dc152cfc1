"""Request heads the HTTP parser would mishandle, and what a socket has not delivered yet.

**Upgrade.** The gateway speaks HTTP/1.1 only (no WebSocket route, no HTTP/2). ``curl --http2`` on
an ``http://`` URL sends ``Connection: Upgrade, HTTP2-Settings`` and ``Upgrade: h2c`` with its POST;
httptools then takes everything after the head for the other protocol's bytes, so the route saw an
empty body (a 400 "request body is empty"). RFC 9110 lets a server ignore an Upgrade it does not
want: ``GatewayProtocol`` parses such a request again from ``head_without_upgrade`` (the same request
line and headers, without ``Upgrade`` and without the ``upgrade`` token of ``Connection``) followed
by the bytes that came after the head, with a ``new_parser``.

**Unacknowledged bytes.** ``unacknowledged_bytes`` asks the kernel (Linux's ``SIOCOUTQ``) how many
bytes written to a TCP socket the peer has not acknowledged yet; ``delivery`` records a streamed call
only once its client's TCP has nearly all of the answer before the final event. ``ack_delay_bytes``
says how many of them a healthy peer may be holding its ACK of (``coalesce.Outlet.settle``).
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import sys
import termios
from typing import Any

import httptools

#: ``SIOCOUTQ`` (bytes in a TCP socket's send queue, not yet acknowledged) is ``TIOCOUTQ`` on Linux.
_SIOCOUTQ = getattr(termios, "TIOCOUTQ", None)
#: ``SIOCOUTQNSD`` (bytes in the send queue not sent yet), Linux only (``linux/sockios.h``).
_SIOCOUTQNSD = 0x894B if sys.platform.startswith("linux") else None


class UnsupportedUpgrade(Exception):
    """A request whose upgrade cannot be ignored (``CONNECT``: the whole request is a tunnel)."""


def head_without_upgrade(parser: Any, url: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The request head ``parser`` just read (its line, ``url`` and the ``headers`` uvicorn kept,
    names lower-cased), without ``Upgrade`` and without ``upgrade`` among ``Connection``'s tokens."""
    method = parser.get_method()
    if method == b"CONNECT":
        raise UnsupportedUpgrade("CONNECT is not served")
    lines = [method + b" " + url + b" HTTP/" + parser.get_http_version().encode("ascii")]
    for name, value in headers:
        if name == b"upgrade":
            continue
        if name == b"connection":
            tokens = [t.strip() for t in value.split(b",") if t.strip().lower() != b"upgrade"]
            if not tokens:
                continue
            value = b", ".join(tokens)
        lines.append(name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def new_parser(protocol: Any) -> httptools.HttpRequestParser:
    """A request parser calling back ``protocol``, set up as uvicorn sets up its own."""
    parser = httptools.HttpRequestParser(protocol)
    with contextlib.suppress(AttributeError):  # httptools < 0.6.3 has no leniencies
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser


def unacknowledged_bytes(fileno: int) -> int:
    """Bytes written to the TCP socket ``fileno`` that its peer has not acknowledged; 0 where the
    kernel cannot tell (not Linux, not TCP)."""
    if _SIOCOUTQ is None or fileno < 0:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(fileno, _SIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def ack_delay_bytes(sock: socket.socket) -> int:
    """Of the bytes the peer of TCP socket ``sock`` has not acknowledged, how many it may be holding
    its ACK of while healthy: two of the connection's segments once every byte written has been sent
    (a receiver ACKs at least every second full-sized segment, RFC 1122 4.2.3.2, and may delay the
    ACK of less, ~40 ms on Linux); 0 while some wait to be sent (the peer's window is full: it is not
    reading), and where the kernel cannot tell.

    On a real network a segment is ~1.4 KB and this is less than ``coalesce.RECORD_SLACK_BYTES``; on
    loopback a segment is 32-64 KiB, and the peer's kernel has the bytes it was sent (loopback
    delivers them as they are sent) while it delays the ACK of an answer's last write."""
    if _SIOCOUTQNSD is None:
        return 0
    try:
        fileno = sock.fileno()
        if fileno < 0 or struct.unpack("i", fcntl.ioctl(fileno, _SIOCOUTQNSD, b"\0\0\0\0"))[0] > 0:
            return 0
        return 2 * sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    except OSError:
        return 0
