"""uvicorn's config for serving an app with the gateway's protocol and connection settings."""

from __future__ import annotations

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
