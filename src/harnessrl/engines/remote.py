"""HTTP plumbing shared by the remote engines (vLLM, SGLang): one client, one error boundary.

Every failure of a remote inference server leaves this module as :class:`RemoteEngineError` (an
``UpstreamError``) that says whether trying again can help: connection errors, timeouts, a stream
cut short, HTTP 429 and 5xx are *retryable*; other 4xx (a malformed request, an unknown model) are
not. The :class:`~harnessrl.engines.pool.EnginePool` decides what to do with that; a single remote
engine never retries by itself, so a retry policy lives in exactly one place.

The client is our own (:mod:`harnessrl.engines.http_client`: asyncio + httptools, ~0.2 ms less
gateway CPU per model call than aiohttp, which itself costs ~1 ms less than httpx with a 16 k-token
prompt); aiohttp stays for an upstream reached through an HTTP(S) proxy, which it implements exactly.
JSON goes through orjson.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlencode

import aiohttp
import orjson
from aiohttp.helpers import basicauth_from_netrc, get_env_proxy_for_url, netrc_from_env
from yarl import URL

from harnessrl.engines.base import WeightUpdate
from harnessrl.engines.http_client import Answer, HttpClient, HttpClientError
from harnessrl.engines.proxied_client import ProxiedClient
from harnessrl.engines.sse import BadEvent, LineTooLong, SseLines, loads, parse_events
from harnessrl.errors import ConfigError, ContextLengthExceeded, GenerationAborted, UpstreamError

if TYPE_CHECKING:
    from harnessrl.tokenizer import PolicyTokenizer

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# What a request can fail with below HTTP: refused, reset, timed out, a body cut short.
_TRANSPORT_ERRORS = (HttpClientError, aiohttp.ClientError, TimeoutError, OSError)
# uvicorn (vLLM's and SGLang's server) closes a connection idle for 5 s: a call after a lull must not be
# written into a socket the server is closing.
IDLE_CONNECTION_S = 4.0


def dumps(value: Any) -> bytes:
    """A request body. Prompts are lists of thousands of token IDs: ``json.dumps`` takes milliseconds
    on 16 k of them, orjson ~50 µs."""
    return orjson.dumps(value)


class RemoteEngineError(UpstreamError):
    """A remote engine failed. ``retryable``: the same request may succeed later or elsewhere."""

    def __init__(self, message: str, *, retryable: bool, status: int | None = None, url: str = ""):
        super().__init__(message)
        self.retryable = retryable
        self.status = status  # HTTP status, or None for transport errors (connection refused, reset)
        self.url = url

    #: Whether the pool may continue a generation this error cut short on another replica.
    continuable = True

    @property
    def is_overload(self) -> bool:
        """429/503: the server is alive but busy, so backing off beats marking it unhealthy."""
        return self.status in (429, 503)


class MalformedAnswer(RemoteEngineError):
    """The server's answer breaks the protocol the engine relies on: no finish reason, a finish reason
    that contradicts the tokens, a sampled token's logprob that is null, not finite or above 0, a
    token ID that is not an integer in the vocabulary, more tokens than ``max_tokens``, several
    choices. Such an answer is never recorded. Retryable: a server (or a proxy) that garbled one
    answer may answer the same request whole on the next try or another replica."""

    def __init__(self, message: str, *, url: str = ""):
        super().__init__(f"{url}: malformed answer: {message}", retryable=True, url=url)


class AbortedByEngine(RemoteEngineError, GenerationAborted):
    """The server ended a generation itself (vLLM's ``finish_reason`` ``abort`` or ``error``, SGLang's
    ``{"type": "abort"}``): the answer is not the policy's and must not be recorded. Retryable from
    the prompt, but never continued mid-stream (``continuable`` is false): a server paused with
    ``mode=abort`` usually has its weights changed next, and one answer must not mix two policies."""

    continuable = False

    def __init__(self, message: str, *, url: str = ""):
        super().__init__(message, retryable=True, url=url)

    @property
    def is_overload(self) -> bool:
        return True  # the server is alive: back off and try again, do not mark it unhealthy


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, RemoteEngineError) and exc.retryable


def _status_error(method: str, url: str, status: int, reason: str, body: bytes) -> RemoteEngineError:
    detail = body[:300].decode("utf-8", "replace").strip() or reason
    return RemoteEngineError(
        f"{method} {url} answered {status}: {detail}",
        retryable=status in RETRYABLE_STATUS,
        status=status,
        url=url,
    )


def _transport_error(exc: BaseException, url: str) -> RemoteEngineError:
    # Every transport-level failure (refused, reset, timed out, truncated chunked body) is
    # retryable: the request may not have reached the server, or the server died while answering.
    return RemoteEngineError(f"{url}: {type(exc).__name__}: {exc}", retryable=True, url=url)


class _Body(Protocol):
    """A streamed answer: :class:`~harnessrl.engines.http_client.Stream` or ``ProxiedStream``."""

    status: int
    reason: str

    def chunks(self, interval_s: float = 0.0) -> AsyncIterator[bytes]: ...

    async def read(self) -> bytes: ...


class _Client(Protocol):
    """What ``HttpUpstream`` needs of a client: :class:`HttpClient`, or :class:`ProxiedClient`."""

    async def request(
        self, method: str, path: str, body: bytes | None = None, *, timeout_s: float | None = None
    ) -> Answer: ...

    def stream(
        self, method: str, path: str, body: bytes | None = None
    ) -> AbstractAsyncContextManager[_Body]: ...

    async def aclose(self) -> None: ...


class HttpUpstream:
    """One server's HTTP client, translating every failure into ``RemoteEngineError``.

    The client is made on first use, inside the event loop that uses it: our :class:`HttpClient`, or
    aiohttp (:class:`ProxiedClient`) when the environment routes the server through a proxy
    (``HTTP_PROXY``, ``NO_PROXY``, as with most HTTP clients). ``.netrc`` credentials for the host are
    used when no API key is given. Both are read once, when the client is made: aiohttp's
    ``trust_env`` would look them up again on every request, with two thread-pool hops (and a
    ``.netrc`` read) per model call.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        api_key: str | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        # Generations stream for minutes; only connecting should fail fast (a dead replica is
        # found in seconds, not after the whole read timeout). The read timeout is the longest
        # silence between two reads.
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = timeout_s
        self._backend: _Client | None = None

    def _client(self) -> _Client:
        if self._backend is None:
            proxy, auth = _env_settings(URL(self.base_url), netrc=not self._headers)
            if proxy:
                self._backend = ProxiedClient(
                    self.base_url,
                    proxy=proxy,
                    auth=auth,
                    headers=self._headers,
                    timeout=aiohttp.ClientTimeout(
                        total=None, sock_connect=self._connect_timeout_s, sock_read=self._read_timeout_s
                    ),
                    idle_timeout_s=IDLE_CONNECTION_S,
                )
            else:
                headers = {"authorization": auth.encode()} if auth is not None else self._headers
                self._backend = HttpClient(
                    self.base_url,
                    connect_timeout_s=self._connect_timeout_s,
                    read_timeout_s=self._read_timeout_s,
                    idle_timeout_s=IDLE_CONNECTION_S,
                    headers=headers,
                )
        return self._backend

    async def aclose(self) -> None:
        if self._backend is not None:
            backend, self._backend = self._backend, None
            await backend.aclose()

    async def request_json(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """The answer's JSON (``None`` for an empty body; its text if it is not JSON). ``timeout_s``
        bounds the whole call instead of the connect and read timeouts."""
        url = f"{self.base_url}{path}"
        target = f"{path}?{urlencode(params, quote_via=quote)}" if params else path
        body = None if json_body is None else dumps(json_body)
        try:
            answer = await self._client().request(method, target, body, timeout_s=timeout_s)
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, url) from exc
        if answer.status >= 400:
            raise _status_error(method, url, *answer)
        if not answer.body:
            return None
        try:
            return loads(answer.body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return answer.body.decode("utf-8", "replace")

    @asynccontextmanager
    async def stream_sse(
        self, path: str, json_body: Any, *, interval_s: float = 0.0
    ) -> AsyncIterator[AsyncIterator[list[Any]]]:
        """POST and iterate the server-sent events' ``data:`` payloads as JSON (``[DONE]`` ends it),
        a list at a time: the events of one piece of the body, as it arrived (with ``interval_s``: of
        what arrived in each interval, ``Stream.chunks``).

        Leaving before the body's end (or being cancelled) closes the connection, which aborts the
        request server-side.
        """
        url = f"{self.base_url}{path}"
        try:
            async with self._client().stream("POST", path, dumps(json_body)) as response:
                if response.status >= 400:
                    raise _status_error("POST", url, response.status, response.reason, await response.read())
                yield _events(response.chunks(interval_s), url)
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, url) from exc


