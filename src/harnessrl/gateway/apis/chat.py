"""``POST /v1/chat/completions``: OpenAI chat, streaming or not, with tools.

The call runs through ``pipeline``; this module holds chat's shapes. Tool calls come from the
configured parser. Streaming emits content as the engine samples it, one chunk per engine read (the
tokens that arrived together: their text in one delta, one logprob entry per token; ``held``), and
each tool call as one delta when its block closes. The answered message is recorded exactly as the client receives it (same tool-call ids),
because it is what the next call's history is matched against.

Chat's body is the one a harness resends longest, so parsing it is incremental too: the messages
the request repeats of the rollout's last one (``RolloutMemory.repeats``) and the rest of the body,
when it is the same JSON again, passed every check then and are not walked again.
"""

from __future__ import annotations

from itertools import compress
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from harnessrl.errors import ContextLengthExceeded, HarnessRLError
from harnessrl.gateway.apis.logprobs import logprob_content, logprob_json
from harnessrl.gateway.apis.openai_shapes import openai_envelope, openai_usage
from harnessrl.gateway.bodies import CheckedRest, check_repeating_body, decode_body, rest_json, validate_tail
from harnessrl.gateway.body_models import ChatCompletionRequest
from harnessrl.gateway.errors import sse_error
from harnessrl.gateway.parsers.tools import (
    ContentEvent,
    ContentWhitespace,
    ParsedMessage,
    ToolCallEvent,
    collect,
)
from harnessrl.gateway.parsers.tools import Event as ToolEvent
from harnessrl.gateway.pipeline.answer import HOLD_AT_MOST, Event, feed_each
from harnessrl.gateway.pipeline.calls import PreparedCall
from harnessrl.gateway.pipeline.driver import CallRequest, Streamed, Whole, serve
from harnessrl.gateway.pipeline.generation import Generation, Piece
from harnessrl.gateway.pipeline.limits import check_prompt_size
from harnessrl.gateway.pipeline.wire import DONE, dumps, json_response, sse
from harnessrl.gateway.prompt.history import RolloutMemory
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.teacher.chat import teacher_chat
from harnessrl.schemas import Rollout

__all__ = ["CHAT", "chat_completions"]

_ROLE_DELTA = b'{"role":"assistant","content":""}'
_OPEN_END = b',"finish_reason":null}]}\n\n'  # a chunk's end while the answer goes on


def answer_message(parsed: ParsedMessage, gen: Generation) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason OpenAI would give for this generation."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    finish = gen.finish_reason
    if parsed.tool_calls:
        message["tool_calls"] = [c.to_openai() for c in parsed.tool_calls]
        if finish == "stop":
            finish = "tool_calls"
    return message, finish


class ChatApi:
    name = "chat.completions"

    async def parse(
        self, state: GatewayState, rollout: Rollout, memory: RolloutMemory, raw: bytes
    ) -> CallRequest[ChatCompletionRequest]:
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
        kwargs = body.chat_template_kwargs.as_kwargs() if body.chat_template_kwargs is not None else None
        tools = memory.template_tools(state.engine.tokenizer, data, body.tools or None, kwargs, known=known)
        memory.last_rest = CheckedRest(rest, rest_chars, body, tools) if rest is not None else None
        return CallRequest(
            data,
            body,
            body.requested_max_tokens,
            "messages",
            messages=data["messages"],
            tools=tools,
            template_kwargs=kwargs,
            repeated=repeated,
            messages_are_the_body=True,
        )

    def too_long(
        self,
        state: GatewayState,
        exc: ContextLengthExceeded,
        request: CallRequest[Any],
        prompt_len: int,
        rollout: Rollout,
    ) -> ContextLengthExceeded:
        # Name the budget field the client sent: ``max_completion_tokens`` wins over ``max_tokens``.
        if request.body.max_completion_tokens is not None and exc.param == "max_tokens":
            exc.param = "max_completion_tokens"
        return exc

    def answer(self, call: PreparedCall, request: CallRequest[ChatCompletionRequest]) -> ChatAnswer:
        return ChatAnswer(call, request.body)


CHAT = ChatApi()


async def chat_completions(request: Request) -> Response:
    teacher = request.app.state.gateway.teacher
    if teacher is not None:
        return await teacher_chat(request, teacher)
    return await serve(CHAT, request)


