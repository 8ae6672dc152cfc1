"""``POST /v1/messages`` in teacher mode: an Anthropic Messages call answered by the chat upstream.

The request is translated with the converter the policy path uses (``anthropic_convert``: system,
text, tool_use/tool_result, thinking -> internal chat messages; custom tools -> function tools) plus
the sampling fields (``max_tokens``, ``temperature``, ``top_p``, ``stop_sequences`` -> ``stop``,
``tool_choice`` auto/any/tool/none, ``disable_parallel_tool_use``). ``thinking`` and ``top_k`` are
not sent: chat has no portable field for them (the teacher reasons as its upstream is set up to).

The upstream's answer comes back in Anthropic's shapes, whole or as Anthropic's event sequence
(``message_start``; per block ``content_block_start`` / ``_delta`` / ``_stop``; ``message_delta``;
``message_stop``; ``ping`` while the upstream gives nothing to send for ``keepalive_s``), built by
one ``message_blocks.MessageBlocks`` for both so they agree: its reasoning as a
``thinking`` block (with the gateway's stand-in signature, as the policy path gives), its text as a
``text`` block, each tool call as a ``tool_use`` block with the upstream's call id and its arguments
as ``input`` (streamed as one ``input_json_delta`` when the call is complete, as the policy path
does; arguments that are not a JSON object are an upstream error). Thinking and text stream as the
upstream sends them. ``finish_reason`` -> ``stop_reason``: ``tool_calls`` -> ``tool_use``, ``length``
-> ``max_tokens``, a stop string vLLM names in ``stop_reason`` -> ``stop_sequence``, else ``end_turn``.

Recorded with ``api="messages"`` as the policy path records: the request as received, the answer as
the internal assistant message the harness's blocks read back to (``anthropic_convert``), before
``message_delta``/``message_stop`` go out. Errors are Anthropic's (``{"type": "error", ...}``; an
``error`` event once the stream started) and leave nothing recorded.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from harnessrl.errors import HarnessRLError, UpstreamError
from harnessrl.gateway.apis.anthropic_convert import refuse_prefill, request_to_internal
from harnessrl.gateway.apis.anthropic_request import MessagesRequest
from harnessrl.gateway.auth import authorize_rollout, open_rollout
from harnessrl.gateway.bodies import parse_body, read_body, validate_body
from harnessrl.gateway.errors import anthropic_sse_error
from harnessrl.gateway.pipeline.delivery import CLIENT_GONE_STATUS
from harnessrl.gateway.pipeline.wire import SSE_HEADERS, json_response, sse_event
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.teacher.message_blocks import MessageBlocks
from harnessrl.gateway.teacher.native import native_messages
from harnessrl.gateway.teacher.recording import call_headers, record, unless_client_leaves
from harnessrl.gateway.teacher.sampling import teacher_sampling
from harnessrl.gateway.teacher.stream import ChatStream, Pacer, open_stream, whole_chunk
from harnessrl.gateway.teacher.upstream import Teacher, complete
from harnessrl.schemas import Rollout, now

log = logging.getLogger("harnessrl.gateway")

__all__ = ["chat_request", "teacher_messages"]

PING = 'event: ping\ndata: {"type": "ping"}\n\n'  # as apis.anthropic sends it


def _tool_choice(choice: Any) -> tuple[Any, bool | None]:
    """Anthropic's ``tool_choice`` as chat's, and ``parallel_tool_calls`` if it says."""
    if not isinstance(choice, dict):
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    if kind == "none":
        return "none", None
    return "auto", parallel


def chat_request(data: dict[str, Any]) -> dict[str, Any]:
    """The chat.completions body of a Messages request (``BadRequest`` if it is not a valid one)."""
    body = validate_body(MessagesRequest, data)
    messages, tools = request_to_internal(data)
    refuse_prefill(messages)  # as the policy path: the teacher answers a new turn, never continues one
    out: dict[str, Any] = {"messages": messages, "max_tokens": body.max_tokens}
    if tools:
        out["tools"] = tools
        choice, parallel = _tool_choice(data.get("tool_choice"))
        if choice is not None:
            out["tool_choice"] = choice
        if parallel is not None:
            out["parallel_tool_calls"] = parallel
    for key in ("temperature", "top_p"):
        if data.get(key) is not None:
            out[key] = data[key]
    if body.stop_strings():
        out["stop"] = body.stop_strings()
    return out


async def teacher_messages(request: Request, teacher: Teacher) -> Response:
    """``POST /v1/messages`` answered by the teacher; raises ``HarnessRLError``s the app's handlers
    answer in Anthropic's shape (the route is under ``/messages``)."""
    if teacher.api == "native":  # forwarded to the upstream's own /messages
        return await native_messages(request, teacher)
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    data = parse_body(await read_body(request, state.config.max_body_bytes))
    body = teacher_sampling(chat_request(data), rollout, state.config.max_tokens)  # 400s before it starts
    rollout = await open_rollout(state, rollout)
    model = data.get("model") or teacher.model
    msg_id = f"msg_{secrets.token_hex(12)}"
    stop: list[str] = body.get("stop") or []
    started_at = now()
    if not data.get("stream"):
        answer = await unless_client_leaves(
            request, state, rollout, "messages", lambda: complete(teacher, body, state.config.max_body_bytes)
        )
        if answer is None:
            return Response(status_code=CLIENT_GONE_STATUS)
        blocks = MessageBlocks(stop)
        try:
            blocks.feed(whole_chunk(answer))
        except (KeyError, TypeError, AttributeError):
            raise UpstreamError("teacher upstream answered 200 without a chat completion") from None
        blocks.finish()
        stop_reason, stop_sequence, finish = blocks.stop_reason()
        stored = await record(
            state, rollout, "messages", data, blocks.message(), finish, blocks.sum.usage, started_at, None
        )
        payload = {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks.blocks,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": blocks.usage(),
        }
        return json_response(payload, headers={**call_headers(stored), "request-id": msg_id})
    upstream = await open_stream(request, state, rollout, "messages", teacher, body)
    if upstream is None:
        return Response(status_code=CLIENT_GONE_STATUS)
    start = {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": MessageBlocks(stop).usage(),  # zeros: the upstream tells them at the end
    }
    return StreamingResponse(
        _relay(state, rollout, data, upstream, start, stop, started_at),
        media_type="text/event-stream",
        headers={**SSE_HEADERS, "request-id": msg_id, "x-harnessrl-rollout-id": rollout.rollout_id},
    )


