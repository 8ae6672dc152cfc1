"""``POST /v1/responses``: the OpenAI Responses API (Codex CLI, the OpenAI Agents SDK), streaming or not.

The request is converted to the internal conversation (``responses_input``), so prompt building,
sampled-token reuse, tool-call parsing and recording are exactly those of chat completions; the
answer is built by ``responses_output``. Each call is recorded with ``api="responses"``, the request
as received and the answer as the internal assistant message, which also keeps the response id
under ``RESPONSE_ID_KEY`` so ``previous_response_id`` resolves from the store (after a restart too).

Where this departs from OpenAI (documented in docs/gateway.md): nothing is stored server-side beyond
the recorded calls, so ``previous_response_id`` resolves only to this rollout's own responses and
``item_reference`` is refused; hosted tools are dropped or refused (``gateway.unsupported_tools``);
the stream's first events (``response.created``, ``response.in_progress``) go out before the pause
gate, and a held call repeats ``response.in_progress`` next to each SSE keep-alive comment, because
Codex's idle timer counts events, not comments.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from harnessrl.errors import BadRequest, ContextLengthExceeded, HarnessRLError
from harnessrl.gateway.auth import authorize_rollout, open_rollout
from harnessrl.gateway.bodies import SamplingFields, read_json, validate_body
from harnessrl.gateway.calls import (
    PreparedCall,
    check_prompt_size,
    sampling_params,
    stream_error,
    tokenize_in_thread,
)
from harnessrl.gateway.conversation import build_prompt, normalize_messages
from harnessrl.gateway.delivery import CallStream, respond_whole
from harnessrl.gateway.errors import error_shape
from harnessrl.gateway.responses_input import (
    PREVIOUS_KEY,
    request_to_internal,
    unsupported_tools,
)
from harnessrl.gateway.responses_output import OutputStream, new_id
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Rollout
from harnessrl.tokenizer import PolicyTokenizer

__all__ = ["request_to_internal", "responses"]

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
#: Private key of the recorded internal answer that holds the response id given to the client.
RESPONSE_ID_KEY = "_response_id"


class ResponsesRequest(SamplingFields):
    """The fields this gateway reads; everything else (``store``, ``metadata``, ``text``, ``include``,
    ``prompt_cache_key``, ``service_tier``, ``user``...) is accepted and echoed or ignored."""

    input: str | list[Any] | None = None
    instructions: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    include: list[str] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None


@dataclass
class ResponsesCall:
    """A prepared call plus what the answer echoes back."""

    call: PreparedCall
    body: ResponsesRequest
    model: str
    response_id: str
    created_at: int
    reused_tokens: int
    tools: list[dict[str, Any]]
    seq: int = 0  # the next stream event's ``sequence_number``
    out: OutputStream | None = None  # a stream's output so far

    def event(self, payload: dict[str, Any]) -> str:
        """One SSE event of the stream, numbered."""
        payload = {"type": payload["type"], "sequence_number": self.seq, **payload}
        self.seq += 1
        return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def failed(self, error: HarnessRLError) -> dict[str, Any]:
        """The ``response.failed`` event's payload for ``error``."""
        try:
            failed = self.response("failed", self.out, error)
        except Exception:  # noqa: BLE001 - the Response object itself is what cannot be built
            failed = {"id": self.response_id, "object": "response", "status": "failed", "output": []}
            failed["error"] = {"code": error_shape(error).code, "message": str(error)}
        return {"type": "response.failed", "response": failed}

    def output(self) -> OutputStream:
        state = self.call.state
        wants_tools = bool(self.tools) and self.body.tool_choice != "none"
        encrypt = "reasoning.encrypted_content" in (self.body.include or [])
        # A template may open the reasoning itself (the generation prompt ends with "<think>").
        reasoning = state.reasoning_parser(self.call.prompt_ids)
        return OutputStream(
            state.tool_parser(self.tools) if wants_tools else None, reasoning=reasoning, encrypt=encrypt
        )

    def response(
        self, status: str, out: OutputStream | None = None, error: HarnessRLError | None = None
    ) -> dict[str, Any]:
        """The Response object; ``out`` None for the in-progress snapshot."""
        body, params = self.body, self.call.params
        gen = self.call.generation
        usage = None
        if out is not None and gen is not None:
            n_in, n_out = len(self.call.prompt_ids), len(gen.token_ids)
            usage = {
                "input_tokens": n_in,
                # Tokens taken verbatim from earlier calls of the rollout: this gateway's prefix cache.
                "input_tokens_details": {"cached_tokens": self.reused_tokens},
                "output_tokens": n_out,
                "output_tokens_details": {"reasoning_tokens": out.reasoning_tokens},
                "total_tokens": n_in + n_out,
            }
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": {"code": error_shape(error).code, "message": str(error)} if error is not None else None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": [dict(item) for item in out.items] if out is not None else [],
            "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": (body.reasoning or {}).get("effort"), "summary": None},
            "store": body.store if body.store is not None else True,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "text": body.text or {"format": {"type": "text"}},
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": [{"type": "function", **t["function"]} for t in self.tools],
            "truncation": "disabled",
            "usage": usage,
            "metadata": body.metadata or {},
        }

    async def record(self, out: OutputStream) -> str:
        """Record the answer (durably, before the client sees its end); returns the response status."""
        gen = self.call.generation
        assert gen is not None
        message = out.internal_message()
        finish = "tool_calls" if out.tool_calls and gen.finish_reason == "stop" else gen.finish_reason
        await self.call.record({**message, RESPONSE_ID_KEY: self.response_id}, finish)
        return self.status()

    def status(self) -> str:
        """The finished Response's status (after the generation)."""
        gen = self.call.generation
        assert gen is not None
        return "incomplete" if gen.finish_reason == "length" else "completed"


