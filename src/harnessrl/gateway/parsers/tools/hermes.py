"""``hermes`` (Hermes, Qwen2.5, Qwen3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.

Text outside the blocks is content. A block whose JSON does not parse (or lacks a name) stays in
the content as text, and so does an unclosed block (a response cut by ``max_tokens``).
"""

from __future__ import annotations

from harnessrl.gateway.parsers.tools.base import (
    ContentEvent,
    Event,
    ToolCall,
    ToolCallEvent,
    Tools,
    call_with_arguments,
    model_json,
    partial_suffix,
)


class HermesToolParser:
    """``<tool_call>{json}</tool_call>``, streamed: content is released as soon as it cannot be a tag."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def __init__(self, tools: Tools = None) -> None:
        self._buffer = ""  # text not read yet (inside a block, in ``_block`` instead)
        self._in_block = False
        # Inside a block: its pieces so far. A block (a long argument) streamed in small pieces is
        # joined once at its end, and each piece is searched for the close tag only with the few
        # characters before it that the tag could start in (``_tail``).
        self._block: list[str] = []
        self._tail = ""
        self.malformed = 0  # blocks returned as text

    def feed(self, text: str) -> list[Event]:
        if not self._buffer and not self._in_block and "<" not in text:
            # Fed once per sampled token: text with nothing held and no "<" cannot hold or start a tag.
            return [ContentEvent(text)] if text else []
        if self._in_block:
            return self._feed_block(text)
        self._buffer += text
        return self._feed_content()

    def _feed_block(self, text: str) -> list[Event]:
        """Inside a block: keep the piece, unless the close tag ends in it (then read the block)."""
        window = self._tail + text
        if self.close_tag not in window:
            self._block.append(text)
            self._tail = window[1 - len(self.close_tag) :]
            return []
        self._buffer = "".join(self._block) + text
        self._block.clear()
        return self._feed_content()

    def _feed_content(self) -> list[Event]:
        events: list[Event] = []
        while True:
            if not self._in_block:
                start = self._buffer.find(self.open_tag)
                if start < 0:
                    hold = partial_suffix(self._buffer, self.open_tag)
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
                self._block, self._tail = [self._buffer], self._buffer[1 - len(self.close_tag) :]
                self._buffer = ""
                return events  # the block goes on: ``_feed_block`` reads the next pieces
            inner = self._buffer[:end]
            self._buffer = self._buffer[end + len(self.close_tag) :]
            self._in_block = False
            call = self._parse_block(inner)
            if call is None:
                self.malformed += 1
                events.append(ContentEvent(self.open_tag + inner + self.close_tag))
            else:
                events.append(ToolCallEvent(call))

    def finish(self) -> list[Event]:
        if self._in_block:
            self.malformed += 1  # cut short (max_tokens, a stop string)
        rest = (self.open_tag + "".join(self._block) if self._in_block else "") + self._buffer
        self._buffer, self._in_block = "", False
        self._block.clear()
        return [ContentEvent(rest)] if rest else []

    @staticmethod
    def _parse_block(inner: str) -> ToolCall | None:
        ok, data = model_json(inner.strip())
        if not ok or not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
            return None
        # Some models write the arguments already serialized: call_with_arguments reads them then.
        return call_with_arguments(data["name"], data.get("arguments", data.get("parameters", {})))
