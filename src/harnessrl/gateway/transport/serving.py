"""uvicorn's config for serving an app with the gateway's protocol and connection settings, and the
server that tells the gateway when its shutdown starts."""

from __future__ import annotations

import socket
from typing import Any

import uvicorn

from harnessrl.config import GatewayConfig
from harnessrl.gateway.transport.limits import ConnectionLimits, fd_headroom
from harnessrl.gateway.transport.protocol import GatewayProtocol


def protocol_class(limits: ConnectionLimits) -> type[GatewayProtocol]:
    """A ``GatewayProtocol`` with these limits, for ``uvicorn.Config(http=...)``."""
    return type("GatewayProtocol", (GatewayProtocol,), {"limits": limits})


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


class GatewayServer(uvicorn.Server):
    """``uvicorn.Server`` that tells the gateway the moment its shutdown starts (``GatewayState.stop``).

    uvicorn's own shutdown waits for every request to end (up to ``timeout_graceful_shutdown``) and
    only then runs the app's lifespan shutdown: a call held at a paused gate would wait out that
    timeout and then be cut. ``shutdown`` is the first thing uvicorn runs once ``should_exit`` is set
    (by SIGINT/SIGTERM, or by whoever serves it in a thread), on the app's event loop; the held calls
    are answered there (503), and the calls generating go on as uvicorn waits for them. An app that
    is not a gateway (a test's fake upstream) is served as plain uvicorn serves it.
    """

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        gateway = getattr(self.config.app, "gateway", None)  # ``app.GatewayApp``'s ``GatewayState``
        if gateway is not None:
            gateway.stop()
        await super().shutdown(sockets=sockets)
