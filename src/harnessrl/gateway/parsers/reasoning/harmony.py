"""gpt-oss's Harmony channels (``openai_gptoss``): ``analysis`` messages are reasoning, the rest
content, messages to a tool passed through verbatim for the ``harmony`` tool parser."""

from __future__ import annotations

from harnessrl.gateway.parsers.reasoning.base import ContentText, ReasoningEvent, ReasoningText
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