def _env_settings(url: URL, *, netrc: bool) -> tuple[dict[str, Any], aiohttp.BasicAuth | None]:
    """What ``trust_env=True`` would find for ``url``: the proxy (``HTTP(S)_PROXY`` unless ``NO_PROXY``
    exempts the host) as request arguments, and, if ``netrc``, the host's ``.netrc`` credentials."""
    proxy: dict[str, Any] = {}
    try:
        proxy_url, proxy_auth = get_env_proxy_for_url(url)
    except LookupError:
        pass
    else:
        proxy = {"proxy": proxy_url, "proxy_auth": proxy_auth}
    auth = None
    if netrc and url.host is not None:
        with suppress(LookupError):  # no .netrc, or no entry for this host
            auth = basicauth_from_netrc(netrc_from_env(), url.host)
    return proxy, auth


async def _events(chunks: AsyncIterator[bytes], url: str) -> AsyncIterator[list[Any]]:
    """The ``data:`` payloads of an SSE body, parsed as JSON, up to ``data: [DONE]``: one list per
    piece of the body as it arrives (``chunks``), of the events that piece completed (never empty).

    The parsing is :mod:`harnessrl.engines.sse`'s, a read at a time. After ``[DONE]`` the rest of the
    body is read, so the connection goes back to the pool instead of being closed (a new TCP
    connection per call otherwise).
    """
    lines = SseLines()
    try:
        async for chunk in chunks:
            try:
                payloads = lines.feed(chunk)  # nothing once [DONE] was seen: the rest is drained
            except LineTooLong as exc:
                raise RemoteEngineError(f"{url}: {exc}", retryable=True, url=url) from exc
            if not payloads:
                continue
            try:
                events = parse_events(payloads)
            except BadEvent as bad:
                if bad.parsed:
                    yield bad.parsed
                raise RemoteEngineError(f"{url}: {bad}", retryable=True, url=url) from bad.__cause__
            yield events
    except _TRANSPORT_ERRORS as exc:
        raise _transport_error(exc, url) from exc
    if not lines.finish():
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


