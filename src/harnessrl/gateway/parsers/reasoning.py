"""Reasoning parsers: sampled text -> reasoning and content, incrementally, per model family, in a registry.

A parser is fed the text as it is sampled and returns ``ReasoningText`` / ``ContentText`` pieces
(``finish`` releases what it held back), so streaming and non-streaming answers come from the same
code, and any split of the text into pieces gives the same result. It never raises. The content is
what the tool parser reads next, as in vLLM's server (reasoning first, then tools).

``starts_in_reasoning``: the prompt already opened the block (Qwen3-2507 and GLM-4.7 end the
generation prompt with ``<think>``); see ``prompt_opens_reasoning``.

Families (vLLM's ``--reasoning-parser`` names; semantics checked against vLLM's own parsers in
``tests/vllm/test_reasoning_differential.py``):

- ``qwen3``, ``kimi_k2``: reasoning is the block the prompt opened, or a ``<think>`` block the answer
  starts with (after whitespace). Inside it a repeated ``<think>`` is dropped; ``</think>`` ends it,
  and so does the start of a tool call (``<tool_call>``; Kimi's ``<|tool_calls_section_begin|>``),
  which then belongs to the content. After the block a stray ``</think>`` is dropped; a later
  ``<think>`` is ordinary content.
- ``glm45`` (``glm47``): the same, but a ``<think>`` anywhere in the content opens another block.
- ``deepseek_r1``: everything up to ``</think>`` is reasoning, with or without an opening tag (the
  model always thinks); its first ``<think>`` is dropped; the rest of the text is content verbatim.
- ``deepseek_v3`` (V3.1+, hybrid): R1's grammar when the prompt opened the block (or the answer starts
  with ``<think>``); otherwise the text is content.
- ``openai_gptoss``: Harmony channels. ``analysis`` messages are reasoning; ``final`` (and
  ``commentary`` without a recipient, a preamble) are content; messages to a tool pass through
  verbatim for the ``harmony`` tool parser. Several messages of one kind are joined with ``\\n``.

Where we depart from vLLM, on purpose:

- vLLM's engine parsers (qwen3, glm45, kimi_k2) cannot see the prompt and assume thinking is on, so
  an answer with no tags at all is reasoning there; ours is content unless the prompt opened the
  block (vLLM with ``enable_thinking: false`` agrees). An unclosed block stays reasoning in both.
- Whitespace is kept as sampled (vLLM strips the end of the reasoning for some families); callers trim.
- deepseek_r1: vLLM's non-streaming path cuts the text at its first ``<think>`` wherever it is, so
  text before it is lost (all of a finished block and answer, when the ``<think>`` comes in the
  answer); we keep it, as vLLM's streaming path does.
- A ``<think>`` later in the content after an unopened start (glm45 only, which opens a block there)
  is read by the grammar; vLLM with thinking off reads nothing.
- openai_gptoss: text between messages (after ``<|end|>``, before ``<|start|>``) is kept as content
  (vLLM drops it); messages to built-in tools pass through as text (vLLM drops them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from harnessrl.errors import ConfigError
from harnessrl.gateway.parsers.tools.harmony import (
    BODY_ENDS,
    MESSAGE,
    START,
    HarmonyHeader,
    find_first,
    header_end,
    hold_for,
    parse_header,
)


@dataclass(frozen=True)
class ReasoningText:
    text: str


@dataclass(frozen=True)
class ContentText:
    text: str


ReasoningEvent = ReasoningText | ContentText


class ReasoningParser(Protocol):
    def feed(self, text: str) -> list[ReasoningEvent]: ...

    def finish(self) -> list[ReasoningEvent]: ...

    @property
    def in_reasoning(self) -> bool:
        """Inside a reasoning block now (what the text fed so far ends in): counts reasoning tokens."""
        ...


class ReasoningParserFactory(Protocol):
    """A family's parser class: one parser per answer, and whether a prompt opened the block."""

    def __call__(self, starts_in_reasoning: bool = False) -> ReasoningParser: ...

    def prompt_opens_reasoning(self, prompt_tail: str) -> bool: ...


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
    #: Markers that end the block implicitly (a tool call starting) and begin the content.
    ends_reasoning: ClassVar[tuple[str, ...]] = ()

    def __init__(self, starts_in_reasoning: bool = False) -> None:
        inside = starts_in_reasoning or self.always_starts_in_reasoning
        self._state = "reasoning" if inside else "start"  # start | reasoning | content
        self._buffer = ""
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
            if self._state == "start":
                head = self._buffer.lstrip()
                if head.startswith(self.open_tag):
                    # Whitespace before the opening tag is the template's, not reasoning.
                    self._buffer, self._state = head[len(self.open_tag) :], "reasoning"
                    self._open_absorbed = True
                elif self.open_tag.startswith(head):
                    return out  # nothing yet, or maybe the start of the tag: wait for more
                else:
                    self._state = "content"
            elif self._state == "reasoning":
                tags = (self.close_tag, *self.ends_reasoning)
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
            else:
                tags = ()
                if self.opens_in_content:
                    tags += (self.open_tag,)
                if self.drops_stray_close and self._block_seen:
                    tags += (self.close_tag,)
                at, tag = find_first(self._buffer, tags)
                if tag is None:
                    self._release(out, ContentText, tags)
                    return out
                if at:
                    out.append(ContentText(self._buffer[:at]))
                self._buffer = self._buffer[at + len(tag) :]
                if tag == self.open_tag:
                    self._state = "reasoning"

    def finish(self) -> list[ReasoningEvent]:
        rest, self._buffer = self._buffer, ""
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
    ends_reasoning = ("<tool_call>",)


