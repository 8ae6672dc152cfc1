"""Tool-call parsers: sampled text -> OpenAI ``tool_calls``, per model family, in a registry.

A parser is incremental (``feed`` text as it is sampled, ``finish`` at the end) and emits
``ContentEvent`` / ``ToolCallEvent`` items, so streaming and non-streaming answers come from the
same code. ``parse_tool_calls`` is the non-streaming view.

``hermes`` (Hermes, Qwen2.5/3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.
Text outside the blocks is content. A block whose JSON does not parse (or lacks a name) stays in
the content as text, and so does an unclosed block (a response cut by ``max_tokens``): we never
invent a call the policy did not fully make.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from harnessrl.errors import ConfigError


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, serialized (OpenAI sends arguments as a string)
    id: str = field(default_factory=lambda: f"call_{secrets.token_hex(12)}")

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ContentEvent:
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    call: ToolCall


Event = ContentEvent | ToolCallEvent


class ToolParser(Protocol):
    def feed(self, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag`` (a tag maybe starting)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


class HermesToolParser:
    """``<tool_call>{json}</tool_call>``, streamed: content is released as soon as it cannot be a tag."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def __init__(self) -> None:
        self._buffer = ""
        self._in_block = False

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while True:
            if not self._in_block:
                start = self._buffer.find(self.open_tag)
                if start < 0:
                    hold = _partial_suffix(self._buffer, self.open_tag)
                    ready = self._buffer[: len(self._buffer) - hold]
                    if ready:
                        events.append(ContentEvent(ready))
                    self._buffer = self._buffer[len(ready) :]
                    return events
                if start:
                    events.append(ContentEvent(self._buffer[:start]))
                self._buffer = self._buffer[start + len(self.open_tag) :]
                self._in_block = True
            end = self._buffer.find(self.close_tag)
            if end < 0:
                return events
            inner = self._buffer[:end]
            self._buffer = self._buffer[end + len(self.close_tag) :]
            self._in_block = False
            call = self._parse_block(inner)
            if call is None:
                events.append(ContentEvent(self.open_tag + inner + self.close_tag))
            else:
                events.append(ToolCallEvent(call))

    def finish(self) -> list[Event]:
        rest = (self.open_tag if self._in_block else "") + self._buffer
        self._buffer, self._in_block = "", False
        return [ContentEvent(rest)] if rest else []

    @staticmethod
    def _parse_block(inner: str) -> ToolCall | None:
        try:
            data = json.loads(inner.strip())
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
            return None
        arguments = data.get("arguments", data.get("parameters", {}))
        if isinstance(arguments, str):
            # Some models emit arguments already serialized; accept them only if they are JSON.
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(name=data["name"], arguments=json.dumps(arguments, ensure_ascii=False))


TOOL_PARSERS: dict[str, Callable[[], ToolParser]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
}


def get_tool_parser(name: str) -> Callable[[], ToolParser]:
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(TOOL_PARSERS))
        raise ConfigError(f"gateway.tool_call_parser: unknown parser {name!r} (known: {known})") from None


@dataclass
class ParsedMessage:
    content: str | None
    tool_calls: list[ToolCall]


def collect(events: list[Event]) -> ParsedMessage:
    """Fold events into one message: with tool calls, content is trimmed (None when empty)."""
    text = "".join(e.text for e in events if isinstance(e, ContentEvent))
    calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
    if calls:
        return ParsedMessage(content=text.strip() or None, tool_calls=calls)
    return ParsedMessage(content=text, tool_calls=[])


def parse_tool_calls(text: str, parser: str = "hermes") -> ParsedMessage:
    p = get_tool_parser(parser)()
    return collect(p.feed(text) + p.finish())
