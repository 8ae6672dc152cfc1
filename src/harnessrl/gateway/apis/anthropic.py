"""``POST /v1/messages`` (Anthropic Messages, streaming or not) and ``/v1/messages/count_tokens``.

The call runs through ``pipeline``, as every API's does: the request is converted to the internal
conversation (``anthropic_convert.request_to_internal``, also what reuse after a restart uses) and
recorded with ``api="messages"``, the request as received and the internal assistant message as the
response. The answer's blocks come from
``anthropic_blocks.BlockAssembler``, for streaming and non-streaming alike.

Streaming follows Anthropic's event sequence: ``message_start``; per block ``content_block_start``,
``content_block_delta`` (``thinking_delta`` + ``signature_delta``, ``text_delta``,
``input_json_delta``), ``content_block_stop``; ``message_delta`` (stop reason, output tokens);
``message_stop``. ``ping`` events keep the connection alive while the call waits at a paused gateway
and whenever sampled tokens produce no event for ``keepalive_s`` (a long tool call is held back
until its block closes). Errors anywhere under ``/v1/messages`` are in Anthropic's shape
(``gateway.errors``); after the 200 header they arrive as an ``error`` event.

The converted messages are keyed incrementally by the pipeline (``RolloutMemory.key_messages``); the
conversion drops ``cache_control``, so Claude Code's moving marker does not make the newest-but-one
message look new.
"""

from __future__ import annotations

import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from harnessrl.errors import ConfigError, ContextLengthExceeded, HarnessRLError
from harnessrl.gateway.apis.anthropic_blocks import BlockAssembler, joined_deltas
from harnessrl.gateway.apis.anthropic_convert import (
    ThinkingParam,
    refuse_prefill,
    request_to_internal,
    thinking_kwargs,
)
from harnessrl.gateway.apis.anthropic_request import CountTokensRequest, MessagesRequest
from harnessrl.gateway.auth import authorize_rollout
from harnessrl.gateway.bodies import parse_body, read_json, validate_body
from harnessrl.gateway.errors import RolloutClosed, anthropic_sse_error
from harnessrl.gateway.pipeline.answer import HOLD_AT_MOST, feed_each
from harnessrl.gateway.pipeline.calls import PreparedCall
from harnessrl.gateway.pipeline.driver import CallRequest, Streamed, Whole, plan_prompt, serve
from harnessrl.gateway.pipeline.generation import Generation, Piece
from harnessrl.gateway.pipeline.limits import check_prompt_size, rollout_sampling
from harnessrl.gateway.pipeline.wire import json_response, sse_event
from harnessrl.gateway.prompt.history import RolloutMemory
from harnessrl.gateway.prompt.messages import key_messages
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.teacher.messages import teacher_messages
from harnessrl.schemas import TERMINAL_STATUSES, Rollout
from harnessrl.tokenizer import PolicyTokenizer

__all__ = ["MESSAGES", "count_tokens", "messages", "probe", "request_to_internal"]

PING = 'event: ping\ndata: {"type": "ping"}\n\n'


def thinking_template_kwargs(
    tokenizer: PolicyTokenizer, thinking: ThinkingParam | None, tools: Any
) -> dict[str, Any]:
    """``thinking`` onto the template's reasoning switch (Qwen3's ``enable_thinking``) if it has one
    (how ``harnessrl sft`` renders a recorded Messages call for its student; the gateway passes
    ``anthropic_convert.thinking_kwargs`` whether or not the template reads it, which renders the
    same)."""
    if thinking is None:
        return {}
    try:
        source = tokenizer.get_chat_template(tools)
    except ConfigError:
        return {}  # no template: build_prompt reports it
    if "enable_thinking" not in source:
        return {}  # nothing to switch: accepted and ignored
    return thinking_kwargs(thinking.model_dump())


class MessagesApi:
    name = "messages"

    async def parse(
        self, state: GatewayState, rollout: Rollout, memory: RolloutMemory, raw: bytes
    ) -> CallRequest[MessagesRequest]:
        data = parse_body(raw)
        body = validate_body(MessagesRequest, data)
        check_prompt_size(state, data, "messages")
        messages, tools = request_to_internal(data)  # refuses unusable content (images...)
        refuse_prefill(messages)
        # As ``apis.template_context`` reads them back from the stored request (reuse compares).
        kwargs = thinking_kwargs(data.get("thinking")) or None
        return CallRequest(
            data,
            body,
            body.max_tokens,
            "messages",
            messages=messages,
            tools=memory.template_tools(state.engine.tokenizer, data, tools, kwargs),
            template_kwargs=kwargs,
        )

    def too_long(
        self,
        state: GatewayState,
        exc: ContextLengthExceeded,
        request: CallRequest[MessagesRequest],
        prompt_len: int,
        rollout: Rollout,
    ) -> ContextLengthExceeded:
        """Anthropic's own wording: Claude Code parses it (compacts the history, or lowers max_tokens)."""
        context = state.engine.context_length
        # The budget the context check used: capped as ``sampling_params`` caps it.
        caps = [c for c in (rollout_sampling(rollout).max_tokens, state.config.max_tokens) if c is not None]
        max_tokens = min([request.body.max_tokens, *caps])
        if prompt_len >= context:
            message = f"prompt is too long: {prompt_len} tokens > {context - 1} maximum"
        else:
            message = (
                f"input length and `max_tokens` exceed context limit: {prompt_len} + {max_tokens} > "
                f"{context}, decrease input length or `max_tokens` and try again"
            )
        return ContextLengthExceeded(message, param=exc.param)

    def answer(self, call: PreparedCall, request: CallRequest[MessagesRequest]) -> MessageAnswer:
        return MessageAnswer(call, request.body, request.tools)