async def _relay(
    state: GatewayState,
    rollout: Rollout,
    data: dict[str, Any],
    upstream: ChatStream,
    start: dict[str, Any],
    stop: list[str],
    started_at: float,
) -> AsyncIterator[str]:
    """Anthropic's event sequence from the upstream's chunks; the last two only after the record."""
    blocks = MessageBlocks(stop)
    try:
        yield sse_event({"type": "message_start", "message": start})
        # ``ping`` while the upstream is silent, or sends only what makes no event yet (a tool call).
        pacer = Pacer(state.keepalive_s)
        async for item in upstream.paced(state.keepalive_s):
            events = blocks.feed(item[1]) if item is not None else []
            for event in events:
                yield sse_event(event)
            if events or pacer.due():
                if not events:
                    yield PING
                pacer.sent()
        last = blocks.finish()  # raises before any of it is sent if a tool call is unusable
        for event in last:
            yield sse_event(event)
        stop_reason, stop_sequence, finish = blocks.stop_reason()
        await record(
            state,
            rollout,
            "messages",
            data,
            blocks.message(),
            finish,
            blocks.sum.usage,
            started_at,
            upstream.first_token_at,
        )
        usage = blocks.usage()
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]},
        }
        yield sse_event(delta)
        yield sse_event({"type": "message_stop"})
    except HarnessRLError as exc:  # its 200 was sent: the error is the stream's last event
        log.warning("teacher call of rollout %s not recorded: %s", rollout.rollout_id, exc)
        yield anthropic_sse_error(exc)
    finally:
        await upstream.aclose()
