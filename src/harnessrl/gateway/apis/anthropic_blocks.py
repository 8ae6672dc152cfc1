"""Sampled text -> Anthropic content blocks, incrementally, for streaming and non-streaming answers alike.

The policy samples one text: ``[<think>…</think>] content [<tool_call>{…}</tool_call>…]``, in its
family's markers. The ``BlockAssembler`` splits it as it arrives into ``thinking``, ``text`` and
``tool_use`` blocks (reasoning by the configured reasoning parser, ``reasoning_parsers``; tool calls in
the content by the tool parser) and returns the stream events each piece produces
(``content_block_start`` / ``_delta`` / ``_stop``).
A non-streaming answer feeds the whole text and keeps only ``blocks``; a streaming one forwards
the events. Both therefore answer with the same blocks, and ``message()`` (the internal assistant
message that is recorded and matched against the next call's history) is built from exactly what
the client received: text blocks joined with nothing, which is how ``anthropic_convert`` reads an
assistant turn back.

Whitespace: a block never starts or ends with whitespace (Anthropic's API rejects such assistant
content when a client sends it back), so leading whitespace is dropped and trailing whitespace is
held until non-whitespace follows in the same block. A block that would be only whitespace is
never opened. ``<tool_call>`` text is held back by the tool parser (``tool_parsers``), the same
one the chat API uses; a ``tool_use`` block arrives whole when its call closes.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import replace
from typing import Any

from harnessrl.gateway.parsers.formats import DEFAULT_REASONING_PARSER
from harnessrl.gateway.parsers.reasoning import (
    ReasoningEvent,
    ReasoningParser,
    ReasoningText,
    get_reasoning_parser,
)
from harnessrl.gateway.parsers.tools import ContentEvent, Event, HeldWhitespace, ToolCall, ToolParser


def thinking_signature(thinking: str) -> str:
    """An opaque stand-in for Anthropic's signature: clients must send one back, nothing verifies it."""
    return "harnessrl-" + hashlib.sha256(thinking.encode("utf-8")).hexdigest()[:32]


def _start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


#: The field of each delta type whose text adjacent deltas of one block join into (``joined_deltas``).
_TEXT_FIELDS = {"text_delta": "text", "thinking_delta": "thinking"}