def thinking_kwargs(tokenizer: PolicyTokenizer, reasoning: dict[str, Any] | None) -> dict[str, Any]:
    """``reasoning.effort`` as the chat template's thinking switch, when the template has one."""
    effort = (reasoning or {}).get("effort")
    if effort is None or "enable_thinking" not in tokenizer.get_chat_template():
        return {}
    # An on/off switch has no levels: "none"/"minimal" ask for (almost) no reasoning, the rest for some.
    return {"enable_thinking": effort not in ("none", "minimal")}


async def resolve_previous(state: GatewayState, rollout: Rollout, response_id: str) -> list[dict[str, Any]]:
    """The conversation ``previous_response_id`` continues: its input (without its instructions, which
    OpenAI does not carry over) and its answer, from the recorded call."""
    calls = await state.in_thread(lambda: state.store.list_calls(rollout.rollout_id, attempt=rollout.attempt))
    for call in reversed(calls):
        if call.api == "responses" and call.response.get(RESPONSE_ID_KEY) == response_id:
            messages, _ = request_to_internal({**call.request, "instructions": None})
            answer = {k: v for k, v in call.response.items() if k != RESPONSE_ID_KEY}
            return messages + [answer]
    raise BadRequest(
        f"previous_response_id {response_id!r} is not a response of this rollout",
        param="previous_response_id",
    )


