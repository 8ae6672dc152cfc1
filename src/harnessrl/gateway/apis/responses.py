"""``POST /v1/responses``: the OpenAI Responses API (Codex CLI, the OpenAI Agents SDK), streaming or not.

The request is converted to the internal conversation (``responses_input``) and the call runs
through ``pipeline``, so admission, prompt building (the fast path included), sampled-token reuse,
tool-call parsing and recording are exactly those of chat completions; the answer is built by
``responses_output``. Each call is recorded with ``api="responses"``, the request
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

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from harnessrl.errors import BadRequest, ContextLengthExceeded, HarnessRLError
from harnessrl.gateway.apis.responses_deltas import joined_deltas
from harnessrl.gateway.apis.responses_input import (
    PREVIOUS_KEY,
    reasoning_kwargs,
    request_to_internal,
)
from harnessrl.gateway.apis.responses_output import OutputStream, new_id
from harnessrl.gateway.apis.responses_request import (
    RESPONSE_ID_KEY,
    ResponsesRequest,
    resolve_previous,
    response_object,
)
from harnessrl.gateway.apis.responses_tools import unsupported_tools
from harnessrl.gateway.bodies import parse_body, validate_body
from harnessrl.gateway.errors import error_shape
from harnessrl.gateway.pipeline.answer import HOLD_AT_MOST, feed_each
from harnessrl.gateway.pipeline.calls import PreparedCall
from harnessrl.gateway.pipeline.driver import CallRequest, Streamed, Whole, serve
from harnessrl.gateway.pipeline.generation import Generation, Piece
from harnessrl.gateway.pipeline.limits import check_prompt_size
from harnessrl.gateway.pipeline.wire import json_response, sse_event
from harnessrl.gateway.prompt.history import RolloutMemory
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.teacher.responses import teacher_responses
from harnessrl.schemas import Rollout
from harnessrl.tokenizer import PolicyTokenizer

__all__ = ["RESPONSES", "request_to_internal", "responses"]


def thinking_kwargs(tokenizer: PolicyTokenizer, reasoning: dict[str, Any] | None) -> dict[str, Any]:
    """``reasoning.effort`` as the chat template's thinking switch, when the template has one (how
    ``harnessrl sft`` renders a recorded call; the gateway passes ``reasoning_kwargs`` whether or not
    the template reads it, which renders the same)."""
    if (reasoning or {}).get("effort") is None or "enable_thinking" not in tokenizer.get_chat_template():
        return {}
    return reasoning_kwargs(reasoning)


class ResponsesApi:
    name = "responses"

    async def parse(
        self, state: GatewayState, rollout: Rollout, memory: RolloutMemory, raw: bytes
    ) -> CallRequest[ResponsesRequest]:
        data = parse_body(raw)
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
        messages, tools = request_to_internal(recorded)
        if not messages:
            raise BadRequest("input is required (a string or a non-empty list of items)", param="input")
        # As ``apis.template_context`` reads them back from the stored request (reuse compares).
        kwargs = reasoning_kwargs(data.get("reasoning")) or None
        return CallRequest(
            recorded,
            body,
            body.max_output_tokens,
            "input",
            messages=messages,
            tools=memory.template_tools(state.engine.tokenizer, recorded, tools, kwargs),
            template_kwargs=kwargs,
        )

    def too_long(
        self,
        state: GatewayState,
        exc: ContextLengthExceeded,
        request: CallRequest[ResponsesRequest],
        prompt_len: int,
        rollout: Rollout,
    ) -> ContextLengthExceeded:
        # Name this API's budget field, not chat's (the prompt's, ``input``, is named already).
        exc.param = {"max_tokens": "max_output_tokens"}.get(exc.param or "", exc.param)
        return exc

    def answer(self, call: PreparedCall, request: CallRequest[ResponsesRequest]) -> ResponsesAnswer:
        return ResponsesAnswer(call, request.body, request.tools or [])


RESPONSES = ResponsesApi()


async def responses(request: Request) -> Response:
    teacher = request.app.state.gateway.teacher
    if teacher is not None:  # teacher mode: the upstream answers
        return await teacher_responses(request, teacher)
    return await serve(RESPONSES, request)


class ResponsesAnswer:
    """A Response object, whole or as the documented event sequence (``sequence_number`` on each).

    Both are built by ``responses_output.OutputStream`` from the sampled pieces, so they agree.
    """

    headers: dict[str, str] = {}
    ping = None

    def __init__(self, call: PreparedCall, body: ResponsesRequest, tools: list[dict[str, Any]]) -> None:
        self.call = call
        self.body = body
        self.tools = tools
        self.model = body.model or call.state.engine.model_name
        self.response_id = new_id("resp")
        self.created_at = int(time.time())
        self.seq = 0  # the next stream event's ``sequence_number``
        self.out = self._output()
        self.pending: list[dict[str, Any]] = []  # a stream's events not rendered yet (``held``)
        self.held_pieces = 0  # pieces fed since then

    @property
    def whole_from_pieces(self) -> bool:
        # Stop strings are found in the text as it grows: such a generation runs piece by piece.
        return bool(self.call.stop)

    def _output(self) -> OutputStream:
        state, body = self.call.state, self.body
        wants_tools = bool(self.tools) and body.tool_choice != "none"
        encrypt = "reasoning.encrypted_content" in (body.include or [])
        # A template may open the reasoning itself (the generation prompt ends with "<think>").
        reasoning = state.reasoning_parser(self.call.prompt_ids)
        return OutputStream(
            state.tool_parser(self.tools) if wants_tools else None, reasoning=reasoning, encrypt=encrypt
        )

    def event(self, payload: dict[str, Any]) -> str:
        """One SSE event of the stream, numbered."""
        payload = {"type": payload["type"], "sequence_number": self.seq, **payload}
        self.seq += 1
        return sse_event(payload)

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
                "input_tokens_details": {"cached_tokens": self.call.reused_prompt_tokens},
                "output_tokens": n_out,
                "output_tokens_details": {"reasoning_tokens": out.reasoning_tokens},
                "total_tokens": n_in + n_out,
            }
        return response_object(
            body,
            response_id=self.response_id,
            created_at=self.created_at,
            model=self.model,
            status=status,
            output=[dict(item) for item in out.items] if out is not None else [],
            usage=usage,
            tools=self.tools,
            temperature=params.temperature,
            top_p=params.top_p,
            error=error,
        )

    def failed(self, error: HarnessRLError) -> dict[str, Any]:
        """The ``response.failed`` event's payload for ``error``."""
        try:
            failed = self.response("failed", self.out, error)
        except Exception:  # noqa: BLE001 - the Response object itself is what cannot be built
            failed = {"id": self.response_id, "object": "response", "status": "failed", "output": []}
            failed["error"] = {"code": error_shape(error).code, "message": str(error)}
        return {"type": "response.failed", "response": failed}

    def status(self, gen: Generation) -> str:
        """The finished Response's status."""
        return "incomplete" if gen.finish_reason == "length" else "completed"

    def recorded(self, gen: Generation) -> tuple[dict[str, Any], str]:
        """The recorded answer (the internal message, with the response id) and finish reason."""
        message = self.out.internal_message()
        finish = "tool_calls" if self.out.tool_calls and gen.finish_reason == "stop" else gen.finish_reason
        return {**message, RESPONSE_ID_KEY: self.response_id}, finish

    def whole(self, gen: Generation) -> Whole:
        status = self.status(gen)
        # Generated whole: its text is read at once, unless it has reasoning (``usage`` counts the
        # reasoning tokens, which only the pieces tell apart: then it is read piece by piece).
        if not self.whole_from_pieces and not self.out.feed_whole(gen.text):
            self.out = self._output()
            for piece in gen.replayed_pieces():
                self.out.feed(piece)
        self.out.finish(status)
        return Whole(json_response(self.response(status, self.out)), *self.recorded(gen))

    def opening(self) -> list[str]:
        in_progress = self.response("in_progress")
        return [
            self.event({"type": "response.created", "response": in_progress}),
            self.event({"type": "response.in_progress", "response": in_progress}),
        ]

    def waiting(self, comment: str) -> list[str]:
        # Codex's idle timer counts events, not comments.
        return [
            comment,
            self.event({"type": "response.in_progress", "response": self.response("in_progress")}),
        ]

    def started(self, gen: Generation) -> list[str]:
        return []

    def feed_all(self, pieces: list[Piece]) -> list[str]:
        return feed_each(self.feed, pieces)

    def feed(self, piece: Piece) -> list[str]:
        self.pending += self.out.feed(piece)
        self.held_pieces += 1
        return self.held() if self.held_pieces >= HOLD_AT_MOST else []

    def held(self) -> list[str]:
        """The events of the pieces fed since the last write, an item's adjacent text deltas joined
        into one: the tokens of one engine read are one ``response.output_text.delta``."""
        payloads = self.pending + self.out.flush()
        self.pending, self.held_pieces = [], 0
        return [self.event(payload) for payload in joined_deltas(payloads)] if payloads else []

    def finished(self, gen: Generation) -> Streamed:
        status = self.status(gen)
        last = self.held() + [self.event(payload) for payload in self.out.finish(status)]
        kind = "response.completed" if status == "completed" else "response.incomplete"
        final = self.event({"type": kind, "response": self.response(status, self.out)})
        return Streamed(last, *self.recorded(gen), [final])

    def error(self, exc: HarnessRLError) -> str:
        return self.event(self.failed(exc))
