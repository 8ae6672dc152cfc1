"""``POST /v1/completions`` (legacy text completions) and ``GET /v1/models``.

The prompt is text (encoded with the policy's tokenizer, special-token strings included) or a list
of token IDs used verbatim — the way to drive the policy token-in/token-out from outside. No chat
template and no reuse: the caller owns the exact prompt.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from harnessrl.errors import BadRequest
from harnessrl.gateway.auth import authorize_rollout, open_rollout
from harnessrl.gateway.bodies import CompletionRequest, read_json, validate_body
from harnessrl.gateway.calls import (
    PreparedCall,
    check_prompt_size,
    check_token_ids,
    generate_and_record,
    json_response,
    openai_envelope,
    openai_usage,
    sampling_params,
    sse,
    streaming_response,
    tokenize_in_thread,
)
from harnessrl.gateway.generation import Generation
from harnessrl.gateway.state import GatewayState


class _LegacyLogprobs:
    """Accumulates the legacy ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` shape."""

    def __init__(self, state: GatewayState, offset: int = 0) -> None:
        self._state = state
        self._offset = offset
        self.clear()

    def clear(self) -> None:
        self.tokens: list[str] = []
        self.token_logprobs: list[float] = []
        self.text_offset: list[int] = []

    def add(self, token_ids: list[int], logprobs: list[float]) -> None:
        for token, logprob in zip(self._state.engine.tokenizer.token_texts(token_ids), logprobs, strict=True):
            self.tokens.append(token)
            self.token_logprobs.append(logprob)
            self.text_offset.append(self._offset)
            self._offset += len(token)

    def take(self) -> dict[str, Any]:
        out = {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": None,
            "text_offset": self.text_offset,
        }
        self.clear()
        return out


async def completions(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    data = await read_json(request, state.config.max_body_bytes)
    body = validate_body(CompletionRequest, data)
    body.check_n()
    check_prompt_size(state, data, "prompt")
    prompt = body.single_prompt()
    if isinstance(prompt, str):
        prompt_ids = await tokenize_in_thread(state, lambda: state.engine.tokenizer.encode(prompt), "prompt")
        if not prompt_ids:
            raise BadRequest("prompt is empty", param="prompt")
    else:
        prompt_ids = list(prompt)
        check_token_ids(state, prompt_ids)
    rollout = await open_rollout(state, rollout)
    memory = await state.history.get(rollout.rollout_id, rollout.attempt)
    params = sampling_params(state, body, len(prompt_ids), body.max_tokens, rollout)
    call = PreparedCall(state, rollout, memory, "completions", data, prompt_ids, params, body.stop_strings())
    model = body.model or state.engine.model_name
    if body.stream:
        return streaming_response(call, lambda: _chunks(call, body, model))

    def reply(gen: Generation, response: dict[str, Any], finish: str) -> Response:
        logprobs = None
        if body.logprobs is not None:
            acc = _LegacyLogprobs(state)
            stop_ids = set(params.stop_token_ids)
            kept = [(t, lp) for t, lp in zip(gen.token_ids, gen.logprobs, strict=True) if t not in stop_ids]
            acc.add([t for t, _ in kept], [lp for _, lp in kept])
            logprobs = acc.take()
        payload = {
            **openai_envelope("cmpl", "text_completion", model, gen.policy_version),
            "choices": [{"index": 0, "text": gen.text, "logprobs": logprobs, "finish_reason": finish}],
            "usage": openai_usage(call),
        }
        return json_response(payload)

    return await generate_and_record(call, request, lambda g: ({"text": g.text}, g.finish_reason), reply)


async def _chunks(call: PreparedCall, body: CompletionRequest, model: str) -> AsyncGenerator[str, None]:
    state = call.state
    gen: Generation = call.start()
    base = openai_envelope("cmpl", "text_completion", model, state.engine.policy_version)
    acc = _LegacyLogprobs(state) if body.logprobs is not None else None

    def chunk(text: str, finish: str | None = None) -> str:
        lp = acc.take() if acc is not None else None
        return sse({**base, "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}]})

    async for piece in gen.pieces():
        if acc is not None and piece.token_id >= 0 and not piece.is_stop_token:
            acc.add([piece.token_id], [piece.logprob])
        if piece.text:
            yield chunk(piece.text)
    # What follows the record is built first: once the call is durable only the transport can fail.
    tail = [chunk("", finish=gen.finish_reason)]
    if body.include_usage:
        tail.append(sse({**base, "choices": [], "usage": openai_usage(call)}))
    await call.record({"text": gen.text}, gen.finish_reason)
    for out in tail:
        yield out


async def list_models(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    created = int(state.started_at)
    # Harnesses send whatever model name they were configured with; every name reaches the policy.
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": state.engine.model_name,
                    "object": "model",
                    "created": created,
                    "owned_by": "harnessrl",
                }
            ],
        }
    )