async def prepare_responses(request: Request) -> ResponsesCall:
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    data = await read_json(request, state.config.max_body_bytes)
    body = validate_body(ResponsesRequest, data)
    body.check_n()
    check_prompt_size(state, data, "input")
    if state.config.unsupported_tools == "refuse":
        found = unsupported_tools(data)
        if found:
            raise BadRequest(
                "tools this gateway cannot serve: "
                + ", ".join(found)
                + " (gateway.unsupported_tools = refuse)",
                param=found[0].split(" ")[0],
            )
    if PREVIOUS_KEY in data:
        raise BadRequest(f"{PREVIOUS_KEY} is reserved", param=PREVIOUS_KEY)
    recorded = data
    if body.previous_response_id:
        previous = await resolve_previous(state, rollout, body.previous_response_id)
        # Recorded with the request so the converter alone rebuilds the whole conversation later.
        recorded = {**data, PREVIOUS_KEY: previous}
    raw_messages, tools = request_to_internal(recorded)
    if not raw_messages:
        raise BadRequest("input is required (a string or a non-empty list of items)", param="input")
    messages = normalize_messages(raw_messages)
    rollout = await open_rollout(state, rollout)
    memory = await state.history.get(rollout.rollout_id, rollout.attempt)
    priors = list(memory.priors.values())
    tokenizer = state.engine.tokenizer
    kwargs = thinking_kwargs(tokenizer, body.reasoning)
    plan = await tokenize_in_thread(
        state,
        lambda: build_prompt(
            tokenizer, messages, priors, tools=tools, template_kwargs=kwargs, history=state.config.history
        ),
        "input",
    )
    state.metrics.child(state.metrics.reuse, plan.result).inc()
    try:
        params = sampling_params(state, body, len(plan.prompt_ids), body.max_output_tokens, rollout)
    except ContextLengthExceeded as exc:
        # Name this API's fields, not chat's.
        exc.param = {"max_tokens": "max_output_tokens", "messages": "input"}.get(exc.param or "", exc.param)
        raise
    call = PreparedCall(
        state,
        rollout,
        memory,
        "responses",
        recorded,
        plan.prompt_ids,
        params,
        body.stop_strings(),
        prompt_source=plan.result,
        reused_prompt_tokens=plan.reused_tokens,
    )
    return ResponsesCall(
        call=call,
        body=body,
        model=body.model or state.engine.model_name,
        response_id=new_id("resp"),
        created_at=int(time.time()),
        reused_tokens=plan.reused_tokens,
        tools=tools or [],
    )


async def _generate(rc: ResponsesCall, out: OutputStream) -> AsyncGenerator[list[dict[str, Any]], None]:
    """Run the generation, yielding the stream events each sampled piece completes."""
    gen = rc.call.start()
    async for piece in gen.pieces():
        yield out.feed(piece)
    yield out.finish("incomplete" if gen.finish_reason == "length" else "completed")


async def _drain(events: AsyncGenerator[Any, None]) -> AsyncIterator[Any]:
    """Iterate ``events``, closing it (and the engine's iterator under it) however iteration ends."""
    try:
        async for batch in events:
            yield batch
    finally:
        # Shielded: a client disconnect that cancels us must not cancel the close.
        with anyio.CancelScope(shield=True):
            await events.aclose()


async def responses(request: Request) -> Response:
    rc = await prepare_responses(request)
    if rc.body.stream:
        return CallStream(
            rc.call,
            _sse(rc),
            closing=lambda exc: rc.event(rc.failed(exc)),
            headers={**SSE_HEADERS, **rc.call.headers()},
        )
    call = rc.call
    out = rc.output()

    async def work() -> Response:
        async for _ in call.admit():
            pass
        async for _ in _drain(_generate(rc, out)):
            pass
        # Built before the record: a call whose answer cannot be built (a 500) is not recorded.
        answer = JSONResponse(rc.response(rc.status(), out))
        await rc.record(out)
        return answer

    return await respond_whole(call, request, work)


async def _sse(rc: ResponsesCall) -> AsyncIterator[str]:
    """The documented event sequence, with ``sequence_number`` on every event."""
    call = rc.call
    out = rc.output()
    rc.out = out
    try:
        yield rc.event({"type": "response.created", "response": rc.response("in_progress")})
        yield rc.event({"type": "response.in_progress", "response": rc.response("in_progress")})
        async for comment in call.admit(keepalive=True):
            yield comment
            yield rc.event({"type": "response.in_progress", "response": rc.response("in_progress")})
        async for batch in _drain(_generate(rc, out)):
            for payload in batch:
                yield rc.event(payload)
        # The last event is built first: once the call is durable only the transport can fail.
        status = rc.status()
        kind = "response.completed" if status == "completed" else "response.incomplete"
        final = rc.event({"type": kind, "response": rc.response(status, out)})
        await rc.record(out)  # durable before the client sees the end of the answer
        yield final
    except Exception as exc:
        yield rc.event(rc.failed(stream_error(call, exc)))
