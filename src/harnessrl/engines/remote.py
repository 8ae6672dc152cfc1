"""HTTP plumbing shared by the remote engines (vLLM, SGLang): one client, one error boundary.

Every failure of a remote inference server leaves this module as :class:`RemoteEngineError` (an
``UpstreamError``) that says whether trying again can help: connection errors, timeouts, a stream
cut short, HTTP 429 and 5xx are *retryable*; other 4xx (a malformed request, an unknown model) are
not. The :class:`~harnessrl.engines.pool.EnginePool` decides what to do with that; a single remote
engine never retries by itself, so a retry policy lives in exactly one place.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx

from harnessrl.engines.base import WeightUpdate
from harnessrl.errors import ConfigError, ContextLengthExceeded, UpstreamError

if TYPE_CHECKING:
    from harnessrl.tokenizer import PolicyTokenizer

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class RemoteEngineError(UpstreamError):
    """A remote engine failed. ``retryable``: the same request may succeed later or elsewhere."""

    def __init__(self, message: str, *, retryable: bool, status: int | None = None, url: str = ""):
        super().__init__(message)
        self.retryable = retryable
        self.status = status  # HTTP status, or None for transport errors (connection refused, reset)
        self.url = url

    @property
    def is_overload(self) -> bool:
        """429/503: the server is alive but busy, so backing off beats marking it unhealthy."""
        return self.status in (429, 503)


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, RemoteEngineError) and exc.retryable


def _status_error(response: httpx.Response, body: str) -> RemoteEngineError:
    detail = body[:300].strip() or response.reason_phrase
    return RemoteEngineError(
        f"{response.request.method} {response.request.url} answered {response.status_code}: {detail}",
        retryable=response.status_code in RETRYABLE_STATUS,
        status=response.status_code,
        url=str(response.request.url),
    )


def _transport_error(exc: httpx.HTTPError, url: str) -> RemoteEngineError:
    # Every transport-level failure (refused, reset, timed out, truncated chunked body) is
    # retryable: the request may not have reached the server, or the server died while answering.
    return RemoteEngineError(f"{url}: {type(exc).__name__}: {exc}", retryable=True, url=url)


class HttpUpstream:
    """An ``httpx.AsyncClient`` for one server, translating every failure into ``RemoteEngineError``.

    ``transport`` is a seam for tests (``httpx.ASGITransport``); by default real TCP is used.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        # Generations stream for minutes; only connecting should fail fast (a dead replica is
        # found in seconds, not after the whole read timeout).
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout, limits=limits, transport=transport
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request_json(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        url = f"{self.base_url}{path}"
        kwargs: dict[str, Any] = {"params": params}
        if json_body is not None:
            kwargs["json"] = json_body
        if timeout_s is not None:
            kwargs["timeout"] = timeout_s
        try:
            response = await self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, url) from exc
        if response.status_code >= 400:
            raise _status_error(response, response.text)
        if not response.content:
            return None
        try:
            return response.json()
        except json.JSONDecodeError:
            return response.text

    @asynccontextmanager
    async def stream_sse(self, path: str, json_body: Any) -> AsyncIterator[AsyncIterator[Any]]:
        """POST and iterate the server-sent events' ``data:`` payloads as JSON (``[DONE]`` ends it)."""
        url = f"{self.base_url}{path}"
        try:
            async with self._client.stream("POST", path, json=json_body) as response:
                if response.status_code >= 400:
                    body = (await response.aread()).decode("utf-8", "replace")
                    raise _status_error(response, body)
                yield _events(response, url)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, url) from exc


async def _events(response: httpx.Response, url: str) -> AsyncIterator[Any]:
    done = False
    try:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # comments, blank separators, `event:` lines
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                return
            try:
                yield json.loads(data)
            except json.JSONDecodeError as exc:
                raise RemoteEngineError(f"{url}: bad stream event {data[:120]!r}", retryable=True) from exc
    except httpx.HTTPError as exc:
        raise _transport_error(exc, url) from exc
    if not done:
        # Both vLLM and SGLang end a stream with `data: [DONE]`; a stream that just stops means the
        # server went away mid-answer (the connection closed cleanly between chunks).
        raise RemoteEngineError(f"{url}: stream ended without [DONE]", retryable=True, url=url)


def stream_error(event: Any, url: str) -> RemoteEngineError | None:
    """An error object sent inside a stream (both servers do this after the 200 header went out)."""
    if isinstance(event, dict) and isinstance(event.get("error"), dict | str):
        err = event["error"]
        message = err.get("message", str(err)) if isinstance(err, dict) else err
        code = err.get("code") if isinstance(err, dict) else None
        status = code if isinstance(code, int) else None
        return RemoteEngineError(
            f"{url}: error in stream: {message}",
            retryable=status is None or status in RETRYABLE_STATUS,
            status=status,
            url=url,
        )
    return None


class RemoteEngine:
    """What the vLLM and SGLang engines share: identity, context length, version, lifecycle.

    Subclasses implement ``_discover`` (served model name and context length, at ``start``),
    ``generate``, ``_install_weights`` and ``health``.
    """

    kind = "remote"

    def __init__(
        self,
        base_url: str,
        tokenizer: PolicyTokenizer,
        *,
        model: str | None = None,
        context_length: int | None = None,
        request_timeout_s: float = 600.0,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self._tokenizer = tokenizer
        self._model = model
        self._configured_context = context_length
        self._context_length = context_length or tokenizer.max_position_embeddings or 32768
        self._version = 0
        self._http_args = {"timeout_s": request_timeout_s, "api_key": api_key, "transport": transport}
        self._http: HttpUpstream | None = None

    @property
    def model_name(self) -> str:
        return self._model or "unknown"

    @property
    def tokenizer(self) -> PolicyTokenizer:
        return self._tokenizer

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def http(self) -> HttpUpstream:
        if self._http is None:
            raise UpstreamError(f"{self.kind} engine at {self.base_url} used before start()")
        return self._http

    async def start(self) -> None:
        if self._http is None:
            self._http = HttpUpstream(self.base_url, **self._http_args)  # type: ignore[arg-type]
        served_model, served_context = await self._discover()
        if self._model is None:
            self._model = served_model
        if served_context:
            # The server's limit is the truth; a configured one may only lower it.
            self._context_length = min(served_context, self._configured_context or served_context)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def _check_prompt(self, prompt_ids: Sequence[int], max_tokens: int) -> int:
        """The token budget left for this prompt; rejects prompts that leave none (not retryable)."""
        if len(prompt_ids) >= self._context_length:
            raise ContextLengthExceeded(
                f"prompt has {len(prompt_ids)} tokens; the context length is {self._context_length}",
                param="messages",
            )
        return min(max_tokens, self._context_length - len(prompt_ids))

    async def update_weights(self, update: WeightUpdate) -> None:
        if update.checkpoint_dir is None:
            raise ConfigError(
                f"{self.kind} engine at {self.base_url}: weight updates need a checkpoint_dir "
                "(a state dict cannot be sent over HTTP)"
            )
        await self._install_weights(update.checkpoint_dir, update.version)
        self._version = update.version

    async def _discover(self) -> tuple[str | None, int | None]:
        raise NotImplementedError

    async def _install_weights(self, checkpoint_dir: str, version: int) -> None:
        raise NotImplementedError
