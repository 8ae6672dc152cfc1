"""``llama3_json`` (Llama 3.1-3.3, Llama 4 JSON mode): ``{"name": ..., "parameters": {...}}`` calls.

Llama writes a call as a bare JSON object, optionally after the ``<|python_tag|>`` special token,
and several calls separated by ``;``. Because the JSON is bare, ordinary content that merely
contains JSON must not become a call. The rule (vLLM's streaming rule, which is also the narrower
of its two): a call is recognised only where the answer *starts* with ``{`` (after whitespace), or
right after a ``<|python_tag|>``, or right after a previous call (whitespace and one ``;`` between).
A ``{`` later in prose is content, although vLLM's non-streaming path would take any ``{"name":
...}`` anywhere in the text (and then drop the prose). Text after the calls is content; vLLM drops
it.

A call needs a non-empty string ``name`` and an ``arguments`` or ``parameters`` object (or a JSON
string of one; ``arguments`` wins when both are there, as in vLLM). A block that fails that — or is
cut short — stays in the content verbatim and counts in ``malformed``; vLLM instead returns the
*whole* answer as content when any object fails, even after good calls.
"""

from __future__ import annotations

from harnessrl.gateway.parsers.tools.base import (
    ContentEvent,
    Event,
    ToolCall,
    ToolCallEvent,
    Tools,
    call_from_json,
    model_json,
    partial_suffix,
)
from harnessrl.gateway.parsers.tools.json_scan import JsonValueScanner


def _leading_space(text: str) -> int:
    return len(text) - len(text.lstrip())


class Llama3JsonToolParser:
    """Bare JSON calls at the start of the answer or after ``<|python_tag|>``, streamed."""

    python_tag = "<|python_tag|>"

    def __init__(self, tools: Tools = None) -> None:
        self.malformed = 0
        self._buffer = ""
        # "start": nothing but whitespace so far; "content": prose; "tag": after a python tag,
        # waiting for "{"; "block": inside a JSON object; "between": after a call.
        self._state = "start"
        # The text before the current block (whitespace, tag, separator), verbatim, as its pieces: a
        # long run of whitespace streamed a token at a time is joined once, not copied per piece.
        self._prefix: list[str] = []
        self._scanner = JsonValueScanner()
        self._json: list[str] = []  # in a block: its text scanned so far, before the buffer

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        rest = "".join(self._prefix) + "".join(self._json) + self._buffer
        if self._state in ("block", "tag"):  # a call cut short
            self.malformed += 1
        self._buffer, self._state = "", "content"
        self._prefix.clear()
        self._json.clear()
        if rest:
            events.append(ContentEvent(rest))
        return events

    def _step(self, events: list[Event]) -> bool:
        """Consume what the buffer allows; False when more text is needed."""
        buf = self._buffer
        if self._state in ("start", "between", "tag"):
            space = _leading_space(buf)
            if space:  # whitespace goes with what follows it: set aside once, not looked at again
                self._prefix.append(buf[:space])
                self._buffer = buf = buf[space:]
            if not buf:
                return False
            if buf[0] == "{":
                self._open_block()
                return True
            if self._state == "between" and buf[0] == ";" and ";" not in "".join(self._prefix):
                self._prefix.append(";")
                self._buffer = buf[1:]
                return True
            if self._state != "tag" and buf.startswith(self.python_tag):
                self._prefix.append(self.python_tag)
                self._buffer = buf[len(self.python_tag) :]
                self._state = "tag"
                return True
            if self._state != "tag" and self.python_tag.startswith(buf):
                return False
            if self._state == "tag":  # a tag not followed by JSON (built-in tools write code there)
                self.malformed += 1
            if self._prefix:  # the tag or separator before it is text now, not read again
                events.append(ContentEvent("".join(self._prefix)))
            self._state = "content"
            self._prefix.clear()
            return True
        if self._state == "content":
            start = buf.find(self.python_tag)
            if start < 0:
                ready = buf[: len(buf) - partial_suffix(buf, self.python_tag)]
                if ready:
                    events.append(ContentEvent(ready))
                self._buffer = buf[len(ready) :]
                return False
            if start:
                events.append(ContentEvent(buf[:start]))
            self._prefix = [self.python_tag]
            self._buffer = buf[start + len(self.python_tag) :]
            self._state = "tag"
            return True
        end = self._scanner.end(buf)  # state "block"
        if end is None:
            scanned = self._scanner.set_aside()
            if scanned:
                self._json.append(buf[:scanned])
                self._buffer = buf[scanned:]
            return False
        block, self._buffer = "".join(self._json) + buf[:end], buf[end:]
        self._json.clear()
        call = self._parse_block(block)
        if call is None:
            self.malformed += 1
            events.append(ContentEvent("".join(self._prefix) + block))
            self._state = "content"
        else:
            events.append(ToolCallEvent(call))
            self._state = "between"
        self._prefix.clear()
        return True

    def _open_block(self) -> None:
        """The buffer starts with "{": a block starts there (what came before is in ``_prefix``)."""
        self._state = "block"
        self._scanner = JsonValueScanner()

    @staticmethod
    def _parse_block(block: str) -> ToolCall | None:
        ok, data = model_json(block)
        return call_from_json(data, ("arguments", "parameters")) if ok else None
