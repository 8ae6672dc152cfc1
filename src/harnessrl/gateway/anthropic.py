"""``POST /v1/messages`` (Anthropic Messages, streaming or not) and ``/v1/messages/count_tokens``.

Same life as a chat call (``calls.PreparedCall``): authenticate, validate, convert the request to
the internal conversation (``anthropic_convert.request_to_internal``, also what reuse after a
restart uses), build the prompt with sampled-token reuse, wait at the pause gate, generate, record
(``api="messages"``, the request as received, the internal assistant message as the response),
and only then hand the client the end of the answer. The answer's blocks come from
``anthropic_blocks.BlockAssembler``, for streaming and non-streaming alike.

Streaming follows Anthropic's event sequence: ``message_start``; per block ``content_block_start``,
``content_block_delta`` (``thinking_delta`` + ``signature_delta``, ``text_delta``,
``input_json_delta``), ``content_block_stop``; ``message_delta`` (stop reason, output tokens);
``message_stop``. ``ping`` events keep the connection alive while the call waits at a paused gateway
and whenever sampled tokens produce no event for ``keepalive_s`` (a long tool call is held back
until its block closes). Errors anywhere under ``/v1/messages`` are in Anthropic's shape
(``gateway.errors``); after the 200 header they arrive as an ``error`` event.

Per-call cost is chat's (issue 22): the converted messages are keyed incrementally
(``RolloutMemory.key_messages``; the conversion drops ``cache_control``, so Claude Code's moving
marker does not make the newest-but-one message look new), a trusted splice runs on the event loop
(``quick_prompt``), recording reuses the keys, a non-streaming answer is generated without a
per-token stream, and JSON is written with orjson.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from harnessrl.engines.base import SamplingParams
from harnessrl.errors import ConfigError, ContextLengthExceeded
from harnessrl.gateway.anthropic_blocks import BlockAssembler
from harnessrl.gateway.anthropic_convert import (
    CountTokensRequest,
    Internal,
    MessagesRequest,
    ThinkingParam,
    request_to_internal,
)
from harnessrl.gateway.auth import authorize_rollout, open_rollout
from harnessrl.gateway.bodies import read_json, validate_body
from harnessrl.gateway.calls import (
    PreparedCall,
    check_prompt_size,
    json_response,
    plan_prompt,
    rollout_sampling,
    run_to_end,
    sampling_params,
    sse,
    stream_error,
)
from harnessrl.gateway.chat import SSE_HEADERS
from harnessrl.gateway.conversation import (
    KeyedMessages,
    PromptPlan,
    key_messages,
)
from harnessrl.gateway.delivery import CallStream, respond_whole
from harnessrl.gateway.errors import RolloutClosed, anthropic_sse_error
from harnessrl.gateway.history import RolloutMemory
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.tool_parsers import Tools
from harnessrl.schemas import TERMINAL_STATUSES, Rollout

__all__ = ["count_tokens", "messages", "probe", "request_to_internal"]

PING = 'event: ping\ndata: {"type": "ping"}\n\n'


def _event(payload: dict[str, Any]) -> str:
    return f"event: {payload['type']}\n" + sse(payload)  # orjson: a stream sends one event per delta


def _template_kwargs(state: GatewayState, thinking: ThinkingParam | None, tools: Any) -> dict[str, Any]:
    """``thinking`` onto the template's reasoning switch (Qwen3's ``enable_thinking``) if it has one."""
    if thinking is None:
        return {}
    try:
        source = state.engine.tokenizer.get_chat_template(tools)
    except ConfigError:
        return {}  # no template: build_prompt reports it
    if "enable_thinking" not in source:
        return {}  # nothing to switch: accepted and ignored
    return {"enable_thinking": thinking.type != "disabled"}


async def _plan(
    request: Request,
    internal: Internal,
    thinking: ThinkingParam | None,
    memory: RolloutMemory,
    *,
    remember: bool = True,
) -> tuple[PromptPlan, KeyedMessages]:
    """The prompt of a converted request, and its messages keyed for recording.

    The internal messages are keyed incrementally (``RolloutMemory.key_messages``): the conversion
    drops ``cache_control``, so a message that differs from the previous request's only by the
    marker Claude Code moves every turn keeps its normalized form and key. ``remember=False`` (a
    token count, not a call) uses the rollout's last keyed request without replacing it. A trusted
    incremental splice runs on the event loop (``quick_prompt``); anything that renders the whole
    conversation goes to a thread.
    """
    state: GatewayState = request.app.state.gateway
    messages, tools = internal
    keyed = memory.key_messages(messages) if remember else key_messages(messages, memory.last_keyed)
    plan = await plan_prompt(state, keyed, memory, tools, _template_kwargs(state, thinking, tools))
    return plan, keyed


def _sampling(
    state: GatewayState, body: MessagesRequest, prompt_len: int, rollout: Rollout
) -> SamplingParams:
    try:
        return sampling_params(state, body, prompt_len, body.max_tokens, rollout)
    except ContextLengthExceeded as exc:
        # Anthropic's own wording: Claude Code parses it (compacts the history, or lowers max_tokens).
        context = state.engine.context_length
        cap = rollout_sampling(rollout).max_tokens
        max_tokens = body.max_tokens if cap is None else min(body.max_tokens, cap)
        if prompt_len >= context:
            message = f"prompt is too long: {prompt_len} tokens > {context - 1} maximum"
        else:
            message = (
                f"input length and `max_tokens` exceed context limit: {prompt_len} + {max_tokens} > "
                f"{context}, decrease input length or `max_tokens` and try again"
            )
        raise ContextLengthExceeded(message, param=exc.param) from exc


async def _prepare(request: Request) -> tuple[PreparedCall, MessagesRequest, Tools]:
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    data = await read_json(request, state.config.max_body_bytes)
    body = validate_body(MessagesRequest, data)
    check_prompt_size(state, data, "messages")
    internal = request_to_internal(data)  # refuses unusable content (images...) before the rollout starts
    rollout = await open_rollout(state, rollout)
    memory = await state.history.get(rollout.rollout_id, rollout.attempt)
    plan, keyed = await _plan(request, internal, body.thinking, memory)
    state.metrics.child(state.metrics.reuse, plan.result).inc()
    params = _sampling(state, body, len(plan.prompt_ids), rollout)
    call = PreparedCall(
        state,
        rollout,
        memory,
        "messages",
        data,
        plan.prompt_ids,
        params,
        body.stop_strings(),
        message_keys=keyed.keys,
        prompt_source=plan.result,
        reused_prompt_tokens=plan.reused_tokens,
    )
    return call, body, internal[1]


def _assembler(call: PreparedCall, body: MessagesRequest, tools: Tools) -> BlockAssembler:
    state = call.state
    parser = state.tool_parser(tools) if body.wants_tool_calls else None
    # A template may open the reasoning itself (the generation prompt ends with "<think>").
    return BlockAssembler(parser, reasoning=state.reasoning_parser(call.prompt_ids))


def _stop(call: PreparedCall, assembler: BlockAssembler) -> tuple[str, str | None, str]:
    """(Anthropic ``stop_reason``, ``stop_sequence``, the recorded finish reason in chat's terms)."""
    gen = call.generation
    assert gen is not None
    if gen.finish_reason == "length":
        return "max_tokens", None, "length"
    by_token = bool(gen.token_ids) and gen.token_ids[-1] in call.params.stop_token_ids
    if not by_token and call.stop:
        # A stop string ended it; the answer was cut exactly where that string starts.
        full = call.state.engine.tokenizer.decode(gen.token_ids)
        hit = next((s for s in call.stop if full.startswith(s, len(gen.text))), None)
        hit = hit or min(call.stop, key=lambda s: (full.find(s) < 0, full.find(s)))
        return "stop_sequence", hit, "stop"
    if assembler.calls:
        return "tool_use", None, "tool_calls"
    return "end_turn", None, "stop"


def _usage(call: PreparedCall) -> dict[str, int]:
    gen = call.generation
    return {
        "input_tokens": len(call.prompt_ids),
        "output_tokens": len(gen.token_ids) if gen else 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


async def messages(request: Request) -> Response:
    call, body, tools = await _prepare(request)
    model = body.model or call.state.engine.model_name
    msg_id = f"msg_{secrets.token_hex(12)}"
    if body.stream:
        headers = {**SSE_HEADERS, **call.headers(), "request-id": msg_id}
        return CallStream(
            call, _stream(call, body, tools, model, msg_id), closing=anthropic_sse_error, headers=headers
        )

    async def work() -> Response:
        await run_to_end(call)  # the engine need not stream: nobody reads the answer before its end
        gen = call.generation
        assert gen is not None
        assembler = _assembler(call, body, tools)
        assembler.feed(gen.text)
        assembler.finish()
        stop_reason, stop_sequence, finish = _stop(call, assembler)
        payload = {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": assembler.blocks,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": _usage(call),
        }
        # Built before the record: a call whose answer cannot be built (a 500) is not recorded.
        answer = json_response(payload, headers={"request-id": msg_id})
        await call.record(assembler.message(), finish)
        return answer

    return await respond_whole(call, request, work)


async def _stream(
    call: PreparedCall, body: MessagesRequest, tools: Tools, model: str, msg_id: str
) -> AsyncIterator[str]:
    state = call.state
    try:
        async for _ in call.admit(keepalive=True):
            yield PING
        gen = call.start()
        start = {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(call),
        }
        yield _event({"type": "message_start", "message": start})
        assembler = _assembler(call, body, tools)
        last_sent = time.monotonic()
        pieces = gen.pieces()
        try:
            async for piece in pieces:
                events = assembler.feed(piece.text) if piece.text else []
                for event in events:
                    yield _event(event)
                if events:
                    last_sent = time.monotonic()
                elif time.monotonic() - last_sent >= state.keepalive_s:
                    yield PING  # tokens are arriving but held back (a long tool call): keep the client
                    last_sent = time.monotonic()
        finally:
            # Close the engine's iterator even when the call is being cancelled (a drop); shielded so
            # the close itself is not cancelled (it frees the engine slot).
            with anyio.CancelScope(shield=True):
                await pieces.aclose()  # type: ignore[attr-defined]
        for event in assembler.finish():
            yield _event(event)
        stop_reason, stop_sequence, finish = _stop(call, assembler)
        # What follows the record is built first: once the call is durable only the transport can fail.
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"output_tokens": len(gen.token_ids)},
        }
        tail = [_event(delta), _event({"type": "message_stop"})]
        await call.record(assembler.message(), finish)  # durable before the client sees the end
        for out in tail:
            yield out
    except Exception as exc:
        yield anthropic_sse_error(stream_error(call, exc))


async def count_tokens(request: Request) -> Response:
    """Input tokens of a Messages request, built exactly as a call would be (reuse included)."""
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    data = await read_json(request, state.config.max_body_bytes)
    body = validate_body(CountTokensRequest, data)
    check_prompt_size(state, data, "messages")
    if rollout.status in TERMINAL_STATUSES:
        raise RolloutClosed(
            f"rollout {rollout.rollout_id!r} is {rollout.status.value}; it takes no more calls"
        )
    # Counting is not a call: it neither starts a queued rollout nor waits at the pause gate.
    memory = await state.history.get(rollout.rollout_id, rollout.attempt)
    plan, _ = await _plan(request, request_to_internal(data), body.thinking, memory, remember=False)
    return JSONResponse({"input_tokens": len(plan.prompt_ids)})


async def probe(request: Request) -> Response:
    """``HEAD /`` and friends: Claude Code checks that the base URL answers before its first call."""
    return Response(status_code=200)
