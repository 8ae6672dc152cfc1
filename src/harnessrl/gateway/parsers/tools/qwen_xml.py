"""``qwen3_coder`` / ``qwen3_xml`` (Qwen3-Coder, Qwen3.5): XML tool calls whose arguments are text.

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

A value loses one leading and one trailing newline (the template's framing) and is then typed by
the request's schema for that parameter (``schema_values.coerce_value``, shared with ``glm``), as vLLM does: a
string stays text; integer, number, boolean, null, object and array values are parsed; a value of
an unknown type is parsed as JSON when it is JSON; a parameter the schema does not describe stays
text. Inside a value only ``</parameter>`` is markup, so a value may hold ``</function>`` or
``</tool_call>`` (vLLM ends the call at a ``</function>`` there).

A block that breaks the shape is content up to the point where it breaks, counted in
``malformed``, and reading goes on from there as content, so a good block after a stray
``<tool_call>`` is still a call; a block cut short (``max_tokens``) is content. vLLM instead keeps
what it can: it drops stray text inside a block, makes a call of a truncated block, and accepts a
bare ``<function=...>`` without ``<tool_call>``; see ``tests/vllm/test_parsers_qwen_glm.py``.

The streaming frame (``TaggedBlockParser``) is shared with ``glm``; it lives here, beside its first
caller, until a third format wants it in a module of its own. The schema typing is in
``schema_values``.
"""

from __future__ import annotations

import re

from harnessrl.gateway.parsers.tools.base import (
    ContentEvent,
    Event,
    ToolCall,
    ToolCallEvent,
    Tools,
    arguments_fit,
    arguments_json,
    partial_suffix,
)
from harnessrl.gateway.parsers.tools.schema_values import typed_arguments

_ANGLE = re.compile(r"[<>]")
_SPACE = re.compile(r"\s*")  # \s is str.isspace()'s set
#: A block's read text is moved out of its buffer once this much has gathered: an ordinary block
#: stays one string (as cheap as before), a long one costs at most this much copying per piece.
_SET_ASIDE_AT = 256


def skip_space(buffer: str, pos: int) -> int:
    """Where the run of whitespace at ``pos`` ends (``pos`` when there is none)."""
    if pos < len(buffer) and not buffer[pos].isspace():
        return pos  # most calls: a tag follows at once
    return _SPACE.match(buffer, pos).end()


def match_tag(buffer: str, pos: int, tags: tuple[str, ...]) -> str | None:
    """The tag of ``tags`` at ``pos``; "" when the text so far could still become one; None when none fits."""
    rest = buffer[pos : pos + max(map(len, tags))]
    for tag in tags:
        if rest.startswith(tag):
            return tag
    return "" if any(tag.startswith(rest) for tag in tags) else None


def find_value_end(buffer: str, pos: int, seen: int, close: str) -> tuple[int, int]:
    """Where ``close`` starts at or after ``pos`` (-1: not yet), and from where to look next time."""
    end = buffer.find(close, max(pos, seen))
    return end, max(pos, len(buffer) - len(close) + 1)


