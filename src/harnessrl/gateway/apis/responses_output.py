"""Sampled text -> Responses API output items, incrementally, for streaming and non-streaming alike.

``OutputStream`` is fed one sampled piece at a time and returns the stream events that piece
completes (``response.output_item.added``, ``response.output_text.delta``, ...; without
``sequence_number``, which the SSE writer adds). The non-streaming path feeds the same pieces and
drops the events, so both answers are built by one piece of code and always agree.

Output order is the order of the sampled text: a ``reasoning`` item for each reasoning block (as
the configured reasoning parser reads it: ``<think>...</think>``, Harmony's ``analysis`` channel...), a
``message`` item for the text, one ``function_call`` item per tool call (parsed by the configured tool
parser, which holds text back while a tag may be starting, so no delta ever shows part of a tool
call). Whitespace between a reasoning block and the answer (the template's separator) is dropped.
Whitespace at the end of the text is held back too and dropped when tool calls follow it, as chat
completions trims content with tool calls.

A family that can open a block again after the answer started (``glm45``) gets a new reasoning item
for it; the open message keeps receiving the answer's text.
"""

from __future__ import annotations

import secrets
from typing import Any

from harnessrl.gateway.apis.responses_input import encode_reasoning
from harnessrl.gateway.parsers.formats import DEFAULT_REASONING_PARSER
from harnessrl.gateway.parsers.reasoning import (
    ContentText,
    ReasoningEvent,
    ReasoningParser,
    ReasoningText,
    get_reasoning_parser,
)
from harnessrl.gateway.parsers.tools import ContentEvent, HeldWhitespace, ToolCall, ToolCallEvent, ToolParser
from harnessrl.gateway.pipeline.generation import Piece


