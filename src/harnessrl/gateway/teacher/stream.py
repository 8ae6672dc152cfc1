"""A teacher's streamed chat answer, as the harness's API handlers read it.

``ChatStream`` opens the upstream's chat stream and yields its chunks (``paced`` adds keep-alive
ticks while the upstream is silent) and fails unless the upstream finished it;
``StreamedMessage`` adds the deltas up to the one assistant message that is recorded; ``Pacer``
tells a handler when the harness has heard nothing for ``keepalive_s``.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.requests import Request

from harnessrl.errors import UpstreamError
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.teacher.reading import bounded_lines, read_bounded, without_surrogates
from harnessrl.gateway.teacher.recording import NO_FINISH_REASON, unless_client_leaves, usage_counts
from harnessrl.gateway.teacher.upstream import Teacher, upstream_error
from harnessrl.schemas import Rollout, now

#: A chunk's JSON that may escape a lone surrogate (``reading.without_surrogates``): cheap to look
#: for in every chunk, and only then is the parsed chunk walked.
ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _text(value: Any) -> str:
    """A delta's text; ``TypeError`` (the upstream sent no chat chunk) for anything else: a number
    there failed the answer after its 200, with no error event and nothing recorded."""
    if not isinstance(value, str):
        raise TypeError(f"a chat delta's text is {type(value).__name__}")
    return value


#: The delta fields that are part of an answer (``role`` alone is not).
ANSWER_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls")


def carries_answer(chunk: dict[str, Any]) -> bool:
    """Whether ``chunk`` brings the answer on: a delta with text, reasoning or a tool call, a finish
    reason, or usage (sent once it is done). An upstream that sent chunks with none of these
    (``"choices": []``, an empty delta) every few seconds was never quiet for ``timeout_s``: its
    call waited for ever, its harness kept alive by the gateway's keep-alives."""
    if chunk.get("usage"):
        return True
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if choice.get("finish_reason") or any(delta.get(field) for field in ANSWER_FIELDS):
            return True
    return False


