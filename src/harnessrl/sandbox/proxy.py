"""Host side of the sandbox network bridge: a Unix socket that forwards to the gateway's TCP port.

Sandboxed harnesses have no route to the host's network; ``init.py`` relays their connections to
this socket, which the controller serves for all rollouts at once.

**One sandbox cannot take the controller's descriptors.** Each relayed connection costs the
controller about three file descriptors (the accepted Unix socket, its TCP client, and the
gateway's end of that TCP connection, in the same process when the gateway runs in the
controller). Without a bound, one harness opening thousands of connections would run the
controller out of descriptors (``EMFILE``) and the gateway would stop answering every rollout. So
the bridge tells sandboxes apart by the PID namespace of the process at the other end of the socket
(``SO_PEERCRED``; every bubblewrap sandbox has its own) and holds at most
``max_connections_per_sandbox`` (default 64) connections open for each: one more is closed as soon
as it is accepted, before any connection to the gateway is made. A harness's HTTP client keeps a
handful of keep-alive connections; 64 leaves room for parallel tool calls and streaming.

**Half-closes pass through.** A client that sends its request and then shuts down its writing side
(``shutdown(SHUT_WR)``) still gets its reply: the end of one direction is passed on as an end of
that direction only (``write_eof``), and both sockets are closed once both directions are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import socket
import struct
import tempfile
from collections import Counter
from pathlib import Path

from harnessrl.sandbox.host import make_owned_dir, sweep_abandoned

#: Connections one sandbox may hold open through the bridge at once (see the module docstring).
MAX_CONNECTIONS_PER_SANDBOX = 64
#: The bridge's socket folders in the temporary folder (short: Unix socket paths end at ~107 bytes).
SOCKET_DIR_PREFIX = "hrl-"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` into ``writer``; at EOF end only ``writer``'s writing side (a half-close)."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        # One direction failed: the connection is unusable both ways.
        writer.close()


def _sandbox_of(writer: asyncio.StreamWriter) -> str:
    """Which sandbox is at the other end: the PID namespace of the connecting process (each
    bubblewrap sandbox has its own); a process in the controller's own namespace counts by itself."""
    sock = writer.get_extra_info("socket")
    try:
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
    except (OSError, AttributeError, struct.error):
        return "unknown"  # the peer is already gone, or this is not Linux: all such peers share a cap
    return f"pid {pid}" if namespace == _own_pid_namespace() else namespace


@functools.cache  # the controller's own namespace never changes
def _own_pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


class GatewayBridge:
    """``async with GatewayBridge(host, port) as bridge: bridge.path`` is the socket to hand to sandboxes."""

    def __init__(
        self, host: str, port: int, *, max_connections_per_sandbox: int = MAX_CONNECTIONS_PER_SANDBOX
    ):
        self.host = host
        self.port = port
        self.max_connections_per_sandbox = max_connections_per_sandbox
        # Unix socket paths are limited to ~107 bytes, so keep it short and out of the run folder. The
        # folder is owned (``host.make_owned_dir``): one a killed controller left is removed here, and
        # only such a one (a folder without an owner lock is never this bridge's to judge).
        parent = Path(tempfile.gettempdir())
        sweep_abandoned(parent, SOCKET_DIR_PREFIX, unlocked_grace_s=None)
        self._dir, self._owner_fd = make_owned_dir(parent, SOCKET_DIR_PREFIX)
        self.path = str(self._dir / "gw.sock")
        self._server: asyncio.AbstractServer | None = None
        self._open: Counter[str] = Counter()  # sandbox -> connections it holds open now
        #: Connections the gateway refused over the bridge's life: nothing listened at its port (it
        #: was down or restarting). The controller compares it across an attempt (``gateway_was_down``).
        self.refused = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sandbox = _sandbox_of(writer)
        if self._open[sandbox] >= self.max_connections_per_sandbox:
            writer.close()  # refused at once: no descriptor stays held for it
            return
        self._open[sandbox] += 1
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
            except ConnectionRefusedError:
                self.refused += 1
                writer.close()
                return
            except OSError:
                writer.close()
                return
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                for w in (writer, up_writer):
                    with contextlib.suppress(Exception):
                        w.close()
        finally:
            self._open[sandbox] -= 1
            if not self._open[sandbox]:
                del self._open[sandbox]

    async def gateway_was_down(self, refused_before: int, *, timeout_s: float = 5.0) -> bool:
        """Whether the gateway was down during an attempt that started when ``refused`` read
        ``refused_before``: it refused one of the attempt's connections, or refuses one now (a harness
        that gave up at its first failed call made no second one). Only a refusal counts: nothing in a
        sandbox can make the gateway's port refuse, while a reset or a slow answer a harness can cause."""
        if self.refused > refused_before:
            return True
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), timeout_s)
        except ConnectionRefusedError:
            return True
        except (OSError, TimeoutError):
            return False
        writer.close()
        return False

    async def __aenter__(self) -> GatewayBridge:
        self._server = await asyncio.start_unix_server(self._handle, path=self.path)
        os.chmod(self.path, 0o777)  # harnesses may run as another user
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        shutil.rmtree(self._dir, ignore_errors=True)
        if self._owner_fd >= 0:
            os.close(self._owner_fd)
            self._owner_fd = -1
