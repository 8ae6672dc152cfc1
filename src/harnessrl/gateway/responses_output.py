"""Sampled text -> Responses API output items, incrementally, for streaming and non-streaming alike.

``OutputStream`` is fed one sampled piece at a time and returns the stream events that piece
completes (``response.output_item.added``, ``response.output_text.delta``, ...; without
``sequence_number``, which the SSE writer adds). The non-streaming path feeds the same pieces and
drops the events, so both answers are built by one piece of code and always agree.

Output order is the order of the sampled text: a ``reasoning`` item for a leading
``<think>...</think>`` block, a ``message`` item for the text, one ``function_call`` item per
``<tool_call>`` block (parsed by the configured tool parser, which holds text back while a tag may be
starting, so no delta ever shows part of a tool call). Whitespace at the end of the text is held
back too and dropped when tool calls follow it, as chat completions trims content with tool calls.
"""

from __future__ import annotations

import secrets
from typing import Any

from harnessrl.gateway.generation import Piece
from harnessrl.gateway.responses_input import encode_reasoning
from harnessrl.gateway.tool_parsers import ContentEvent, ToolCall, ToolCallEvent, ToolParser, partial_suffix

OPEN_THINK, CLOSE_THINK = "<think>", "</think>"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class ThinkSplitter:
    """Splits sampled text into reasoning (a leading ``<think>`` block) and content, incrementally.

    ``in_think``: the prompt already opened the block (templates that end the generation prompt with
    ``<think>\\n``), so the text starts inside it.
    """

    def __init__(self, in_think: bool = False) -> None:
        self.state = "think" if in_think else "start"  # start | think | after | content
        self._buf = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        """``(kind, text)`` pairs, kind ``reasoning`` or ``content``."""
        self._buf += text
        out: list[tuple[str, str]] = []
        while True:
            if self.state == "start":
                stripped = self._buf.lstrip()
                if stripped.startswith(OPEN_THINK):
                    self._buf, self.state = stripped[len(OPEN_THINK) :], "think"
                elif OPEN_THINK.startswith(stripped):
                    return out  # still maybe the opening tag (or only whitespace so far)
                else:
                    self.state = "content"
            elif self.state == "think":
                end = self._buf.find(CLOSE_THINK)
                if end < 0:
                    ready = len(self._buf) - partial_suffix(self._buf, CLOSE_THINK)
                    if ready:
                        out.append(("reasoning", self._buf[:ready]))
                    self._buf = self._buf[ready:]
                    return out
                if end:
                    out.append(("reasoning", self._buf[:end]))
                self._buf, self.state = self._buf[end + len(CLOSE_THINK) :], "after"
            elif self.state == "after":
                # The template's separator between the block and the answer is no part of the answer.
                self._buf = self._buf.lstrip()
                if not self._buf:
                    return out
                self.state = "content"
            else:
                if self._buf:
                    out.append(("content", self._buf))
                self._buf = ""
                return out

    def finish(self) -> list[tuple[str, str]]:
        rest, self._buf = self._buf, ""
        if not rest:
            return []
        # An unclosed block (cut by max_output_tokens) is all reasoning: the answer never started.
        return [("reasoning" if self.state == "think" else "content", rest)]


class OutputStream:
    """Builds the output items of one response from sampled pieces, emitting stream events."""

    def __init__(self, parser: ToolParser | None, *, in_think: bool = False, encrypt: bool = False) -> None:
        self.parser = parser
        self.splitter = ThinkSplitter(in_think)
        self.encrypt = encrypt  # also return the reasoning as (our plain) encrypted_content
        self.items: list[dict[str, Any]] = []  # output items in output_index order
        self.reasoning_tokens = 0
        self.tool_calls: list[ToolCall] = []
        self._reasoning: dict[str, Any] | None = None  # the open reasoning item
        self._reasoning_text = ""
        self._message: dict[str, Any] | None = None  # the open message item
        self._text = ""
        self._held_ws = ""  # trailing whitespace not released yet

    # -- feeding ------------------------------------------------------------------------------------

    def feed(self, piece: Piece) -> list[dict[str, Any]]:
        before = self.splitter.state
        events = self._route(self.splitter.feed(piece.text)) if piece.text else []
        # A token is reasoning if any of its text was inside the <think> block (or its separator).
        in_block = {before, self.splitter.state} & {"think", "after"}
        if piece.token_id >= 0 and not piece.is_stop_token and in_block:
            self.reasoning_tokens += 1
        return events

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close every open item; ``status`` is ``completed`` or ``incomplete``."""
        events = self._route(self.splitter.finish())
        if self.parser is not None:
            events += self._content(self.parser.finish())
        events += self._close_reasoning(status)
        if self._held_ws and not self.tool_calls:
            events += self._delta(self._held_ws)
        self._held_ws = ""
        if self._message is None and not self.tool_calls:
            events += self._open_message()  # every answer without tool calls has a message, maybe empty
        if self._message is not None:
            events += self._close_message(status)
        return events

    def _route(self, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for kind, text in pairs:
            if kind == "reasoning":
                events += self._reasoning_delta(text)
            else:
                events += self._close_reasoning("completed")
                parsed = self.parser.feed(text) if self.parser is not None else [ContentEvent(text)]
                events += self._content(parsed)
        return events

    def _content(self, parsed: list[Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for event in parsed:
            if isinstance(event, ContentEvent):
                text = self._held_ws + event.text
                body = text.rstrip()
                self._held_ws = text[len(body) :]
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
        if self._reasoning is None:
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "status": "in_progress"}
            _, events = self._add(item)
            self._reasoning = item
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
        index = self.items.index(item)
        # The full reasoning goes in the summary too: harnesses echo summaries back, and matching
        # the next call's history against this answer needs the text.
        item.update(
            summary=[{"type": "summary_text", "text": text}] if text else [],
            content=[{"type": "reasoning_text", "text": text}],
            encrypted_content=encode_reasoning(text) if self.encrypt else None,
            status=status,
        )
        done = {"item_id": item["id"], "output_index": index, "content_index": 0, "text": text}
        return [
            {"type": "response.reasoning_text.done", **done},
            {"type": "response.output_item.done", "output_index": index, "item": dict(item)},
        ]

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
            message["reasoning_content"] = self._reasoning_text.strip()
        return message
