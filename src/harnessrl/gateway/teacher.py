"""Teacher mode: a rollout's chat calls answered by an upstream OpenAI-compatible server, recorded.

Instead of the policy, an upstream chat-completions endpoint (``engine.teacher``) answers the
harness's ``/v1/chat/completions`` calls. The gateway forwards the body as it was received, with
``model`` replaced by the upstream's, and hands the harness the upstream's answer in its own shape
(whole, or its SSE chunks as they arrive). Each answered call is recorded like a policy call —
``Call.request`` as received, ``Call.response`` one OpenAI assistant message (``content``,
``tool_calls``, ``reasoning_content``), finish reason, usage, timing — which is what ``harnessrl
sft`` reads. No token ids: the teacher's tokens are not the student's; sft renders the text with
the student's template.

The upstream key is held here only (read from the gateway process's environment by the entry
point): it is sent to the upstream and nowhere else — not in the store, the log or an answer.

Failures: an upstream HTTP error reaches the harness as an OpenAI error with the upstream's status
(4xx) or 502; a stream the upstream ends without finishing (killed, cut) ends with an SSE error
event. Neither is recorded: only an answer the upstream finished is a call.

Not here yet: the Anthropic Messages and OpenAI Responses APIs (they answer 400 in teacher mode).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from harnessrl.errors import ConfigError, HarnessRLError, UpstreamError
from harnessrl.gateway.auth import authorize_rollout, open_rollout
from harnessrl.gateway.bodies import decode_body, read_body
from harnessrl.gateway.errors import HTTPStatusError, RolloutClosed, sse_error
from harnessrl.gateway.pipeline.wire import SSE_HEADERS, json_response
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Call, Rollout, Usage, now
from harnessrl.store.base import RolloutEnded

log = logging.getLogger("harnessrl.gateway")

__all__ = ["Teacher", "teacher_chat"]


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
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport
        )

    def __repr__(self) -> str:  # the key stays out of every repr and log line
        return f"Teacher({self.base_url!r}, model={self.model!r})"

    def probe(self) -> None:
        """Check the upstream answers (``GET /models``); a ``ConfigError`` naming ``engine`` if not."""
        try:
            reply = httpx.get(f"{self.base_url}/models", headers=self._client.headers, timeout=10.0)
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

    def redact(self, text: str) -> str:
        """``text`` (an upstream's error message, which may echo the key) without the key."""
        return text.replace(self._key, "[teacher key]") if self._key else text


def upstream_error(teacher: Teacher, status: int, body: bytes) -> UpstreamError | HTTPStatusError:
    """The upstream's refusal as the harness gets it: its 4xx kept, anything else a 502."""
    try:
        message = str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode("utf-8", "replace")
    text = f"teacher upstream answered {status}: {teacher.redact(message)}"
    if 400 <= status < 500:
        return HTTPStatusError(text, status=status)
    return UpstreamError(text)


def answer_message(message: dict[str, Any]) -> dict[str, Any]:
    """The recorded assistant message of an upstream's ``choices[0].message`` (sft's shape)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        out["reasoning_content"] = reasoning
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


class StreamedMessage:
    """The assistant message a chat stream's deltas add up to."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self.reasoning.append(reasoning)
            for tc in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(
                    tc.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            out["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            out["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return out


async def record(
    state: GatewayState,
    rollout: Rollout,
    data: dict[str, Any],
    response: dict[str, Any],
    finish_reason: str,
    usage: dict[str, Any] | None,
    started_at: float,
    first_token_at: float | None,
) -> Call:
    """Make the teacher's answered call durable (before the harness has all of it)."""
    usage = usage or {}
    call = Call.model_construct(
        rollout_id=rollout.rollout_id,
        attempt=rollout.attempt,
        api="chat.completions",
        request=data,
        response=response,
        prompt_token_ids=[],
        response_token_ids=[],
        response_logprobs=[],
        policy_version=0,
        finish_reason=finish_reason,
        usage=Usage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        ),
        started_at=started_at,
        first_token_at=first_token_at,
        finished_at=now(),
        call_id=None,
    )
    try:
        return await state.writer.add(call)
    except RolloutEnded:  # ended by someone this gateway did not hear: refused, as the policy path does
        raise RolloutClosed(f"rollout {rollout.rollout_id!r} ended; it takes no more calls") from None


async def teacher_chat(request: Request, teacher: Teacher) -> Response:
    """``POST /v1/chat/completions`` answered by the teacher; raises ``HarnessRLError``s the app's
    handlers answer in OpenAI's shape."""
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    data = decode_body(await read_body(request, state.config.max_body_bytes))
    rollout = await open_rollout(state, rollout)
    body = {**data, "model": teacher.model}
    started_at = now()
    if not data.get("stream"):
        try:
            reply = await teacher._client.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"teacher upstream failed: {type(exc).__name__}") from None
        if reply.status_code != 200:
            raise upstream_error(teacher, reply.status_code, reply.content)
        try:
            answer = reply.json()
            choice = answer["choices"][0]
            message = answer_message(choice["message"])
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise UpstreamError("teacher upstream answered 200 without a chat completion") from None
        stored = await record(
            state,
            rollout,
            data,
            message,
            choice.get("finish_reason") or "stop",
            answer.get("usage"),
            started_at,
            None,
        )
        return json_response(answer, headers=_headers(stored))
    # Streamed: usage is asked for so it can be recorded; a usage-only chunk the harness did not
    # ask for is not passed on.
    wants_usage = bool((data.get("stream_options") or {}).get("include_usage"))
    body["stream_options"] = {**(data.get("stream_options") or {}), "include_usage": True}
    upstream = teacher._client.stream("POST", "/chat/completions", json=body)
    try:
        reply = await upstream.__aenter__()
    except httpx.HTTPError as exc:
        raise UpstreamError(f"teacher upstream failed: {type(exc).__name__}") from None
    if reply.status_code != 200:
        content = await reply.aread()
        await upstream.__aexit__(None, None, None)
        raise upstream_error(teacher, reply.status_code, content)
    return StreamingResponse(
        _relay(teacher, state, rollout, data, reply, upstream, wants_usage, started_at),
        headers={**SSE_HEADERS, "x-harnessrl-rollout-id": rollout.rollout_id},
    )


async def _relay(
    teacher: Teacher,
    state: GatewayState,
    rollout: Rollout,
    data: dict[str, Any],
    reply: httpx.Response,
    upstream: Any,
    wants_usage: bool,
    started_at: float,
) -> AsyncIterator[str]:
    """The upstream's chunks as they come; ``[DONE]`` only after the call is recorded."""
    message = StreamedMessage()
    first_token_at: float | None = None
    done = False
    try:
        try:
            async for line in reply.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        said = teacher.redact(str(chunk["error"].get("message", "error")))
                        raise UpstreamError(f"teacher upstream: {said}")
                    message.feed(chunk)
                except (ValueError, KeyError, TypeError, AttributeError):
                    raise UpstreamError("teacher upstream sent a chunk that is not a chat chunk") from None
                if first_token_at is None and chunk.get("choices"):
                    first_token_at = now()
                if chunk.get("choices") or wants_usage:
                    yield f"data: {payload}\n\n"
        except httpx.HTTPError as exc:
            raise UpstreamError(f"teacher upstream stream broke: {type(exc).__name__}") from None
        if not done or message.finish_reason is None:
            raise UpstreamError("teacher upstream ended the stream before finishing the answer")
        await record(
            state,
            rollout,
            data,
            message.message(),
            message.finish_reason,
            message.usage,
            started_at,
            first_token_at,
        )
        yield "data: [DONE]\n\n"
    except HarnessRLError as exc:  # its 200 was sent: the error is the stream's last event
        log.warning("teacher call of rollout %s not recorded: %s", rollout.rollout_id, exc)
        yield sse_error(exc)
    finally:
        await upstream.__aexit__(None, None, None)


def _headers(stored: Call) -> dict[str, str]:
    return {"x-harnessrl-rollout-id": stored.rollout_id, "x-harnessrl-call-seq": str(stored.seq)}