def lora_adapter_name(version: int) -> str:
    """The name a server knows policy ``version``'s LoRA adapter by (and calls ask for)."""
    return f"harnessrl-lora-v{version}"


def is_adapter_dir(folder: str) -> bool:
    """A PEFT adapter folder, not a Hugging Face model folder."""
    return (Path(folder) / "adapter_config.json").exists() and not (Path(folder) / "config.json").exists()


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
    ):
        self.base_url = base_url.rstrip("/")
        self._tokenizer = tokenizer
        self._model = model
        self._configured_context = context_length
        self._context_length = context_length or tokenizer.max_position_embeddings or 32768
        self._version = 0
        #: The LoRA adapter calls go to (``lora_adapter_name`` of the version), None: the base model.
        self._adapter: str | None = None
        self._http_args = {"timeout_s": request_timeout_s, "api_key": api_key}
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
    def shares_weights(self) -> bool:
        return True

    @property
    def http(self) -> HttpUpstream:
        if self._http is None:
            raise UpstreamError(f"{self.kind} engine at {self.base_url} used before start()")
        return self._http

    async def start(self) -> None:
        if self._http is None:
            self._http = HttpUpstream(self.base_url, **self._http_args)  # type: ignore[arg-type]
        served_model, served_context = await self._discover()
        if served_context is not None and not (type(served_context) is int and served_context > 0):
            # Taken as it is, a length that is text would fail every call (a TypeError), not start.
            raise ConfigError(
                f"the {self.kind} server at {self.base_url} reports a context length of "
                f"{str(served_context)[:40]!r}, not a positive integer (is it {self.kind}?)"
            )
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

    @property
    def served_adapter(self) -> str | None:
        """The LoRA adapter this engine's calls go to (None: the base model)."""
        return self._adapter

    async def update_weights(self, update: WeightUpdate) -> None:
        """A Hugging Face folder replaces the served weights; a PEFT adapter folder
        (``adapter_config.json``) is loaded beside them as a new adapter named for the version
        (``lora_adapter_name``), calls from now on go to it, and the previous one is unloaded
        (callers drained its calls first: the pause)."""
        if update.checkpoint_dir is None:
            raise ConfigError(
                f"{self.kind} engine at {self.base_url}: weight updates need a checkpoint_dir "
                "(a state dict cannot be sent over HTTP)"
            )
        if is_adapter_dir(update.checkpoint_dir):
            name = lora_adapter_name(update.version)
            previous = self._adapter
            if previous == name and not self.reloads_adapters_in_place:
                # The same version again (a resumed run's restore): reload it. A server that loads
                # over a name in place keeps serving the old copy if the load fails; here calls
                # to it fail until a load succeeds.
                await self._unload_adapter(name)
            try:
                await self._load_adapter(name, update.checkpoint_dir)
            except RemoteEngineError as exc:
                if exc.status is None or exc.status >= 500:
                    raise
                raise ConfigError(
                    f"trainer.lora: the {self.kind} server at {self.base_url} cannot load the adapter "
                    f"({exc}); start it with LoRA on and a max rank >= trainer.lora.r "
                    "(`harnessrl engine serve --lora-rank R` does)"
                ) from exc
            self._adapter, self._version = name, update.version
            if previous is not None and previous != name:
                try:
                    await self._unload_adapter(previous)
                except RemoteEngineError as exc:  # calls went to the new one already: only memory
                    log.warning(
                        "%s at %s: unloading adapter %s failed: %s", self.kind, self.base_url, previous, exc
                    )
            return
        await self._install_weights(update.checkpoint_dir, update.version)
        self._adapter, self._version = None, update.version

    async def release_weights(self) -> bool:
        return False  # the server holds the weights, in its own process

    def adopt_policy_version(self, version: int) -> None:
        """The weights were installed in the shared server by someone else (the trainer, or another
        gateway's engine): label calls from now on with ``version`` (and, serving LoRA adapters,
        send them to that version's adapter)."""
        self._version = version
        if self._adapter is not None:
            self._adapter = lora_adapter_name(version)

    #: Whether ``_load_adapter`` replaces an adapter already loaded under the same name (vLLM's
    #: ``load_inplace``): then a reload needs no unload first.
    reloads_adapters_in_place = False

    async def _load_adapter(self, name: str, folder: str) -> None:
        raise ConfigError(f"{self.kind} engine at {self.base_url}: cannot load LoRA adapters")

    async def _unload_adapter(self, name: str) -> None:
        raise ConfigError(f"{self.kind} engine at {self.base_url}: cannot load LoRA adapters")

    async def _discover(self) -> tuple[str | None, int | None]:
        raise NotImplementedError

    async def _install_weights(self, checkpoint_dir: str, version: int) -> None:
        raise NotImplementedError