class ChatAnswer:
    """A chat completion, whole or as ``chat.completion.chunk`` events."""

    headers: dict[str, str] = {}
    ping = None
    whole_from_pieces = False

    def __init__(self, call: PreparedCall, body: ChatCompletionRequest) -> None:
        self.call = call
        self.body = body
        self.model = body.model or call.state.engine.model_name
        state = call.state
        self.parser = state.tool_parser(body.tools) if body.wants_tool_calls else None
        self.events: list[ToolEvent] = []
        self.n_calls = 0
        self.base: dict[str, Any] = {}
        self.head = b""  # a chunk's encoded event up to its delta (``started``)
        # Sampled tokens (and their logprobs) whose text is not released yet: the next chunk's entries.
        self.pending_ids: list[int] = []
        self.pending_lps: list[float] = []
        self.held_text: list[str] = []  # pieces' text not rendered yet (``held``)
        # With a tool parser: which content to send when (the whole answer's rule, ``collect``'s).
        self.trim = ContentWhitespace()

    # -- whole ----------------------------------------------------------------------------------

    def whole(self, gen: Generation) -> Whole:
        body, call = self.body, self.call
        if self.parser is not None:
            parsed = collect(self.parser.feed(gen.text) + self.parser.finish())
        else:
            parsed = ParsedMessage(content=gen.text, tool_calls=[])
        message, finish = answer_message(parsed, gen)
        logprobs = None
        if body.logprobs:
            ids, lps = gen.token_ids, gen.logprobs
            stop_ids = set(call.params.stop_token_ids)
            if ids and ids[-1] in stop_ids:  # a sampled stop token has no entry (it ends the answer)
                ids, lps = ids[:-1], lps[:-1]
            if not stop_ids.isdisjoint(ids):  # any other (an engine that went on past one)
                kept = [(t, lp) for t, lp in zip(ids, lps, strict=True) if t not in stop_ids]
                ids, lps = [t for t, _ in kept], [lp for _, lp in kept]
            logprobs = {"content": logprob_content(call.state.engine.tokenizer, ids, lps)}
        payload = {
            **openai_envelope("chatcmpl", "chat.completion", self.model, gen.policy_version),
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
            "usage": openai_usage(call),
        }
        return Whole(json_response(payload), message, finish)

    # -- streamed -------------------------------------------------------------------------------

    def opening(self) -> list[Event]:
        return []

    def waiting(self, comment: str) -> list[Event]:
        return [comment]

    def started(self, gen: Generation) -> list[Event]:
        policy = self.call.state.engine.policy_version
        self.base = openai_envelope("chatcmpl", "chat.completion.chunk", self.model, policy)
        # Every chunk is this envelope, one choice and its delta: the constant parts are encoded once
        # and each chunk's event is joined from bytes (what ``sse`` of the chunk's dict gives).
        self.head = b"data: " + dumps(self.base)[:-1] + b',"choices":[{"index":0,"delta":'
        return [self._chunk(_ROLE_DELTA)]

    def feed(self, piece: Piece) -> list[Event]:
        if self.body.logprobs and piece.token_id >= 0 and not piece.is_stop_token:
            self.pending_ids.append(piece.token_id)
            self.pending_lps.append(piece.logprob)
        if piece.text:
            self.held_text.append(piece.text)
            if len(self.held_text) >= HOLD_AT_MOST:
                return self.held()
        return []

    def feed_all(self, pieces: list[Piece]) -> list[Event]:
        # An engine read's pieces at once: their texts held and their logprob entries pending, as
        # ``feed`` of each does, unless the hold would reach its bound among them (then one by one,
        # so the chunk is cut where ``feed`` cuts it).
        if len(pieces) < 2:  # a read of one token (a stream's first): nothing to gain
            return self.feed(pieces[0]) if pieces else []
        texts, ids, logprobs, stops = zip(*pieces, strict=True)
        texts = list(filter(None, texts))  # pieces with text (a stop token's has none)
        if len(self.held_text) + len(texts) >= HOLD_AT_MOST:
            return feed_each(self.feed, pieces)
        if self.body.logprobs:
            n = len(ids) - 1 if stops[-1] else len(ids)  # a stop token ends the read: it has no entry
            ids, logprobs = ids[:n], logprobs[:n]
            if True in stops[:n] or (ids and min(ids) < 0):  # a text-only piece (the tail) has none
                kept = [token_id >= 0 and not stop for token_id, stop in zip(ids, stops[:n], strict=True)]
                ids, logprobs = tuple(compress(ids, kept)), tuple(compress(logprobs, kept))
            self.pending_ids += ids
            self.pending_lps += logprobs
        self.held_text += texts
        return []

    def held(self) -> list[Event]:
        """The pieces fed since the last chunk as one chunk (and what their text completes for the
        tool parser): the tokens of one engine read, their logprob entries one per token."""
        if not self.held_text:
            return []
        text = "".join(self.held_text) if len(self.held_text) > 1 else self.held_text[0]
        self.held_text.clear()
        if self.parser is None:
            return [self._content(text)]
        return self._emit(self.parser.feed(text))

    def finished(self, gen: Generation) -> Streamed:
        last = self.held()
        if self.parser is not None:
            last += self._emit(self.parser.finish())
            rest = self.trim.end()
            if rest:
                last.append(self._content(rest))
            parsed = collect(self.events)
        else:
            parsed = ParsedMessage(content=gen.text, tool_calls=[])
        message, finish = answer_message(parsed, gen)
        tail: list[Event] = [self._chunk(b"{}", finish=finish)]
        if self.body.include_usage:
            tail.append(sse({**self.base, "choices": [], "usage": openai_usage(self.call)}))
        tail.append(DONE)
        return Streamed(last, message, finish, tail)

    def error(self, exc: HarnessRLError) -> str:
        return sse_error(exc)

    def _emit(self, new_events: list[ToolEvent]) -> list[Event]:
        out: list[Event] = []
        for event in new_events:
            self.events.append(event)
            if isinstance(event, ContentEvent):
                text = self.trim.text(event.text)
                if text:
                    out.append(self._content(text))
            elif isinstance(event, ToolCallEvent):
                self.trim.call()
                delta = {"tool_calls": [{"index": self.n_calls, **event.call.to_openai()}]}
                out.append(self._chunk(dumps(delta)))
                self.n_calls += 1
        return out

    def _content(self, text: str) -> bytes:
        return self._chunk(b'{"content":' + dumps(text) + b"}")

    def _chunk(self, delta: bytes, finish: str | None = None) -> bytes:
        """The event of one chunk whose delta is the JSON ``delta``, with the pending logprobs."""
        lp = b"null"
        if self.body.logprobs:
            tokenizer = self.call.state.engine.tokenizer
            lp = b'{"content":' + logprob_json(tokenizer, self.pending_ids, self.pending_lps) + b"}"
            self.pending_ids, self.pending_lps = [], []
        end = _OPEN_END if finish is None else b',"finish_reason":' + dumps(finish) + b"}]}\n\n"
        return b"".join((self.head, delta, b',"logprobs":', lp, end))
