"""``POST /v1/chat/completions``: OpenAI chat, streaming or not, with tools.

The prompt comes from ``conversation.build_prompt`` (sampled-token reuse); tool calls from the
configured parser. Streaming emits content token by token as the engine samples it, and each tool
call as one delta when its block closes. The answered message is recorded exactly as the client
receives it (same tool-call ids), because it is what the next call's history is matched against.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from harnessrl.gateway.auth import authorize_rollout, open_rollout
from harnessrl.gateway.bodies import ChatCompletionRequest, read_json, validate_body
from harnessrl.gateway.calls import PreparedCall, run_to_end, sampling_params, sse, sse_stream
from harnessrl.gateway.conversation import build_prompt, normalize_messages
from harnessrl.gateway.generation import Generation, Piece
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.tool_parsers import ContentEvent, Event, ParsedMessage, ToolCallEvent, collect

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def logprob_entry(state: GatewayState, token_id: int, logprob: float) -> dict[str, Any]:
    # The engine reports the sampled token's logprob only, so ``top_logprobs`` stays empty.
    token = state.engine.tokenizer.decode([token_id])
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []}


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
    data = await read_json(request, state.config.max_body_bytes)
    body = validate_body(ChatCompletionRequest, data)
    body.check_n()
    messages = normalize_messages(data["messages"])
    rollout = await open_rollout(state, rollout)
    memory = await state.history.get(rollout.rollout_id, rollout.attempt)
    priors = list(memory.priors.values())
    tokenizer = state.engine.tokenizer
    # Rendering and encoding a long conversation takes milliseconds: keep it off the event loop.
    plan = await state.in_thread(
        lambda: build_prompt(
            tokenizer, messages, priors, tools=body.tools or None, template_kwargs=body.chat_template_kwargs
        )
    )
    state.metrics.reuse.labels(result=plan.result).inc()
    params = sampling_params(state, body, len(plan.prompt_ids), body.requested_max_tokens, rollout)
    call = PreparedCall(
        state, rollout, memory, "chat.completions", data, plan.prompt_ids, params, body.stop_strings()
    )
    return call, body


def _usage(call: PreparedCall) -> dict[str, int]:
    gen = call.generation
    completion = len(gen.token_ids) if gen else 0
    return {
        "prompt_tokens": len(call.prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(call.prompt_ids) + completion,
    }


async def chat_completions(request: Request) -> Response:
    call, body = await prepare_chat(request)
    state = call.state
    model = body.model or state.engine.model_name
    if body.stream:
        stream = sse_stream(call, lambda: _chunks(call, body, model))
        return StreamingResponse(
            stream, media_type="text/event-stream", headers={**SSE_HEADERS, **call.headers()}
        )
    try:
        await run_to_end(call)
        gen = call.generation
        assert gen is not None
        if body.wants_tool_calls:
            parser = state.tool_parser()
            parsed = collect(parser.feed(gen.text) + parser.finish())
        else:
            parsed = ParsedMessage(content=gen.text, tool_calls=[])
        message, finish = answer_message(parsed, gen)
        await call.record(message, finish)
    finally:
        call.finish()
    logprobs = None
    if body.logprobs:
        stop_ids = set(call.params.stop_token_ids)
        logprobs = {
            "content": [
                logprob_entry(state, t, lp)
                for t, lp in zip(gen.token_ids, gen.logprobs, strict=True)
                if t not in stop_ids
            ]
        }
    payload = {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"harnessrl-policy-{gen.policy_version}",
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
        "usage": _usage(call),
    }
    return JSONResponse(payload, headers=call.headers())


async def _chunks(call: PreparedCall, body: ChatCompletionRequest, model: str) -> AsyncGenerator[str, None]:
    state = call.state
    gen = call.start()
    base = {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"harnessrl-policy-{state.engine.policy_version}",
    }

    def chunk(
        delta: dict[str, Any], finish: str | None = None, logprobs: list[dict[str, Any]] | None = None
    ) -> str:
        lp = {"content": logprobs} if body.logprobs else None
        return sse(
            {**base, "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}
        )

    yield chunk({"role": "assistant", "content": ""}, logprobs=[])
    parser = state.tool_parser() if body.wants_tool_calls else None
    events: list[Event] = []
    pending_lp: list[dict[str, Any]] = []  # logprobs of tokens whose text is not released yet
    n_calls = 0

    def emit(new_events: list[Event]) -> list[str]:
        nonlocal pending_lp, n_calls
        out = []
        for event in new_events:
            events.append(event)
            if isinstance(event, ContentEvent):
                out.append(chunk({"content": event.text}, logprobs=pending_lp))
                pending_lp = []
            elif isinstance(event, ToolCallEvent):
                delta = {"tool_calls": [{"index": n_calls, **event.call.to_openai()}]}
                out.append(chunk(delta, logprobs=pending_lp))
                pending_lp = []
                n_calls += 1
        return out

    piece: Piece
    async for piece in gen.pieces():
        if body.logprobs and piece.token_id >= 0 and not piece.is_stop_token:
            pending_lp.append(logprob_entry(state, piece.token_id, piece.logprob))
        if piece.text:
            for out in emit(parser.feed(piece.text) if parser else [ContentEvent(piece.text)]):
                yield out
    if parser:
        for out in emit(parser.finish()):
            yield out
    parsed = collect(events) if parser else ParsedMessage(content=gen.text, tool_calls=[])
    message, finish = answer_message(parsed, gen)
    await call.record(message, finish)  # durable before the client sees the end of the answer
    yield chunk({}, finish=finish, logprobs=pending_lp)
    if body.include_usage:
        yield sse({**base, "choices": [], "usage": _usage(call)})
