"""``deepseek_v3`` and ``deepseek_v31`` (DeepSeek V3, R1-0528, V3.1, V3.2 chat): marker-delimited calls.

Both wrap the calls of a turn in one section, each call in its own markers (full-width bars and
``▁``, as in DeepSeek's tokenizer)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

V3 writes a call as ``function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```  ``; V3.1 as
``NAME<｜tool▁sep｜>ARGS``. Text before and after the section is content (vLLM drops what follows).

The section is the unit (``SectionToolParser``, shared with Kimi K2): once it closes, or when the
answer ends after the last complete call, every call in it must parse — else the whole section
goes out as text, verbatim, and counts once in ``malformed``. vLLM instead keeps the calls its
regex finds and silently drops the rest of the section, a truncated call included. V3 arguments may
span lines here; vLLM's V3 regex reads only one-line JSON (and drops a multi-line call).
"""

from __future__ import annotations

import re

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


class SectionToolParser:
    """Calls in ``section_begin (call_begin INNER call_end)* section_end``, streamed.

    Subclasses name the markers and read one call's ``INNER`` (``_parse_call``). Content is
    released as soon as it cannot start ``section_begin``; a section is held until it closes.
    """

    section_begin: str
    section_end: str
    call_begin: str
    call_end: str

    def __init__(self, tools: Tools = None) -> None:
        self.malformed = 0
        self._buffer = ""
        self._in_section = False
        self._searched = 0  # where the search for section_end resumes
        # In a section: its text searched so far, before the buffer, as its pieces (a long section
        # streamed in small pieces is joined once, not copied whole with every piece).
        self._section: list[str] = []
        self._pattern = re.compile(
            rf"\s*{re.escape(self.call_begin)}(.*?){re.escape(self.call_end)}\s*", re.DOTALL
        )

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while True:
            if not self._in_section:
                start = self._buffer.find(self.section_begin)
                if start < 0:
                    ready = self._buffer[
                        : len(self._buffer) - partial_suffix(self._buffer, self.section_begin)
                    ]
                    if ready:
                        events.append(ContentEvent(ready))
                    self._buffer = self._buffer[len(ready) :]
                    return events
                if start:
                    events.append(ContentEvent(self._buffer[:start]))
                self._buffer = self._buffer[start:]
                self._in_section = True
                self._searched = len(self.section_begin)
            end = self._buffer.find(self.section_end, self._searched)
            if end < 0:
                # Look at each character once, however finely the section is streamed.
                searched = max(self._searched, len(self._buffer) - len(self.section_end) + 1)
                self._section.append(self._buffer[:searched])
                self._buffer, self._searched = self._buffer[searched:], 0
                return events
            end += len(self.section_end)
            section, self._buffer = "".join(self._section) + self._buffer[:end], self._buffer[end:]
            self._in_section = False
            self._section.clear()
            events += self._section_events(section, closed=True)

    def finish(self) -> list[Event]:
        rest, self._buffer = "".join(self._section) + self._buffer, ""
        self._section.clear()
        if self._in_section:
            self._in_section = False
            return self._section_events(rest, closed=False)
        return [ContentEvent(rest)] if rest else []

    def _section_events(self, section: str, *, closed: bool) -> list[Event]:
        """The calls of a whole section, or the section as text when any part is not a call."""
        body = section[len(self.section_begin) : len(section) - len(self.section_end) if closed else None]
        calls: list[ToolCall] = []
        pos = 0
        while pos < len(body):
            match = self._pattern.match(body, pos)
            call = self._parse_call(match.group(1)) if match else None
            if call is None:
                break
            calls.append(call)
            pos = match.end()
        if calls and pos == len(body):
            return [ToolCallEvent(c) for c in calls]
        self.malformed += 1
        return [ContentEvent(section)]

    def _parse_call(self, inner: str) -> ToolCall | None:
        raise NotImplementedError


def call_from_arguments_text(name: str, arguments: str) -> ToolCall | None:
    name = name.strip()
    if not name:
        return None
    ok, data = model_json(arguments)
    if not ok:
        return None
    return call_with_arguments(name, data) if isinstance(data, dict) else None


class DeepSeekV3ToolParser(SectionToolParser):
    """``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>``."""

    section_begin = "<｜tool▁calls▁begin｜>"
    section_end = "<｜tool▁calls▁end｜>"
    call_begin = "<｜tool▁call▁begin｜>"
    call_end = "<｜tool▁call▁end｜>"
    _call = re.compile(r"\s*function\s*<｜tool▁sep｜>([^\n]*)\n```(?:json)?\s*\n(.*)\n\s*```\s*", re.DOTALL)

    def _parse_call(self, inner: str) -> ToolCall | None:
        match = self._call.fullmatch(inner)
        return call_from_arguments_text(match.group(1), match.group(2)) if match else None


class DeepSeekV31ToolParser(SectionToolParser):
    """``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>``."""

    section_begin = DeepSeekV3ToolParser.section_begin
    section_end = DeepSeekV3ToolParser.section_end
    call_begin = DeepSeekV3ToolParser.call_begin
    call_end = DeepSeekV3ToolParser.call_end
    tool_sep = "<｜tool▁sep｜>"

    def _parse_call(self, inner: str) -> ToolCall | None:
        name, sep, arguments = inner.partition(self.tool_sep)
        return call_from_arguments_text(name, arguments) if sep else None
