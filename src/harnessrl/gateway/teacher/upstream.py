"""The teacher's upstream: an OpenAI-compatible chat endpoint and the key to it.

``Teacher`` holds the upstream's address and key (read from the gateway process's environment by the
entry point): the key is sent to the upstream and nowhere else — not in the store, the log, a repr or
an answer; an upstream error message that echoes it is redacted (``upstream_error``). Every API the
harness speaks is served from this one chat endpoint (``teacher.chat``, ``teacher.messages``,
``teacher.responses``), through ``complete`` (a whole answer) and ``teacher.stream.ChatStream`` (a
streamed one, chunk by chunk, which fails unless the upstream finished it). Answers are read within
bounds by ``teacher.reading`` and recorded by ``teacher.recording``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import httpx

from harnessrl.errors import ConfigError, UpstreamError
from harnessrl.gateway.errors import HTTPStatusError
from harnessrl.gateway.teacher.reading import read_bounded, without_surrogates

log = logging.getLogger("harnessrl.gateway")

#: The Anthropic API version sent when the harness names none.
ANTHROPIC_VERSION = "2023-06-01"

__all__ = ["Teacher", "complete", "upstream_error"]

T = TypeVar("T")

#: How much of an upstream's error body (not JSON) the harness is shown.
ERROR_TEXT_CHARS = 200

#: How much of an upstream's error message (its JSON ``error.message``, a stream's error) is shown.
ERROR_MESSAGE_CHARS = 4000

#: The most characters one character of the key can be written as (``%F0%9F%98%80``).
ECHO_CHARS = 12

#: How many idle connections to the upstream are kept open for the next calls.
UPSTREAM_IDLE_CONNECTIONS = 100

#: A key an HTTP header carries as it is: printable ASCII, with no space at either end.
HEADER_SAFE_KEY = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")


class Teacher:
    """An upstream OpenAI-compatible chat endpoint and the key to it (never logged or shown)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        *,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
        api: str = "chat",
        length_field: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # How long the upstream may send nothing, keep-alives aside (``quiet_for``).
        self.timeout_s = timeout_s
        self.model = model
        # The answer-length field the upstream's chat completions take (``engine.teacher.length_field``).
        self.length_field = length_field
        # "chat": every API translated to the upstream's chat completions; "native": Messages and
        # Responses forwarded to the upstream's own /messages and /responses (``teacher.native``).
        self.api = api
        check_key(api_key)
        self._key = api_key
        self._key_pattern = key_pattern(api_key) if api_key else None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No cap on connections to the upstream (httpx's default is 100): a call past it waited in
        # the gateway with nothing sent to its harness, not even a keep-alive, until a connection
        # freed or ``timeout_s`` ended it with a 502. The gateway's own limits (``gateway.
        # max_connections``, the calls a rollout may have at once) bound how many there are.
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=UPSTREAM_IDLE_CONNECTIONS),
        )

    def __repr__(self) -> str:  # the key stays out of every repr and log line
        return f"Teacher({self.base_url!r}, model={self.model!r})"

    def probe(self) -> None:
        """Check the upstream answers (``GET /models``); a ``ConfigError`` naming ``engine`` if not."""
        try:
            reply = httpx.get(f"{self.base_url}/models", headers=self._client.headers, timeout=10.0)
            if self.api == "native" and reply.status_code in (401, 403) and self._key:
                # Anthropic's API takes its key as x-api-key, with a version.
                headers = {"x-api-key": self._key, "anthropic-version": ANTHROPIC_VERSION}
                reply = httpx.get(f"{self.base_url}/models", headers=headers, timeout=10.0)
        except httpx.HTTPError as exc:
            raise ConfigError(
                f"engine.teacher.base_url {self.base_url!r} is not reachable ({type(exc).__name__})"
            ) from None
        if reply.status_code >= 400:
            raise ConfigError(
                f"engine.teacher.base_url {self.base_url!r} answered GET /models with {reply.status_code}"
            )

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self.probe)

    async def aclose(self) -> None:
        await self._client.aclose()

    def anthropic_request(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Request:
        """A request to an upstream Anthropic API: the key as ``x-api-key``, not a bearer token."""
        request = self._client.build_request("POST", path, json=body, headers=headers)
        request.headers.pop("authorization", None)
        if self._key:
            request.headers["x-api-key"] = self._key
        return request

    def chat_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` as the upstream's ``/chat/completions`` gets it: ``model`` replaced, and its
        answer length in the field the upstream takes (``length_field``; ``None``: as sent): a
        harness's (or the cap's) ``max_tokens`` sent to an OpenAI reasoning model was a 400 on every
        call. Where a body holds both fields, the lower is kept."""
        out = {**body, "model": self.model}
        if self.length_field is None:
            return out
        other = "max_completion_tokens" if self.length_field == "max_tokens" else "max_tokens"
        if out.get(other) is None:
            out.pop(other, None)
            return out
        value = out.pop(other)
        kept = out.get(self.length_field)
        if kept is None or (_is_count(value) and _is_count(kept) and value < kept):
            out[self.length_field] = value
        return out

    def quiet_for(self, since: float) -> None:
        """``UpstreamError`` if the upstream's stream has carried nothing but keep-alives (SSE
        comments, Anthropic's ``ping``) since ``since`` (``time.monotonic()``) for over
        ``timeout_s``: each keep-alive began httpx's read timeout again, so a stream of them never
        ended, and its harness, which the gateway kept alive too, waited for ever."""
        if time.monotonic() - since > self.timeout_s:
            raise UpstreamError(f"teacher upstream sent only keep-alives for over {self.timeout_s:g} s")

    def redact(self, text: str, limit: int = ERROR_MESSAGE_CHARS) -> str:
        """``text`` (an upstream's error message, which may echo the key) without the key, however
        the upstream wrote it (``key_pattern``), cut after ``limit`` characters: the key is redacted
        before the cut (cut first, a key across it would show its head), and only as far into the
        text as an echo beginning before the cut reaches (searching all of a 64 MiB error held the
        event loop for seconds)."""
        if self._key_pattern is None or self._key is None:
            return text[:limit]
        window = text[: limit + ECHO_CHARS * len(self._key)]
        out: list[str] = []
        at = 0
        for echo in self._key_pattern.finditer(window):
            if echo.start() >= limit:
                break
            out += [window[at : echo.start()], "[teacher key]"]
            at = echo.end()
        if at < limit:
            out.append(window[at:limit])
        return "".join(out)


def check_key(key: str | None) -> None:
    """``ConfigError`` naming ``engine.teacher.api_key_env``, never showing the key, if ``key`` cannot
    go in a header as it is: a non-ASCII character was a ``UnicodeEncodeError`` traceback at start-up,
    and a line end (a key file read whole) made the probe say the upstream was "not reachable"."""
    if key and not HEADER_SAFE_KEY.fullmatch(key):
        raise ConfigError(
            "engine.teacher.api_key_env: the key holds a line end, a control or a non-ASCII character, "
            "or a space at an end, which an HTTP header does not carry as it is (the key is not "
            "shown); set it to the key alone"
        )


def key_pattern(key: str) -> re.Pattern[str]:
    """The key as an upstream's message may echo it: each character as itself, percent-encoded (a
    URL or query the upstream quotes back: ``sk-a/b+c`` as ``sk-a%2Fb%2Bc``, in either case) or
    JSON-escaped (``\\/``, ``\\u002f``: a body that is not the error shape is shown as its text).
    Only the key's literal text was redacted: a key with ``/``, ``+`` or ``=`` (base64) echoed in a
    URL reached the harness and the log whole."""
    parts = []
    for char in key:
        forms = {char, "".join(f"%{byte:02x}" for byte in char.encode()), json.dumps(char)[1:-1]}
        if ord(char) <= 0xFFFF:
            forms.add(f"\\u{ord(char):04x}")
        if char == "/":
            forms.add("\\/")
        if char == " ":
            forms.add("+")
        parts.append("(?:" + "|".join(re.escape(form) for form in sorted(forms)) + ")")
    return re.compile("".join(parts), re.IGNORECASE)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: Upstream statuses about the gateway's own credentials to the teacher (its key, its account, a proxy
#: in front of it), never about the harness's request: passed on, a 401 or 403 told the harness its
#: own key was refused (Claude Code and Codex then stop, or ask the user to log in again).
CREDENTIAL_STATUSES = frozenset({401, 403, 407})


def upstream_error(teacher: Teacher, status: int, body: bytes) -> UpstreamError | HTTPStatusError:
    """The upstream's refusal as the harness gets it: its 4xx kept, except a refusal of the gateway's
    own credentials (``CREDENTIAL_STATUSES``), which is a 502 like anything else. The key is
    redacted from the whole message before it is cut short (cut first, a key across the cut would
    show its head)."""
    try:
        message = teacher.redact(str(json.loads(body)["error"]["message"]))
    except (ValueError, KeyError, TypeError, RecursionError):
        message = teacher.redact(body.decode("utf-8", "replace"), ERROR_TEXT_CHARS)
    text = f"teacher upstream answered {status}: {message}"
    if 400 <= status < 500 and status not in CREDENTIAL_STATUSES:
        return HTTPStatusError(text, status=status)
    if status in CREDENTIAL_STATUSES:
        log.error("the teacher upstream refused the gateway's credentials (engine.teacher): %s", text)
    return UpstreamError(text)


async def complete(teacher: Teacher, body: dict[str, Any], limit: int) -> dict[str, Any]:
    """A whole chat completion of ``body`` (``model`` set here), read up to ``limit`` bytes
    (``gateway.max_body_bytes``); errors as the harness gets them."""
    try:
        async with teacher._client.stream("POST", "/chat/completions", json=teacher.chat_body(body)) as reply:
            content = await read_bounded(reply, limit)
    except httpx.HTTPError as exc:
        raise UpstreamError(f"teacher upstream failed: {type(exc).__name__}") from None
    if reply.status_code != 200:
        raise upstream_error(teacher, reply.status_code, content)
    try:
        answer = without_surrogates(json.loads(content))
        answer["choices"][0]["message"].get("content")
    # RecursionError: JSON nested past Python's limit, a 500 "internal error" (cut streams elsewhere).
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
        raise UpstreamError("teacher upstream answered 200 without a chat completion") from None
    return answer
