"""The gateway's connection settings, and the open-file limit the connection cap needs."""

from __future__ import annotations

import dataclasses
import logging
import resource
from dataclasses import dataclass

from harnessrl.config import GatewayConfig

log = logging.getLogger("harnessrl.gateway")

#: File descriptors kept free beyond the connections (the store, the engine's sockets, logs, threads).
FD_RESERVE = 64


@dataclass(frozen=True)
class ConnectionLimits:
    """The connection settings of ``GatewayConfig``, as the protocol uses them."""

    keepalive_timeout_s: float = 75.0
    header_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    max_connections: int = 4096
    max_header_bytes: int = 65536
    max_headers: int = 100

    @classmethod
    def from_config(cls, config: GatewayConfig) -> ConnectionLimits:
        return cls(
            keepalive_timeout_s=config.keepalive_timeout_s,
            header_timeout_s=config.header_timeout_s,
            body_timeout_s=config.body_timeout_s,
            max_connections=config.max_connections,
            max_header_bytes=config.max_header_bytes,
            max_headers=config.max_headers,
        )


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
        return dataclasses.replace(limits, max_connections=allowed)
    return limits
