"""aiohttp for an inference server reached through an HTTP(S) proxy, with :class:`HttpClient`'s calls.

:class:`~harnessrl.engines.remote.HttpUpstream` sends an upstream through this when the environment
(``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``) puts a proxy in front of it: aiohttp implements
proxies, ``CONNECT`` tunnels and proxy credentials exactly, and a proxied gateway is not the one whose
CPU per call is measured. Everything else goes through
:class:`~harnessrl.engines.http_client.HttpClient`. Errors are aiohttp's; ``HttpUpstream`` translates
them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from harnessrl.engines.http_client import Answer

_JSON_HEADERS = {"content-type": "application/json"}


def _stale_connection(exc: BaseException) -> bool:
    """Whether aiohttp failed a request on a pooled connection the server had closed (reset while
    writing, or disconnected before any answer): a new connection will do. A refused connect is not
    this: that server is down, which the caller (the pool) has to know."""
    return isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError) and not isinstance(
        exc, aiohttp.ClientConnectorError
    )


class ProxiedClient:
    """:class:`HttpClient`'s two calls through an ``aiohttp.ClientSession``, for an upstream behind a
    proxy (aiohttp implements proxies, ``CONNECT`` tunnels and proxy credentials exactly)."""

    def __init__(
        self,
        base_url: str,
        *,
        proxy: dict[str, Any],
        auth: aiohttp.BasicAuth | None,
        headers: dict[str, str],
        timeout: aiohttp.ClientTimeout,
        idle_timeout_s: float,
    ):
        self._base_url = base_url
        self._proxy = proxy  # proxy / proxy_auth for every request
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1024, limit_per_host=0, keepalive_timeout=idle_timeout_s),
            headers=headers,
            timeout=timeout,
            auth=auth,
        )

    async def aclose(self) -> None:
        await self._session.close()

    async def _send(
        self, method: str, path: str, body: bytes | None, **kwargs: Any
    ) -> aiohttp.ClientResponse:
        """The response's headers, over a new connection if the pooled one turns out to be closed (as
        :meth:`HttpClient._send`)."""
        if body is not None:
            kwargs.update(data=body, headers=_JSON_HEADERS)
        url = f"{self._base_url}{path}"
        try:
            return await self._session.request(method, url, **self._proxy, **kwargs)
        except (aiohttp.ClientError, OSError) as exc:
            if not _stale_connection(exc):
                raise
        # aiohttp dropped the closed connection
        return await self._session.request(method, url, **self._proxy, **kwargs)

    async def request(
        self, method: str, path: str, body: bytes | None = None, *, timeout_s: float | None = None
    ) -> Answer:
        kwargs = {} if timeout_s is None else {"timeout": aiohttp.ClientTimeout(total=timeout_s)}
        async with await self._send(method, path, body, **kwargs) as response:
            return Answer(response.status, response.reason or "", await response.read())

    @asynccontextmanager
    async def stream(self, method: str, path: str, body: bytes | None = None) -> AsyncIterator[ProxiedStream]:
        async with await self._send(method, path, body) as response:
            yield ProxiedStream(response)


class ProxiedStream:
    """:class:`~harnessrl.engines.http_client.Stream` over an aiohttp response."""

    def __init__(self, response: aiohttp.ClientResponse):
        self._response = response
        self.status = response.status
        self.reason = response.reason or ""

    def chunks(self, interval_s: float = 0.0) -> AsyncIterator[bytes]:
        """The body's pieces as they arrive (whatever has arrived at each read). ``interval_s`` is
        taken, as :meth:`Stream.chunks <harnessrl.engines.http_client.Stream.chunks>` takes it, and
        not used: it only batches what is read, and a proxied upstream is not the one whose CPU per
        call is measured."""
        return self._response.content.iter_any()

    async def read(self) -> bytes:
        return await self._response.read()
