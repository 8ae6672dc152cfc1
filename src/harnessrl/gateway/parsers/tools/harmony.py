"""``harmony`` (gpt-oss): tool calls are Harmony messages addressed to a function.

A call is one message: ``<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json
<|message|>{...}<|call|>`` (the recipient may also come before the channel: ``<|start|>assistant
to=functions.NAME<|channel|>commentary json<|message|>...``). A turn may hold several. The engine
stops on ``<|call|>`` and does not decode it, so the end of the text also ends a message.

This parser reads the content the ``openai_gptoss`` reasoning parser lets through: plain text with
the tool-call messages kept verbatim. Fed raw Harmony instead, it extracts the calls the same way
and passes every other message through as text. Departures from vLLM's ``openai`` parser (which
works on token ids with ``openai_harmony``): a call whose body is not a JSON object, and a message
to a built-in tool (``browser.*``, ``python``, ``container.*``), stay in the content as text and are
counted in ``malformed``; vLLM passes non-JSON arguments on as they are and drops built-in calls.

The header helpers here are shared with the reasoning parser (``gateway.reasoning_parsers``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harnessrl.gateway.parsers.tools.base import (
    ContentEvent,
    Event,
    ToolCall,
    ToolCallEvent,
    Tools,
    call_with_arguments,
    partial_suffix,
)

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
#: What ends a message body. ``<|start|>`` is not consumed: it opens the next message.
BODY_ENDS = (END, CALL, RETURN, START)
#: A header longer than this is not one (plain text that happened to contain ``<|start|>``): giving up
#: at a fixed length keeps the result independent of how the text was split into pieces.
MAX_HEADER = 256
#: Recipients that are gpt-oss's built-in tools, not the request's functions.
BUILTIN_TOOLS = frozenset({"browser", "python", "container"})

_CHANNEL_RE = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT_RE = re.compile(r"\bto=([^\s<]+)")


@dataclass(frozen=True)
class HarmonyHeader:
    """What a message header says. ``text`` is the header as sampled, up to ``<|message|>``."""

    text: str
    role: str
    channel: str | None
    recipient: str | None

    @property
    def function_name(self) -> str | None:
        """The function this message calls, if it is a call (vLLM's ``is_function_recipient``)."""
        recipient = self.recipient
        if not recipient or recipient.startswith("<|") or recipient == "assistant":
            return None
        if recipient.startswith("functions."):
            return recipient[len("functions.") :] or None
        if recipient.split(".", 1)[0] in BUILTIN_TOOLS:
            return None
        return recipient  # a bare name: gpt-oss sometimes drops the ``functions.`` prefix

    @property
    def verbatim_start(self) -> str:
        """The header with its ``<|start|>role``, which the prompt holds for the turn's first message."""
        return self.text if self.text.startswith(START) else START + self.role + self.text


def parse_header(text: str) -> HarmonyHeader:
    """Reads a header: ``[<|start|>ROLE] [to=R] <|channel|>C [to=R] [<|constrain|>]TYPE``."""
    role, rest = "assistant", text
    if text.startswith(START):
        rest = text[len(START) :]
        cut = min((i for i in (rest.find(" "), rest.find("<|")) if i >= 0), default=len(rest))
        role, rest = rest[:cut] or "assistant", rest[cut:]
    channel = _CHANNEL_RE.search(rest)
    recipient = _RECIPIENT_RE.search(rest)
    return HarmonyHeader(
        text=text,
        role=role,
        channel=channel.group(1) if channel else None,
        recipient=recipient.group(1) if recipient else None,
    )


def find_first(text: str, tags: tuple[str, ...]) -> tuple[int, str | None]:
    """The earliest of ``tags`` in ``text``: (index, tag), or (-1, None)."""
    best, found = -1, None
    for tag in tags:
        i = text.find(tag)
        if i >= 0 and (best < 0 or i < best):
            best, found = i, tag
    return best, found


def hold_for(text: str, tags: tuple[str, ...]) -> int:
    """How much of ``text``'s end may be the start of one of ``tags``."""
    return max(partial_suffix(text, tag) for tag in tags)


def header_end(buffer: str) -> int | None:
    """Where ``<|message|>`` ends the header that ``buffer`` starts with; -1: it is no header;
    None: not known yet."""
    i = buffer.find(MESSAGE)
    if 0 <= i <= MAX_HEADER:
        return i
    if i > MAX_HEADER or len(buffer) >= MAX_HEADER + len(MESSAGE):
        return -1
    return None


class HarmonyToolParser:
    """Harmony messages to a function -> tool calls; everything else passes through as text."""

    #: A message starts at ``<|start|>`` or, for the turn's first one, at ``<|channel|>``.
    message_starts = (START, CHANNEL)

    def __init__(self, tools: Tools = None) -> None:
        self.malformed = 0  # messages to a tool that were returned as text
        self._buffer = ""
        self._state = "outside"  # outside | header | body
        self._header: HarmonyHeader | None = None
        # The open message's body so far, as its pieces (a long one streamed in small pieces is
        # joined once, not copied whole with every piece).
        self._body: list[str] = []

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while True:
            if self._state == "outside":
                start, _ = find_first(self._buffer, self.message_starts)
                if start < 0:
                    ready = len(self._buffer) - hold_for(self._buffer, self.message_starts)
                    if ready:
                        events.append(ContentEvent(self._buffer[:ready]))
                    self._buffer = self._buffer[ready:]
                    return events
                if start:
                    events.append(ContentEvent(self._buffer[:start]))
                self._buffer, self._state = self._buffer[start:], "header"
            elif self._state == "header":
                end = header_end(self._buffer)
                if end is None:
                    return events
                if end < 0:
                    # Not a header after all: the tag was text. Look for a message after it.
                    tag = START if self._buffer.startswith(START) else CHANNEL
                    events.append(ContentEvent(tag))
                    self._buffer, self._state = self._buffer[len(tag) :], "outside"
                    continue
                self._header = parse_header(self._buffer[:end])
                self._buffer, self._body, self._state = self._buffer[end + len(MESSAGE) :], [], "body"
            else:
                end, tag = find_first(self._buffer, BODY_ENDS)
                if tag is None:
                    ready = len(self._buffer) - hold_for(self._buffer, BODY_ENDS)
                    self._body.append(self._buffer[:ready])
                    self._buffer = self._buffer[ready:]
                    return events
                self._body.append(self._buffer[:end])
                closing = "" if tag == START else tag
                self._buffer = self._buffer[end + len(closing) :]
                events.append(self._close(closing))
                self._state = "outside"

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self._state == "body":
            # The engine does not decode the stop token (<|call|>): the end of the text ends the call.
            self._body.append(self._buffer)
            events.append(self._close(""))
        elif self._buffer:
            if self._state == "header" and parse_header(self._buffer).recipient is not None:
                self.malformed += 1  # a call cut short in its header (max_tokens, a stop string)
            events.append(ContentEvent(self._buffer))
        self._buffer, self._state, self._header, self._body = "", "outside", None, []
        return events

    def _close(self, closing: str) -> Event:
        header = self._header
        assert header is not None
        body = "".join(self._body)
        verbatim = header.text + MESSAGE + body + closing
        if header.recipient is None or header.recipient == "assistant":
            return ContentEvent(verbatim)  # not a tool message (raw Harmony fed without the splitter)
        call = self._parse_call(header, body)
        if call is None:
            self.malformed += 1
            return ContentEvent(verbatim)
        return ToolCallEvent(call)

    @staticmethod
    def _parse_call(header: HarmonyHeader, body: str) -> ToolCall | None:
        name = header.function_name
        if name is None:
            return None
        return call_with_arguments(name, body.strip())