def close_reasoning_item(
    item: dict[str, Any], index: int, text: str, *, encrypt: bool, status: str
) -> list[dict[str, Any]]:
    """Complete a reasoning output item with its ``text`` and return the events that say so.

    The full reasoning goes in the summary too: harnesses echo summaries back, and matching the
    next call's history against this answer needs the text (teacher mode gives the same shape)."""
    item.update(
        summary=[{"type": "summary_text", "text": text}] if text else [],
        content=[{"type": "reasoning_text", "text": text}],
        encrypted_content=encode_reasoning(text) if encrypt else None,
        status=status,
    )
    done = {"item_id": item["id"], "output_index": index, "content_index": 0, "text": text}
    return [
        {"type": "response.reasoning_text.done", **done},
        {"type": "response.output_item.done", "output_index": index, "item": dict(item)},
    ]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class OutputStream:
    """Builds the output items of one response from sampled pieces, emitting stream events."""

    def __init__(
        self, parser: ToolParser | None, *, reasoning: ReasoningParser | None = None, encrypt: bool = False
    ) -> None:
        """``reasoning``: the answer's reasoning parser (``GatewayState.reasoning_parser``; default
        ``qwen3``'s, the text not starting inside a block)."""
        self.parser = parser
        self.reasoning = (
            reasoning if reasoning is not None else get_reasoning_parser(DEFAULT_REASONING_PARSER)()
        )
        self.encrypt = encrypt  # also return the reasoning as (our plain) encrypted_content
        self.items: list[dict[str, Any]] = []  # output items in output_index order
        self.reasoning_tokens = 0
        self.tool_calls: list[ToolCall] = []
        self._reasoning: dict[str, Any] | None = None  # the last reasoning item (open or closed)
        self._reasoning_text = ""
        self._reasoning_texts: list[str] = []  # the closed reasoning items' texts
        self._message: dict[str, Any] | None = None  # the open message item
        self._text = ""
        self._held_ws = HeldWhitespace()  # trailing whitespace not released yet
        self._run: list[str] = []  # the answer's text not given to the tool parser yet (``flush``)
        # A reasoning block was entered and no content has followed it yet: leading whitespace of
        # the content is the template's separator (and its tokens count as reasoning).
        self._after_block = False

    # -- feeding ------------------------------------------------------------------------------------

    def feed(self, piece: Piece) -> list[dict[str, Any]]:
        before = self._note_block()
        events = self._route(self.reasoning.feed(piece.text)) if piece.text else []
        # A token is reasoning if any of its text was inside a reasoning block (or its separator).
        if piece.token_id >= 0 and not piece.is_stop_token and (before or self._note_block()):
            self.reasoning_tokens += 1
        return events

    def feed_whole(self, text: str) -> bool:
        """Read a whole answer's text at once (nothing fed before), if it has no reasoning: whether
        it did. An answer with reasoning markup must be fed piece by piece (``reasoning_tokens``
        counts tokens by where the text was when each arrived); this stream is then spoiled."""
        if self.reasoning.in_reasoning:
            return False
        parsed = self.reasoning.feed(text)
        plain = not self.reasoning.in_reasoning and all(isinstance(e, ContentText) for e in parsed)
        if not plain or sum(len(e.text) for e in parsed) != len(text):
            return False
        self._route(parsed)
        return True

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close every open item; ``status`` is ``completed`` or ``incomplete``."""
        events = self._route(self.reasoning.finish()) + self.flush()
        if self.parser is not None:
            events += self._content(self.parser.finish())
        events += self._close_reasoning(status)
        held = self._held_ws.take()
        if held and not self.tool_calls:
            events += self._delta(held)
        if self._message is None and not self.tool_calls:
            events += self._open_message()  # every answer without tool calls has a message, maybe empty
        if self._message is not None:
            events += self._close_message(status)
        return events

    def _note_block(self) -> bool:
        """Whether the text is now in a reasoning block or the separator after it (noting the block,
        also one that ends without any text in it)."""
        if self.reasoning.in_reasoning:
            self._after_block = True
        return self._after_block

    def _route(self, parsed: list[ReasoningEvent]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for event in parsed:
            if isinstance(event, ReasoningText):
                self._after_block = True
                events += self.flush() + self._reasoning_delta(event.text)
                continue
            text = event.text
            if self._after_block:
                events += self.flush()  # whether the message is open decides the separator
                if self._message is None:
                    text = text.lstrip()  # the separator between the block and the answer
                if not text:
                    continue
                self._after_block = False
            events += self._close_reasoning("completed")
            self._run.append(text)
        return events

    def flush(self) -> list[dict[str, Any]]:
        """The events of the answer's text routed since the last flush, given to the tool parser at
        once: a stream's pieces are routed one by one (the reasoning tokens are counted by where each
        arrived), their text is parsed and rendered a read at a time (``ResponsesAnswer.held``)."""
        if not self._run:
            return []
        text = "".join(self._run) if len(self._run) > 1 else self._run[0]
        self._run.clear()
        return self._content(self.parser.feed(text) if self.parser is not None else [ContentEvent(text)])

    def _content(self, parsed: list[Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for event in parsed:
            if isinstance(event, ContentEvent):
                body = self._held_ws.before(event.text)
                if body:
                    events += self._delta(body)
            elif isinstance(event, ToolCallEvent):
                events += self._function_call(event.call)
        return events

    # -- items --------------------------------------------------------------------------------------

    def _add(self, item: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        self.items.append(item)
        index = len(self.items) - 1
        return index, [{"type": "response.output_item.added", "output_index": index, "item": dict(item)}]

    def _reasoning_delta(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._reasoning is None or self._reasoning["status"] != "in_progress":
            # The first block, or one the model opened after the answer started (glm45).
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "status": "in_progress"}
            _, events = self._add(item)
            self._reasoning, self._reasoning_text = item, ""
        self._reasoning_text += text
        index = self.items.index(self._reasoning)
        return events + [
            {
                "type": "response.reasoning_text.delta",
                "item_id": self._reasoning["id"],
                "output_index": index,
                "content_index": 0,
                "delta": text,
            }
        ]

    def _close_reasoning(self, status: str) -> list[dict[str, Any]]:
        item = self._reasoning
        if item is None or item["status"] != "in_progress":
            return []
        text = self._reasoning_text.strip()
        self._reasoning_texts.append(text)
        return close_reasoning_item(item, self.items.index(item), text, encrypt=self.encrypt, status=status)

    def _open_message(self) -> list[dict[str, Any]]:
        item = {
            "id": new_id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        index, events = self._add(item)
        self._message = item
        part = {"type": "output_text", "text": "", "annotations": []}
        return events + [
            {
                "type": "response.content_part.added",
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "part": part,
            }
        ]

    def _delta(self, text: str) -> list[dict[str, Any]]:
        events = self._open_message() if self._message is None else []
        assert self._message is not None
        self._text += text
        return events + [
            {
                "type": "response.output_text.delta",
                "item_id": self._message["id"],
                "output_index": self.items.index(self._message),
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            }
        ]

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        item = self._message
        assert item is not None
        index = self.items.index(item)
        part = {"type": "output_text", "text": self._text, "annotations": [], "logprobs": []}
        item.update(content=[part], status=status)
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            {"type": "response.output_text.done", **where, "text": self._text, "logprobs": []},
            {"type": "response.content_part.done", **where, "part": part},
            {"type": "response.output_item.done", "output_index": index, "item": dict(item)},
        ]

    def _function_call(self, call: ToolCall) -> list[dict[str, Any]]:
        self.tool_calls.append(call)
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.id,
            "name": call.name,
            "arguments": "",
        }
        index, events = self._add(item)
        where = {"item_id": item["id"], "output_index": index}
        item.update(arguments=call.arguments, status="completed")
        return events + [
            {"type": "response.function_call_arguments.delta", **where, "delta": call.arguments},
            {
                "type": "response.function_call_arguments.done",
                **where,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "response.output_item.done", "output_index": index, "item": dict(item)},
        ]

    # -- results ------------------------------------------------------------------------------------

    def internal_message(self) -> dict[str, Any]:
        """The answer in the internal (chat) shape: what the next call's history is matched against."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self._text if self._message is not None else None,
        }
        if self.tool_calls:
            message["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self._reasoning is not None:
            message["reasoning_content"] = "\n".join(self._reasoning_texts)
        return message