def joined_deltas(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` with each run of adjacent text (or thinking) deltas of one block as one delta of
    their joined text, as Anthropic's own streams carry several tokens' text in one."""
    out: list[dict[str, Any]] = []
    run: list[str] = []  # the texts of the run that ``out[-1]`` starts
    for event in events:
        delta = event.get("delta") if event["type"] == "content_block_delta" else None
        field = _TEXT_FIELDS.get(delta["type"]) if delta is not None else None
        if field is not None and run:
            last = out[-1]
            if last["index"] == event["index"] and last["delta"]["type"] == delta["type"]:
                run.append(delta[field])
                continue
        if len(run) > 1:
            _join_run(out[-1], run)
        run = [delta[field]] if field is not None else []
        out.append(event)
    if len(run) > 1:
        _join_run(out[-1], run)
    return out


def _join_run(event: dict[str, Any], texts: list[str]) -> None:
    kind = event["delta"]["type"]
    event["delta"] = {"type": kind, _TEXT_FIELDS[kind]: "".join(texts)}


class BlockAssembler:
    def __init__(self, parser: ToolParser | None, *, reasoning: ReasoningParser | None = None) -> None:
        """``reasoning``: the answer's reasoning parser (``GatewayState.reasoning_parser``; default
        ``qwen3``'s, the text not starting inside a block)."""
        self._reasoning = (
            reasoning if reasoning is not None else get_reasoning_parser(DEFAULT_REASONING_PARSER)()
        )
        self._parser = parser  # None: tool calls are not parsed (no tools, or tool_choice none)
        self.blocks: list[dict[str, Any]] = []  # whole once ``finish`` has closed the last one
        self.calls: list[ToolCall] = []
        self._open: str | None = None  # "thinking" | "text": the block still receiving deltas
        self._held_ws = HeldWhitespace()  # trailing whitespace of the open block, not sent yet
        # The open block's text so far, joined into the block when it closes: a streamed answer
        # adds one piece per token, and ``+=`` on the block's string copied it whole every time.
        self._parts: list[str] = []
        # Content was given to the tool parser since reasoning last came: what it holds (a tag that
        # may be starting) is released before a later reasoning block, so the blocks keep the order
        # of the sampled text.
        self._parser_has_content = False

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Stream events for newly sampled text."""
        events: list[dict[str, Any]] = []
        for event in self._reasoning.feed(text):
            events += self._route(event)
        return events

    def finish(self) -> list[dict[str, Any]]:
        """Stream events for what was held back, closing the last block."""
        events: list[dict[str, Any]] = []
        for event in self._reasoning.finish():
            events += self._route(event)
        if self._parser is not None:
            for event in self._parser.finish():
                events += self._on_parsed(event)
        return events + self._close()

    def message(self) -> dict[str, Any]:
        """The internal (OpenAI chat shaped) assistant message for what the client received."""
        text = "".join(b["text"] for b in self.blocks if b["type"] == "text")
        thinking = "".join(b["thinking"] for b in self.blocks if b["type"] == "thinking")
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not self.calls else None}
        if self.calls:
            message["tool_calls"] = [c.to_openai() for c in self.calls]
        if thinking:
            message["reasoning_content"] = thinking
        return message

    def _route(self, event: ReasoningEvent) -> list[dict[str, Any]]:
        if isinstance(event, ReasoningText):
            # Content before a block that opens after the answer started (glm45) may still be held
            # by the tool parser (the start of a tag that never came): it goes first, in its block.
            events: list[dict[str, Any]] = []
            if self._parser_has_content and self._parser is not None:
                self._parser_has_content = False
                for parsed in self._parser.finish():
                    events += self._on_parsed(parsed)
            return events + self._append("thinking", event.text)
        if self._parser is None:
            return self._append("text", event.text)
        self._parser_has_content = True
        events = []
        for parsed in self._parser.feed(event.text):
            events += self._on_parsed(parsed)
        return events

    def _on_parsed(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, ContentEvent):
            return self._append("text", event.text)
        events = self._close()
        call = event.call
        if not call.family_id:  # the family's own id goes back into its template as it is
            call = replace(call, id=f"toolu_{secrets.token_hex(12)}")
        self.calls.append(call)
        index = len(self.blocks)
        self.blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)}
        )
        # Streamed as Anthropic does: an empty ``input`` in the start event, then the JSON as deltas.
        return events + [
            _start(index, {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}),
            _delta(index, {"type": "input_json_delta", "partial_json": call.arguments}),
            {"type": "content_block_stop", "index": index},
        ]

    def _append(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open != kind:
            if not text.strip():
                return events  # whitespace never opens a block
            events += self._close()
            text = text.lstrip()
            block: dict[str, Any] = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            self.blocks.append(block)
            self._open = kind
            events.append(_start(len(self.blocks) - 1, dict(block)))
        body = self._held_ws.before(text)
        if body:
            field = "thinking" if kind == "thinking" else "text"
            self._parts.append(body)
            events.append(_delta(len(self.blocks) - 1, {"type": f"{field}_delta", field: body}))
        return events

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        index = len(self.blocks) - 1
        block = self.blocks[-1]
        block[self._open] = "".join(self._parts)  # the field is named after the kind
        self._parts = []
        events = []
        if self._open == "thinking":
            signature = thinking_signature(block["thinking"])
            block["signature"] = signature
            events.append(_delta(index, {"type": "signature_delta", "signature": signature}))
        events.append({"type": "content_block_stop", "index": index})
        self._open = None
        self._held_ws.take()  # a block's trailing whitespace is never sent
        return events
