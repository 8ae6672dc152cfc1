"""``<think>…</think>`` families (``qwen3``, ``kimi_k2``, ``glm45``/``glm47``, ``deepseek_r1``,
``deepseek_v3``): one incremental grammar, ``ThinkReasoningParser``, whose class attributes each
family sets. The package docstring lists each family's rules and where they depart from vLLM.
"""

from __future__ import annotations

from typing import ClassVar

from harnessrl.gateway.parsers.reasoning.base import ContentText, ReasoningEvent, ReasoningText
from harnessrl.gateway.parsers.tools.harmony import find_first, hold_for


class ThinkReasoningParser:
    """``<think>…</think>`` families; a subclass is the family's grammar, as class attributes."""

    open_tag: ClassVar[str] = "<think>"
    close_tag: ClassVar[str] = "</think>"
    #: The model always thinks first: the text starts inside the block, opened or not.
    always_starts_in_reasoning: ClassVar[bool] = False
    #: A ``<think>`` in the content opens another block (else it is text).
    opens_in_content: ClassVar[bool] = False
    #: Every ``<think>`` inside the block is dropped (else only the first).
    absorbs_every_open: ClassVar[bool] = True
    #: After a block, a stray ``</think>`` is dropped (else it is text).
    drops_stray_close: ClassVar[bool] = True
    #: The family's tool-call blocks, start marker -> end marker. A start ends the reasoning block
    #: implicitly and begins the content; in the content, a block's text is the tool parser's, passed
    #: on verbatim (a ``</think>`` or ``<think>`` in a call's arguments is the argument's text).
    tool_blocks: ClassVar[dict[str, str]] = {}

    def __init__(self, starts_in_reasoning: bool = False) -> None:
        inside = starts_in_reasoning or self.always_starts_in_reasoning
        self._state = "reasoning" if inside else "start"  # start | reasoning | content | tool
        self._buffer = ""
        # In the start state: the whitespace before the first text, as its pieces (so a long run of
        # it is not stripped again with every piece; the buffer holds only what follows it).
        self._lead: list[str] = []
        self._tool_end = ""  # in the tool state: the marker that ends the tool-call block
        self._block_seen = False  # a block has ended: stray closing tags are dropped from now on
        self._open_absorbed = False

    @classmethod
    def prompt_opens_reasoning(cls, prompt_tail: str) -> bool:
        """Whether a rendered prompt ends inside the block (its generation prompt opened it)."""
        return prompt_tail.rstrip().endswith(cls.open_tag)

    @property
    def in_reasoning(self) -> bool:
        return self._state == "reasoning"

    def feed(self, text: str) -> list[ReasoningEvent]:
        self._buffer += text
        out: list[ReasoningEvent] = []
        while True:
            if "<" not in self._buffer and self._state != "start":
                # Every marker starts with "<": none is here, nor starting (most pieces).
                if self._buffer:
                    kind = ReasoningText if self._state == "reasoning" else ContentText
                    out.append(kind(self._buffer))
                    self._buffer = ""
                return out
            if self._state == "start":
                head = self._buffer.lstrip()
                if len(head) < len(self._buffer):
                    self._lead.append(self._buffer[: len(self._buffer) - len(head)])
                    self._buffer = head
                if head.startswith(self.open_tag):
                    # Whitespace before the opening tag is the template's, not reasoning.
                    self._buffer, self._state = head[len(self.open_tag) :], "reasoning"
                    self._open_absorbed = True
                    self._lead.clear()
                elif self.open_tag.startswith(head):
                    return out  # nothing yet, or maybe the start of the tag: wait for more
                else:
                    self._buffer, self._state = "".join(self._lead) + head, "content"
                    self._lead.clear()
            elif self._state == "reasoning":
                tags = (self.close_tag, *self.tool_blocks)
                if self.absorbs_every_open or not self._open_absorbed:
                    tags += (self.open_tag,)
                at, tag = find_first(self._buffer, tags)
                if tag is None:
                    self._release(out, ReasoningText, tags)
                    return out
                if at:
                    out.append(ReasoningText(self._buffer[:at]))
                if tag == self.open_tag:
                    self._buffer, self._open_absorbed = self._buffer[at + len(tag) :], True
                    continue
                # </think> is dropped; a tool-call marker stays, as the content's first text.
                self._buffer = self._buffer[at + len(tag) :] if tag == self.close_tag else self._buffer[at:]
                self._state, self._block_seen = "content", True
            elif self._state == "content":
                tags = ()
                if self.opens_in_content:
                    tags += (self.open_tag,)
                if self.drops_stray_close and self._block_seen:
                    tags += (self.close_tag,)
                if tags:  # markers can be read here: not inside a tool call's block
                    tags += tuple(self.tool_blocks)
                at, tag = find_first(self._buffer, tags)
                if tag is None:
                    self._release(out, ContentText, tags)
                    return out
                if tag in self.tool_blocks:
                    out.append(ContentText(self._buffer[: at + len(tag)]))
                    self._buffer, self._state = self._buffer[at + len(tag) :], "tool"
                    self._tool_end = self.tool_blocks[tag]
                    continue
                if at:
                    out.append(ContentText(self._buffer[:at]))
                self._buffer = self._buffer[at + len(tag) :]
                if tag == self.open_tag:
                    self._state = "reasoning"
            else:  # tool: a call's block, verbatim up to and with its end marker
                at = self._buffer.find(self._tool_end)
                if at < 0:
                    self._release(out, ContentText, (self._tool_end,))
                    return out
                end = at + len(self._tool_end)
                out.append(ContentText(self._buffer[:end]))
                self._buffer, self._state = self._buffer[end:], "content"

    def finish(self) -> list[ReasoningEvent]:
        rest = "".join(self._lead) + self._buffer
        self._buffer = ""
        self._lead.clear()
        if not rest:
            return []
        # An unclosed block (cut by max_tokens) is all reasoning: the answer never started.
        return [ReasoningText(rest) if self._state == "reasoning" else ContentText(rest)]

    def _release(self, out: list[ReasoningEvent], kind: type[ReasoningEvent], tags: tuple[str, ...]) -> None:
        """Emit the buffer except an end that may be the start of one of ``tags``."""
        ready = len(self._buffer) - (hold_for(self._buffer, tags) if tags else 0)
        if ready:
            out.append(kind(self._buffer[:ready]))
        self._buffer = self._buffer[ready:]


class Qwen3ReasoningParser(ThinkReasoningParser):
    tool_blocks = {"<tool_call>": "</tool_call>"}


class KimiK2ReasoningParser(ThinkReasoningParser):
    tool_blocks = {"<|tool_calls_section_begin|>": "<|tool_calls_section_end|>"}


class Glm45ReasoningParser(ThinkReasoningParser):
    opens_in_content = True
    tool_blocks = {"<tool_call>": "</tool_call>"}


class DeepSeekR1ReasoningParser(ThinkReasoningParser):
    always_starts_in_reasoning = True
    absorbs_every_open = False
    drops_stray_close = False


class DeepSeekV3ReasoningParser(ThinkReasoningParser):
    """DeepSeek V3.1+: thinks only when the prompt opened the block (``<think>``; ``</think>`` closes it
    in non-thinking mode). Inside a block R1's grammar applies; otherwise the text is the answer,
    unless the model opens a block itself. vLLM's ``deepseek_v3`` takes the ``thinking`` switch instead."""

    absorbs_every_open = False
    drops_stray_close = False