MESSAGES = MessagesApi()


async def messages(request: Request) -> Response:
    teacher = request.app.state.gateway.teacher
    if teacher is not None:  # teacher mode: the upstream answers (``gateway.teacher.messages``)
        return await teacher_messages(request, teacher)
    return await serve(MESSAGES, request)


class MessageAnswer:
    """A Messages answer: its blocks come from ``anthropic_blocks.BlockAssembler``, whole or streamed."""

    ping = PING
    whole_from_pieces = False

    def __init__(self, call: PreparedCall, body: MessagesRequest, tools: Any) -> None:
        self.call = call
        self.model = body.model or call.state.engine.model_name
        self.msg_id = f"msg_{secrets.token_hex(12)}"
        self.headers = {"request-id": self.msg_id}
        state = call.state
        parser = state.tool_parser(tools) if body.wants_tool_calls else None
        # A template may open the reasoning itself (the generation prompt ends with "<think>").
        self.assembler = BlockAssembler(parser, reasoning=state.reasoning_parser(call.prompt_ids))
        self.pending: list[str] = []  # a stream's pieces' text not fed to the blocks yet (``held``)

    def whole(self, gen: Generation) -> Whole:
        assembler = self.assembler
        assembler.feed(gen.text)
        assembler.finish()
        stop_reason, stop_sequence, finish = _stop(self.call, assembler)
        payload = {
            "id": self.msg_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": assembler.blocks,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": _usage(self.call),
        }
        return Whole(json_response(payload, headers=self.headers), assembler.message(), finish)

    def opening(self) -> list[str]:
        return []

    def waiting(self, comment: str) -> list[str]:
        return [PING]

    def started(self, gen: Generation) -> list[str]:
        start = {
            "id": self.msg_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(self.call),
        }
        return [sse_event({"type": "message_start", "message": start})]

    def feed_all(self, pieces: list[Piece]) -> list[str]:
        return feed_each(self.feed, pieces)

    def feed(self, piece: Piece) -> list[str]:
        if piece.text:
            self.pending.append(piece.text)
            if len(self.pending) >= HOLD_AT_MOST:
                return self.held()
        return []

    def held(self) -> list[str]:
        """The events of the text of the pieces fed since the last write, fed to the blocks at once
        (as a whole answer's text is): the tokens of one engine read are one ``content_block_delta``."""
        if not self.pending:
            return []
        text = "".join(self.pending)
        self.pending.clear()
        return [sse_event(event) for event in joined_deltas(self.assembler.feed(text))]

    def finished(self, gen: Generation) -> Streamed:
        last = self.held() + [sse_event(event) for event in self.assembler.finish()]
        stop_reason, stop_sequence, finish = _stop(self.call, self.assembler)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"output_tokens": len(gen.token_ids)},
        }
        tail = [sse_event(delta), sse_event({"type": "message_stop"})]
        return Streamed(last, self.assembler.message(), finish, tail)

    def error(self, exc: HarnessRLError) -> str:
        return anthropic_sse_error(exc)


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


async def count_tokens(request: Request) -> Response:
    """Input tokens of a Messages request, built exactly as a call would be (reuse included)."""
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    data = await read_json(request, state.config.max_body_bytes)
    validate_body(CountTokensRequest, data)
    check_prompt_size(state, data, "messages")
    if rollout.status in TERMINAL_STATUSES:
        raise RolloutClosed(
            f"rollout {rollout.rollout_id!r} is {rollout.status.value}; it takes no more calls"
        )
    # Counting is not a call: it neither starts a queued rollout nor waits at the pause gate.
    memory = await state.history.get(rollout.rollout_id, rollout.attempt)
    messages, tools = request_to_internal(data)
    keyed = key_messages(messages, memory.last_keyed)  # a count, not a call: the last request stays
    plan = await plan_prompt(state, keyed, memory, tools, thinking_kwargs(data.get("thinking")) or None)
    return JSONResponse({"input_tokens": len(plan.prompt_ids)})


async def probe(request: Request) -> Response:
    """``HEAD /`` and friends: Claude Code checks that the base URL answers before its first call."""
    return Response(status_code=200)
