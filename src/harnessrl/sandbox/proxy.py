"""Host side of the sandbox network bridge: a Unix socket that forwards to the gateway's TCP port.

Sandboxed harnesses have no route to the host's network; ``enter.py`` relays their connections to
this socket, which the controller serves for all rollouts at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class GatewayBridge:
    """``async with GatewayBridge(host, port) as bridge: bridge.path`` is the socket to hand to sandboxes."""

    def __init__(self, host: str, port: int):
        self.host = host
        self.port = port
        # Unix socket paths are limited to ~107 bytes, so keep it short and out of the run folder.
        self._dir = Path(tempfile.mkdtemp(prefix="hrl-"))
        self.path = str(self._dir / "gw.sock")
        self._server: asyncio.AbstractServer | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def __aenter__(self) -> GatewayBridge:
        self._server = await asyncio.start_unix_server(self._handle, path=self.path)
        os.chmod(self.path, 0o777)  # harnesses may run as another user
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            self._dir.rmdir()