class KimiK2ReasoningParser(ThinkReasoningParser):
    ends_reasoning = ("<|tool_calls_section_begin|>",)


class Glm45ReasoningParser(ThinkReasoningParser):
    opens_in_content = True
    ends_reasoning = ("<tool_call>",)


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


class GptOssReasoningParser:
    """gpt-oss's Harmony messages: ``analysis`` -> reasoning, ``final`` -> content, tool calls verbatim.

    The prompt ends with ``<|start|>assistant``, so the text starts in the first message's header;
    ``starts_in_reasoning`` does not apply (the channel says what a message is). A message to a tool
    is passed on whole (``<|start|>assistant`` restored on the first one) and always closed, with
    ``<|end|>`` if the model went straight to the next ``<|start|>``, so the tool parser sees where
    it ends. Text that never reaches ``<|message|>`` is content as sampled.
    """

    def __init__(self, starts_in_reasoning: bool = False) -> None:
        self._state = "header"  # header | body | outside
        self._buffer = ""
        self._kind = "content"  # the open message's: reasoning | content | verbatim
        self._spoke = False  # the open message has emitted text
        self._had = {"reasoning": False, "content": False}  # an earlier message of this kind had text

    @classmethod
    def prompt_opens_reasoning(cls, prompt_tail: str) -> bool:
        return False

    @property
    def in_reasoning(self) -> bool:
        return self._state == "body" and self._kind == "reasoning"

    def feed(self, text: str) -> list[ReasoningEvent]:
        self._buffer += text
        out: list[ReasoningEvent] = []
        while True:
            if self._state == "header":
                end = header_end(self._buffer)
                if end is None:
                    return out
                if end < 0:
                    # Not Harmony after all: the text is content up to the next <|start|>.
                    if self._buffer.startswith(START):
                        out.append(ContentText(START))
                        self._buffer = self._buffer[len(START) :]
                    self._state = "outside"
                    continue
                self._open_message(parse_header(self._buffer[:end]), out)
                self._buffer, self._state = self._buffer[end + len(MESSAGE) :], "body"
            elif self._state == "body":
                at, tag = find_first(self._buffer, BODY_ENDS)
                if tag is None:
                    ready = len(self._buffer) - hold_for(self._buffer, BODY_ENDS)
                    self._emit(self._buffer[:ready], out)
                    self._buffer = self._buffer[ready:]
                    return out
                self._emit(self._buffer[:at], out)
                if self._kind == "verbatim":
                    out.append(ContentText("<|end|>" if tag == START else tag))
                self._buffer = self._buffer[at:] if tag == START else self._buffer[at + len(tag) :]
                self._state = "outside"
            else:
                at, tag = find_first(self._buffer, (START,))
                if tag is None:
                    ready = len(self._buffer) - hold_for(self._buffer, (START,))
                    if ready:
                        out.append(ContentText(self._buffer[:ready]))
                    self._buffer = self._buffer[ready:]
                    return out
                if at:
                    out.append(ContentText(self._buffer[:at]))
                self._buffer, self._state = self._buffer[at:], "header"

    def finish(self) -> list[ReasoningEvent]:
        out: list[ReasoningEvent] = []
        rest, self._buffer = self._buffer, ""
        if self._state == "body":
            self._emit(rest, out)  # the stop token (<|return|>, <|call|>) is not decoded
        elif rest:
            out.append(ContentText(rest))  # a header cut short, or text outside any message
        self._state = "outside"
        return out

    def _open_message(self, header: HarmonyHeader, out: list[ReasoningEvent]) -> None:
        self._spoke = False
        if (header.recipient is not None and header.recipient != "assistant") or header.role != "assistant":
            # A tool call (or a built-in tool's, or not the assistant's at all): the tool parser's.
            self._kind = "verbatim"
            out.append(ContentText(header.verbatim_start + MESSAGE))
        elif header.channel == "analysis":
            self._kind = "reasoning"
        else:
            self._kind = "content"  # final, a commentary preamble, or no channel

    def _emit(self, text: str, out: list[ReasoningEvent]) -> None:
        if not text:
            return
        if self._kind == "verbatim":
            out.append(ContentText(text))
            return
        if not self._spoke and self._had[self._kind]:
            text = "\n" + text  # vLLM joins the messages of one kind with a newline
        self._spoke = self._had[self._kind] = True
        out.append(ReasoningText(text) if self._kind == "reasoning" else ContentText(text))


REASONING_PARSERS: dict[str, ReasoningParserFactory] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "deepseek_v3": DeepSeekV3ReasoningParser,
    "glm45": Glm45ReasoningParser,
    "glm47": Glm45ReasoningParser,
    "kimi_k2": KimiK2ReasoningParser,
    "openai_gptoss": GptOssReasoningParser,
}


def get_reasoning_parser(name: str) -> ReasoningParserFactory:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise ConfigError(f"gateway.reasoning_parser: unknown parser {name!r} (known: {known})") from None


def split_reasoning(
    text: str, parser: str = "qwen3", *, starts_in_reasoning: bool = False
) -> tuple[str | None, str]:
    """The non-streaming view: ``(reasoning or None, content)``."""
    p = get_reasoning_parser(parser)(starts_in_reasoning=starts_in_reasoning)
    events = p.feed(text) + p.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningText))
    content = "".join(e.text for e in events if isinstance(e, ContentText))
    return (reasoning if any(isinstance(e, ReasoningText) for e in events) else None), content