class TaggedBlockParser:
    """The streaming frame of ``<tool_call>...</tool_call>`` formats whose block is read piece by piece.

    Outside a block, content is released as soon as it cannot be the start of the open tag. Inside,
    ``_read_block`` (a subclass's format) reads on from ``_pos`` whenever text arrives, waits while
    the text so far could still go either way, and so decides the same for any split of the text.
    """

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    first_state = ""  # where a block's reading starts: the subclass's first state

    def __init__(self, tools: Tools = None) -> None:
        self.tools = tools
        self.malformed = 0  # blocks given back as text
        self._buffer = ""  # outside a block: content not yet released; inside: the block not read yet
        # Inside a block: its text before ``_buffer`` (read, kept to give the block back as text),
        # and of that, the part of the name, key or value being read. A long block streamed in small
        # pieces (a file's text in a value) is kept as its pieces and joined once, not copied again
        # with every piece.
        self._read: list[str] = []
        self._unit: list[str] = []
        self._in_block = False
        self._pos = 0  # how far the block is read
        self._state = ""  # where in the block: the subclass's states
        self._calls: list[tuple[str, dict[str, str]]] = []  # the block's calls read so far, raw
        self._key = ""  # the argument being read
        # In a name, key or value: where to look for its end next (what came before has none), so a
        # long one streamed in small pieces is scanned once, not once per piece.
        self._seen = 0

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while True:
            if not self._in_block:
                start = self._buffer.find(self.open_tag)
                if start < 0:
                    ready = self._buffer[: len(self._buffer) - partial_suffix(self._buffer, self.open_tag)]
                    if ready:
                        events.append(ContentEvent(ready))
                    self._buffer = self._buffer[len(ready) :]
                    return events
                if start:
                    events.append(ContentEvent(self._buffer[:start]))
                self._buffer = self._buffer[start + len(self.open_tag) :]
                self._in_block, self._pos, self._calls = True, 0, []
                self._enter(self.first_state)
            outcome = self._read_block()
            if outcome is None:
                if self._pos >= _SET_ASIDE_AT or self._seen >= _SET_ASIDE_AT:
                    self._set_aside()
                return events
            if outcome == "done":
                typed = [(name, typed_arguments(self.tools, name, raw)) for name, raw in self._calls]
                if all(arguments_fit(arguments) for _, arguments in typed):
                    for name, arguments in typed:
                        events.append(ToolCallEvent(ToolCall(name, arguments_json(arguments))))
                else:
                    outcome = "unfit"  # a value the next request could not carry: text, as a broken block
            if outcome != "done":  # broken at _pos: the block so far is text, read on from there as content
                self.malformed += 1
                events.append(ContentEvent(self.open_tag + "".join(self._read) + self._buffer[: self._pos]))
            self._buffer = self._buffer[self._pos :]
            self._in_block = False
            self._read.clear()

    def finish(self) -> list[Event]:
        if self._in_block:
            self.malformed += 1  # cut short inside a block
        rest = (self.open_tag + "".join(self._read) if self._in_block else "") + self._buffer
        self._buffer, self._in_block = "", False
        self._read.clear()
        self._unit.clear()
        return [ContentEvent(rest)] if rest else []

    def _read_block(self) -> str | None:
        """Read on: "done" (``_pos`` after the close tag), "broken" (``_pos`` where), or None (wait)."""
        raise NotImplementedError

    def _set_aside(self) -> None:
        """While waiting: move what is read out of the buffer (in a name, key or value, what is
        scanned: ``_seen``), so the buffer stays short and a long block is not copied whole with
        every piece."""
        in_unit = self._state in ("name", "key", "value")
        cut = max(self._pos, self._seen) if in_unit else self._pos
        if cut < _SET_ASIDE_AT:
            return
        self._read.append(self._buffer[:cut])
        if in_unit:
            self._unit.append(self._buffer[self._pos : cut])
        self._buffer = self._buffer[cut:]
        self._pos, self._seen = 0, max(0, self._seen - cut)

    def _unit_until(self, end: int) -> str:
        """The text of the name, key or value being read, which ends at ``end`` in the buffer."""
        if not self._unit:
            return self._buffer[self._pos : end]
        return "".join(self._unit) + self._buffer[self._pos : end]

    def _enter(self, state: str) -> None:
        """Start reading a part of the block (a name, key or value is read from ``_pos``)."""
        self._state, self._seen = state, 0
        self._unit.clear()


class QwenXmlToolParser(TaggedBlockParser):
    """``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>``, streamed."""

    first_state = "call"  # then: name, body, key, value, after (a function's end)

    def _read_block(self) -> str | None:
        buffer = self._buffer
        while True:
            if self._state in ("name", "key"):
                angle = _ANGLE.search(buffer, max(self._pos, self._seen))
                if angle is None:
                    self._seen = len(buffer)
                    return None
                word = self._unit_until(angle.start()).strip()
                # A name is one word; a key may hold spaces (a schema may use them), but neither is empty.
                if angle.group() == "<" or not word or (self._state == "name" and len(word.split()) > 1):
                    return "broken"
                self._pos = angle.end()
                if self._state == "name":
                    self._calls.append((word, {}))
                    self._enter("body")
                else:
                    self._key = word
                    self._enter("value")
                continue
            if self._state == "value":
                end, self._seen = find_value_end(buffer, self._pos, self._seen, "</parameter>")
                if end < 0:
                    return None
                value = self._unit_until(end)
                # The template writes "<parameter=K>\nVALUE\n</parameter>": that framing is not the value.
                value = value[1:] if value.startswith("\n") else value
                value = value[:-1] if value.endswith("\n") else value
                self._calls[-1][1][self._key] = value  # a repeated key: the last one wins, as in vLLM
                self._pos = end + len("</parameter>")
                self._enter("body")
                continue
            expected = {
                "call": ("<function=",),
                "body": ("<parameter=", "</function>"),
                "after": ("<function=", self.close_tag),
            }[self._state]
            # Whitespace between tags is passed once: ``_pos`` moves past it even while waiting, as the
            # outcome is the same either way ("broken" would stop there too).
            self._pos = pos = skip_space(buffer, self._pos)
            tag = match_tag(buffer, pos, expected)
            if tag == "":
                return None
            if tag is None:
                return "broken"
            self._pos = pos + len(tag)
            if tag == self.close_tag:
                return "done"
            self._enter({"<function=": "name", "<parameter=": "key", "</function>": "after"}[tag])
