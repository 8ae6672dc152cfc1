"""Sampled text -> Anthropic content blocks, incrementally, for streaming and non-streaming answers alike.

The policy samples one text: ``[<think>…</think>] content [<tool_call>{…}</tool_call>…]``. The
``BlockAssembler`` splits it as it arrives into ``thinking``, ``text`` and ``tool_use`` blocks and
returns the stream events each piece produces (``content_block_start`` / ``_delta`` / ``_stop``).
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

from harnessrl.gateway.tool_parsers import ContentEvent, Event, ToolCall, ToolParser, partial_suffix

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class ThinkSplitter:
    """Splits sampled text into ``("thinking", …)`` and ``("text", …)`` pieces.

    Reasoning is recognised only at the start of the answer (after optional whitespace), or from
    the first token when the prompt already opened it (templates that end the generation prompt
    with ``<think>``). A ``<think>`` later in the text is ordinary content.
    """

    def __init__(self, in_thinking: bool = False) -> None:
        self._state = "thinking" if in_thinking else "start"
        self._buffer = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        self._buffer += text
        out: list[tuple[str, str]] = []
        while True:
            if self._state == "start":
                head = self._buffer.lstrip()
                if head.startswith(THINK_OPEN):
                    self._buffer, self._state = head[len(THINK_OPEN) :], "thinking"
                    continue
                if THINK_OPEN.startswith(head):
                    return out  # nothing yet, or maybe the start of <think>: wait for more
                self._state = "text"
            elif self._state == "thinking":
                end = self._buffer.find(THINK_CLOSE)
                if end < 0:
                    hold = partial_suffix(self._buffer, THINK_CLOSE)
                    ready = self._buffer[: len(self._buffer) - hold]
                    if ready:
                        out.append(("thinking", ready))
                    self._buffer = self._buffer[len(ready) :]
                    return out
                if end:
                    out.append(("thinking", self._buffer[:end]))
                self._buffer, self._state = self._buffer[end + len(THINK_CLOSE) :], "text"
            else:
                if self._buffer:
                    out.append(("text", self._buffer))
                self._buffer = ""
                return out

    def finish(self) -> list[tuple[str, str]]:
        # An unclosed <think> (cut by max_tokens) is still reasoning, not an answer.
        kind = "thinking" if self._state == "thinking" else "text"
        rest, self._buffer = self._buffer, ""
        return [(kind, rest)] if rest else []


def thinking_signature(thinking: str) -> str:
    """An opaque stand-in for Anthropic's signature: clients must send one back, nothing verifies it."""
    return "harnessrl-" + hashlib.sha256(thinking.encode("utf-8")).hexdigest()[:32]


def _start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


class BlockAssembler:
    def __init__(self, parser: ToolParser | None, *, in_thinking: bool = False) -> None:
        self._split = ThinkSplitter(in_thinking)
        self._parser = parser  # None: tool calls are not parsed (no tools, or tool_choice none)
        self.blocks: list[dict[str, Any]] = []
        self.calls: list[ToolCall] = []
        self._open: str | None = None  # "thinking" | "text": the block still receiving deltas
        self._held_ws = ""  # trailing whitespace of the open block, not sent yet

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Stream events for newly sampled text."""
        events: list[dict[str, Any]] = []
        for kind, piece in self._split.feed(text):
            events += self._route(kind, piece)
        return events

    def finish(self) -> list[dict[str, Any]]:
        """Stream events for what was held back, closing the last block."""
        events: list[dict[str, Any]] = []
        for kind, piece in self._split.finish():
            events += self._route(kind, piece)
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

    def _route(self, kind: str, piece: str) -> list[dict[str, Any]]:
        if kind == "thinking" or self._parser is None:
            return self._append(kind, piece)
        events: list[dict[str, Any]] = []
        for event in self._parser.feed(piece):
            events += self._on_parsed(event)
        return events

    def _on_parsed(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, ContentEvent):
            return self._append("text", event.text)
        events = self._close()
        call = replace(event.call, id=f"toolu_{secrets.token_hex(12)}")
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
        text = self._held_ws + text
        body = text.rstrip()
        self._held_ws = text[len(body) :]
        if body:
            field = "thinking" if kind == "thinking" else "text"
            self.blocks[-1][field] += body
            events.append(_delta(len(self.blocks) - 1, {"type": f"{field}_delta", field: body}))
        return events

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        index = len(self.blocks) - 1
        events = []
        if self._open == "thinking":
            signature = thinking_signature(self.blocks[-1]["thinking"])
            self.blocks[-1]["signature"] = signature
            events.append(_delta(index, {"type": "signature_delta", "signature": signature}))
        events.append({"type": "content_block_stop", "index": index})
        self._open, self._held_ws = None, ""
        return events