class StreamedMessage:
    """The assistant message a chat stream's deltas add up to."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}  # by index: id and name (``calls()`` for all)
        # Each call's arguments, written to a buffer: added to a string at every delta, a long call (a
        # file written through a tool) was copied whole at each, on the event loop (128 k deltas:
        # 16 s in which no other call of the gateway moved).
        self._arguments: dict[int, io.StringIO] = {}
        self.finish_reason: str | None = None
        self.stop_reason: Any = None  # vLLM's ``stop_reason``: the stop string that ended it, if any
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = usage_counts(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(_text(delta["content"]))
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self.reasoning.append(_text(reasoning))
            for tc in delta.get("tool_calls") or []:
                index = self._slot(tc)
                slot = self.tool_calls.setdefault(
                    index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                self._arguments.setdefault(index, io.StringIO()).write(_text(fn.get("arguments") or ""))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                self.stop_reason = choice.get("stop_reason")

    def _slot(self, tc: dict[str, Any]) -> int:
        """Which tool call a tool-call delta adds to: its ``index``; without one (Gemini's OpenAI API
        sends none, each call whole in one delta or its arguments over several), a delta with an id
        other than the last call's begins the next call, and one without an id continues the last.
        Every delta was call 0: two parallel calls were recorded as one, named ``ab``, with both
        arguments run together (a Messages stream failed on it, a Responses one sent it on)."""
        index = tc.get("index")
        if index is not None:
            if not isinstance(index, int) or isinstance(index, bool):
                raise TypeError(f"a tool call's index is {type(index).__name__}")
            return index
        if not self.tool_calls:
            return 0
        last = max(self.tool_calls)
        new_id = tc.get("id") and tc["id"] != self.tool_calls[last]["id"]
        return last + 1 if new_id else last

    def calls(self) -> list[dict[str, Any]]:
        """The tool calls so far, in index order, with their arguments."""
        return [
            {**call, "function": {**call["function"], "arguments": self._arguments[i].getvalue()}}
            for i, call in sorted(self.tool_calls.items())
        ]

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            out["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            out["tool_calls"] = self.calls()
        return out


class ChatStream:
    """One streamed chat completion from the upstream.

    ``await open()`` sends the request (usage asked for, so it can be recorded) and raises the
    upstream's refusal before any byte reaches the harness; iterating yields ``(payload, chunk)``
    for each ``data:`` event (the raw JSON text and its parsed form) and raises ``UpstreamError``
    if the stream breaks, carries an error, or ends before its ``[DONE]`` and finish reason.
    ``message`` is what the chunks added up to. Always ``aclose()`` it. ``paced`` iterates the same
    and also says when the harness is due a keep-alive.
    """

    def __init__(self, teacher: Teacher, body: dict[str, Any], limit: int) -> None:
        self.teacher = teacher
        self.limit = limit  # the most of one line (``gateway.max_body_bytes``: ``reading.bounded_lines``)
        options = {**(body.get("stream_options") or {}), "include_usage": True}
        body = {**teacher.chat_body(body), "stream": True, "stream_options": options}
        self._upstream = teacher._client.stream("POST", "/chat/completions", json=body)
        self._reply: httpx.Response | None = None
        self.message = StreamedMessage()
        self.first_token_at: float | None = None

    async def open(self) -> None:
        try:
            self._reply = await self._upstream.__aenter__()
        except httpx.HTTPError as exc:
            raise UpstreamError(f"teacher upstream failed: {type(exc).__name__}") from None
        if self._reply.status_code != 200:
            try:
                content = await read_bounded(self._reply, self.limit)
            except httpx.HTTPError as exc:
                raise UpstreamError(f"teacher upstream failed: {type(exc).__name__}") from None
            raise upstream_error(self.teacher, self._reply.status_code, content)

    async def aclose(self) -> None:
        if self._reply is not None:
            await self._upstream.__aexit__(None, None, None)
            self._reply = None

    async def __aiter__(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        assert self._reply is not None, "open() first"
        done = False
        last_data = time.monotonic()  # the last chunk that carried part of the answer
        try:
            async for line in bounded_lines(self._reply, self.limit):
                if not line.startswith("data:"):
                    self.teacher.quiet_for(last_data)  # a comment, or the blank line ending an event
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(payload)
                    if ESCAPED_SURROGATE.search(payload) and (clean := without_surrogates(chunk)) != chunk:
                        chunk, payload = clean, json.dumps(clean)  # as the harness gets it, and recorded
                    if "error" in chunk:
                        said = self.teacher.redact(str(chunk["error"].get("message", "error")))
                        raise UpstreamError(f"teacher upstream: {said}")
                    self.message.feed(chunk)
                except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
                    raise UpstreamError("teacher upstream sent a chunk that is not a chat chunk") from None
                if carries_answer(chunk):
                    last_data = time.monotonic()
                else:  # an empty delta, a choice-less chunk: a keep-alive in effect
                    self.teacher.quiet_for(last_data)
                if self.first_token_at is None and chunk.get("choices"):
                    self.first_token_at = now()
                yield payload, chunk
        except httpx.HTTPError as exc:
            raise UpstreamError(f"teacher upstream stream broke: {type(exc).__name__}") from None
        if not done or self.message.finish_reason is None:
            raise UpstreamError("teacher upstream ended the stream before finishing the answer")

    async def paced(self, keepalive_s: float) -> AsyncIterator[tuple[str, dict[str, Any]] | None]:
        """The chunks, and ``None`` whenever nothing came for ``keepalive_s`` (a teacher that thinks
        without streaming its reasoning, or a long tool call held back as one block): time for the
        API's keep-alive, as the policy path sends them, so a harness's idle timer does not fire."""
        chunks = self.__aiter__()
        pending: asyncio.Future[tuple[str, dict[str, Any]]] | None = None
        try:
            while True:
                if pending is None:  # one read at a time, kept across waits: a timeout cancels nothing
                    pending = asyncio.ensure_future(anext(chunks))
                done, _ = await asyncio.wait({pending}, timeout=keepalive_s)
                if not done:
                    yield None
                    continue
                try:
                    item = pending.result()
                except StopAsyncIteration:
                    return
                pending = None
                yield item
        finally:
            if pending is not None and not pending.done():
                pending.cancel()


async def open_stream(
    request: Request, state: GatewayState, rollout: Rollout, api: str, teacher: Teacher, body: dict[str, Any]
) -> ChatStream | None:
    """The upstream's stream of ``body``, opened (its status and headers came), or ``None`` if the
    harness left first: the upstream request is cancelled and the call counted as dropped, as a
    whole answer's is (``unless_client_leaves``). Waiting unwatched, a harness that gave up (a read
    timeout, then its SDK's retry) left its request open on a stalled upstream for up to
    ``timeout_s``, one more per retry."""
    upstream = ChatStream(teacher, body, state.config.max_body_bytes)

    async def opened() -> ChatStream:
        await upstream.open()
        return upstream

    try:
        if await unless_client_leaves(request, state, rollout, api, opened) is None:
            await upstream.aclose()
            return None
    except BaseException:
        await upstream.aclose()
        raise
    return upstream


class Pacer:
    """When a stream last sent the harness something: ``due()`` after ``keepalive_s`` of nothing."""

    def __init__(self, keepalive_s: float) -> None:
        self.keepalive_s = keepalive_s
        self.last = time.monotonic()

    def sent(self) -> None:
        self.last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.keepalive_s


def whole_chunk(answer: dict[str, Any]) -> dict[str, Any]:
    """A whole chat completion as the one chunk that streams it."""
    choice = answer["choices"][0]
    message = choice["message"]
    delta = {k: message.get(k) for k in ("content", "reasoning_content", "reasoning") if message.get(k)}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    stream_choice = {
        "index": 0,
        "delta": delta,
        "finish_reason": choice.get("finish_reason") or NO_FINISH_REASON,
        "stop_reason": choice.get("stop_reason"),
    }
    return {"choices": [stream_choice], "usage": answer.get("usage")}
