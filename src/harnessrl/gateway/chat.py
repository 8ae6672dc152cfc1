"""``POST /v1/chat/completions``: OpenAI chat, streaming or not, with tools.

The prompt comes from ``conversation.build_prompt`` (sampled-token reuse); tool calls from the
configured parser. Streaming emits content token by token as the engine samples it, and each tool
call as one delta when its block closes. The answered message is recorded exactly as the client
receives it (same tool-call ids), because it is what the next call's history is matched against.

Per-call cost matters here (every model call of every rollout passes through): the request's
messages are normalized and keyed incrementally (``RolloutMemory.key_messages``), the prompt is
spliced on the event loop when that is cheap (``quick_prompt``) and only otherwise rendered in a
thread, and a non-streaming answer is generated without per-token decoding.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from harnessrl.gateway.auth import authorize_rollout, open_rollout
from harnessrl.gateway.bodies import (
    ChatCompletionRequest,
    CheckedRest,
    check_repeating_body,
    decode_body,
    read_body,
    rest_json,
    validate_tail,
)
from harnessrl.gateway.calls import (
    SSE_HEADERS,
    PreparedCall,
    check_prompt_size,
    generate_and_record,
    json_response,
    openai_envelope,
    openai_usage,
    plan_prompt,
    sampling_params,
    sse,
    streaming_response,
)
from harnessrl.gateway.generation import Generation, Piece
from harnessrl.gateway.logprobs import logprob_content
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.tool_parsers import ContentEvent, Event, ParsedMessage, ToolCallEvent, collect

__all__ = ["SSE_HEADERS", "chat_completions"]  # SSE_HEADERS: imported from here by other APIs


def answer_message(parsed: ParsedMessage, gen: Generation) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason OpenAI would give for this generation."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    finish = gen.finish_reason
    if parsed.tool_calls:
        message["tool_calls"] = [c.to_openai() for c in parsed.tool_calls]
        if finish == "stop":
            finish = "tool_calls"
    return message, finish


async def prepare_chat(request: Request) -> tuple[PreparedCall, ChatCompletionRequest]:
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    raw = await read_body(request, state.config.max_body_bytes)
    memory = await state.history.get(rollout.rollout_id, rollout.attempt)
    # The messages this request repeats of the rollout's last one passed every check below then:
    # only the rest of the body is walked and validated (``gateway.repeats``).
    data = decode_body(raw)
    repeated = memory.repeats(data.get("messages"))
    same = repeated[1] if repeated is not None else 0
    # Likewise the rest of the body (model, tools, sampling), where it is the same JSON again.
    rest = rest_json(data, "messages") if repeated is not None else None
    known = memory.last_rest if memory.last_rest is not None and memory.last_rest.json == rest else None
    check_repeating_body(raw, data, "messages", same, rest_checked=known is not None)
    body = validate_tail(  # body.messages: the new ones
        ChatCompletionRequest, data, "messages", same, previous=known.body if known is not None else None
    )
    body.check_n()
    history = repeated[0] if repeated is not None else None
    rest_chars = check_prompt_size(
        state, data, "messages", history, known.chars if known is not None else None
    )
    # 400 for unusable content, before the rollout starts
    keyed = memory.key_messages(data["messages"], repeated)
    memory.last_rest = CheckedRest(rest, rest_chars, body) if rest is not None else None
    rollout = await open_rollout(state, rollout)
    tools = body.tools or None
    kwargs = body.chat_template_kwargs.as_kwargs() if body.chat_template_kwargs is not None else None
    plan = await plan_prompt(state, keyed, memory, tools, kwargs)
    state.metrics.child(state.metrics.reuse, plan.result).inc()
    params = sampling_params(state, body, len(plan.prompt_ids), body.requested_max_tokens, rollout)
    call = PreparedCall(
        state,
        rollout,
        memory,
        "chat.completions",
        data,
        plan.prompt_ids,
        params,
        body.stop_strings(),
        message_keys=keyed.keys,
        history=keyed.history,
        prompt_source=plan.result,
        reused_prompt_tokens=plan.reused_tokens,
    )
    return call, body


async def chat_completions(request: Request) -> Response:
    call, body = await prepare_chat(request)
    state = call.state
    model = body.model or state.engine.model_name
    if body.stream:
        return streaming_response(call, lambda: _chunks(call, body, model))

    def answer(gen: Generation) -> tuple[dict[str, Any], str]:
        if body.wants_tool_calls:
            parser = state.tool_parser(body.tools)
            parsed = collect(parser.feed(gen.text) + parser.finish())
        else:
            parsed = ParsedMessage(content=gen.text, tool_calls=[])
        return answer_message(parsed, gen)

    def reply(gen: Generation, message: dict[str, Any], finish: str) -> Response:
        logprobs = None
        if body.logprobs:
            ids, lps = gen.token_ids, gen.logprobs
            stop_ids = set(call.params.stop_token_ids)
            if ids and ids[-1] in stop_ids:  # a sampled stop token has no entry (it ends the answer)
                ids, lps = ids[:-1], lps[:-1]
            if not stop_ids.isdisjoint(ids):  # any other (an engine that went on past one)
                kept = [(t, lp) for t, lp in zip(ids, lps, strict=True) if t not in stop_ids]
                ids, lps = [t for t, _ in kept], [lp for _, lp in kept]
            logprobs = {"content": logprob_content(state.engine.tokenizer, ids, lps)}
        payload = {
            **openai_envelope("chatcmpl", "chat.completion", model, gen.policy_version),
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
            "usage": openai_usage(call),
        }
        return json_response(payload)

    return await generate_and_record(call, request, answer, reply)


async def _chunks(call: PreparedCall, body: ChatCompletionRequest, model: str) -> AsyncGenerator[str, None]:
    state = call.state
    gen = call.start()
    base = openai_envelope("chatcmpl", "chat.completion.chunk", model, state.engine.policy_version)

    tokenizer = state.engine.tokenizer
    # Sampled tokens (and their logprobs) whose text is not released yet: the next chunk's entries.
    pending_ids: list[int] = []
    pending_lps: list[float] = []

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        nonlocal pending_ids, pending_lps
        lp = None
        if body.logprobs:
            lp = {"content": logprob_content(tokenizer, pending_ids, pending_lps)}
            pending_ids, pending_lps = [], []
        return sse(
            {**base, "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}
        )

    yield chunk({"role": "assistant", "content": ""})
    parser = state.tool_parser(body.tools) if body.wants_tool_calls else None
    events: list[Event] = []
    n_calls = 0

    def emit(new_events: list[Event]) -> list[str]:
        nonlocal n_calls
        out = []
        for event in new_events:
            events.append(event)
            if isinstance(event, ContentEvent):
                out.append(chunk({"content": event.text}))
            elif isinstance(event, ToolCallEvent):
                delta = {"tool_calls": [{"index": n_calls, **event.call.to_openai()}]}
                out.append(chunk(delta))
                n_calls += 1
        return out

    piece: Piece
    async for piece in gen.pieces():
        if body.logprobs and piece.token_id >= 0 and not piece.is_stop_token:
            pending_ids.append(piece.token_id)
            pending_lps.append(piece.logprob)
        if piece.text:
            for out in emit(parser.feed(piece.text) if parser else [ContentEvent(piece.text)]):
                yield out
    if parser:
        for out in emit(parser.finish()):
            yield out
    parsed = collect(events) if parser else ParsedMessage(content=gen.text, tool_calls=[])
    message, finish = answer_message(parsed, gen)
    # What follows the record is built first: once the call is durable only the transport can fail.
    tail = [chunk({}, finish=finish)]
    if body.include_usage:
        tail.append(sse({**base, "choices": [], "usage": openai_usage(call)}))
    await call.record(message, finish)  # durable before the client sees the end of the answer
    for out in tail:
        yield out
