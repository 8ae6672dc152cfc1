"""``mistral`` (Mistral, Mixtral, Devstral, Magistral): calls after the ``[TOOL_CALLS]`` token.

Two forms, told apart by what follows the marker, so one parser reads both tokenizer generations:

* before tokenizer v11: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (a JSON array,
  or one object);
* v11 and later: ``[TOOL_CALLS]NAME[ARGS]{json}``, one marker per call (``NAME{json}`` without
  ``[ARGS]`` is read too, as vLLM does).

Each call gets an id of nine letters and digits, as vLLM's Mistral parser makes them: Mistral's chat
templates render the ids of past calls and their results back, and raise on any other form ("Tool
call IDs should be alphanumeric strings with length 9!"), so an OpenAI-shaped id failed the next call
of every tool-using rollout.

Text before, between and after the calls is content (vLLM keeps only the text before the first
marker, reads only the first pre-v11 array, and drops the rest). A block that does not parse —
bad JSON, no name, a name with spaces in it, an array holding anything but calls, arguments that
are not an object — or that is cut short stays in the content verbatim and counts in
``malformed``. vLLM instead turns a pre-v11 entry without a name into a call named ``""`` and skips
entries that are not objects.
"""

from __future__ import annotations

import re
import secrets
import string
from dataclasses import replace

from harnessrl.gateway.parsers.tools.base import (
    ContentEvent,
    Event,
    ToolCall,
    ToolCallEvent,
    Tools,
    call_from_json,
    call_with_arguments,
    model_json,
    partial_suffix,
)
from harnessrl.gateway.parsers.tools.json_scan import JsonValueScanner

_SPACE = re.compile(r"\s*")
_NAME_CHARS = re.compile(r"[^\s\[\]{}]*")
#: The length of the call ids Mistral's chat templates take back, and what they are made of.
MISTRAL_ID_LENGTH = 9
_ID_CHARACTERS = string.ascii_letters + string.digits


class MistralToolParser:
    """``[TOOL_CALLS]`` blocks of either form, streamed."""

    bot_token = "[TOOL_CALLS]"
    args_token = "[ARGS]"

    def __init__(self, tools: Tools = None) -> None:
        self.malformed = 0
        self._buffer = ""
        # "content"; "head": after the marker, before the form is known; "name": reading a v11
        # name; "args": after the name, waiting for "{"; "block": inside the JSON.
        self._state = "content"
        # The block so far, before the buffer, verbatim, as its pieces (a long run of whitespace in
        # it, streamed a token at a time, is joined once).
        self._prefix: list[str] = []
        # Reading a v11 name: which part is being read ("lead" whitespace, the "name", "trail"
        # whitespace) and the name's pieces so far.
        self._name_part = "lead"
        self._name_parts: list[str] = []
        self._name: str | None = None  # None: a pre-v11 block
        self._scanner = JsonValueScanner()
        # In a block: its JSON scanned so far (also in ``_prefix``), before the buffer.
        self._json: list[str] = []

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list[Event]:
        rest = "".join(self._prefix) + self._buffer
        if self._state != "content":
            self.malformed += 1  # cut short inside a block
        self._buffer, self._state = "", "content"
        self._prefix.clear()
        self._json.clear()
        return [ContentEvent(rest)] if rest else []

    def _step(self, events: list[Event]) -> bool:
        """Consume what the buffer allows; False when more text is needed."""
        buf = self._buffer
        if self._state == "content":
            start = buf.find(self.bot_token)
            if start < 0:
                ready = buf[: len(buf) - partial_suffix(buf, self.bot_token)]
                if ready:
                    events.append(ContentEvent(ready))
                self._buffer = buf[len(ready) :]
                return False
            if start:
                events.append(ContentEvent(buf[:start]))
            self._buffer = buf[start:]
            self._consume(len(self.bot_token), "head")
            return True
        if self._state == "head":
            rest = buf.lstrip()
            if not rest:
                self._consume(len(buf), "head")  # whitespace is the block's: not looked at again
                return False
            if rest[0] == "[" and len(rest) < 2:
                return False
            if rest[0] == "[" and rest[1].isalpha():  # a marker ("[TOOL_CALLS]", "[ARGS]"), not JSON
                self._fail(events, len(buf) - len(rest))
            elif rest[0] in "[{":
                self._name = None
                self._open_block(len(buf) - len(rest))
            else:
                self._state, self._name_part = "name", "lead"
                self._name_parts.clear()
            return True
        if self._state == "name":
            # A name is one run of characters without spaces or brackets, then "[ARGS]" or "{";
            # anything else there ends the block as text at the first character that breaks it.
            # What is read is moved to the prefix at once: each character is looked at once.
            if not self._read_name():
                return False
            buf = self._buffer
            name = "".join(self._name_parts)
            if name and len(buf) < len(self.args_token) and self.args_token.startswith(buf):
                return False
            if not name or not (buf.startswith(self.args_token) or buf[0] == "{"):
                self._fail(events, 0)
                return True
            self._name = name
            self._consume(len(self.args_token) if buf[0] == "[" else 0, "args")
            return True
        if self._state == "args":
            rest = buf.lstrip()
            if not rest:
                self._consume(len(buf), "args")
                return False
            if rest[0] != "{":
                self._fail(events, 0)
                return True
            self._open_block(len(buf) - len(rest))
            return True
        end = self._scanner.end(buf)  # state "block"
        if end is None:
            scanned = self._scanner.set_aside()
            if scanned:
                self._json.append(buf[:scanned])
                self._consume(scanned, "block")
            return False
        call_events = self._parse_block("".join(self._json) + buf[:end])
        self._json.clear()
        if call_events is None:
            self._fail(events, end)
        else:
            events.extend(call_events)
            self._buffer, self._state = buf[end:], "content"
            self._prefix.clear()
        return True

    def _read_name(self) -> bool:
        """Read on through the whitespace, the name and the whitespace after it (moving them to the
        prefix): whether the text after them has arrived."""
        if self._name_part == "lead":
            self._consume(_SPACE.match(self._buffer).end(), "name")
            if not self._buffer:
                return False
            self._name_part = "name"
        if self._name_part == "name":
            size = _NAME_CHARS.match(self._buffer).end()
            if size:
                self._name_parts.append(self._buffer[:size])
            self._consume(size, "name")
            if not self._buffer:
                return False
            self._name_part = "trail"
        self._consume(_SPACE.match(self._buffer).end(), "name")
        return bool(self._buffer)

    def _consume(self, size: int, state: str) -> None:
        if size:
            self._prefix.append(self._buffer[:size])
        self._buffer = self._buffer[size:]
        self._state = state

    def _open_block(self, space: int) -> None:
        self._consume(space, "block")
        self._scanner = JsonValueScanner()

    def _fail(self, events: list[Event], size: int) -> None:
        """The block up to ``size`` more characters is not a call: it goes out as text."""
        self.malformed += 1
        events.append(ContentEvent("".join(self._prefix) + self._buffer[:size]))
        self._buffer, self._state = self._buffer[size:], "content"
        self._prefix.clear()

    def _parse_block(self, block: str) -> list[Event] | None:
        ok, data = model_json(block)
        if not ok:
            return None
        calls: list[ToolCall | None]
        if self._name is not None:
            calls = [call_with_arguments(self._name, data) if isinstance(data, dict) else None]
        else:
            items = data if isinstance(data, list) else [data]
            calls = [
                call_from_json({"arguments": {}, **item} if isinstance(item, dict) else item, ("arguments",))
                for item in items
            ]
        if not calls or any(c is None for c in calls):
            return None
        return [ToolCallEvent(replace(c, id=mistral_call_id(), family_id=True)) for c in calls if c]


def mistral_call_id() -> str:
    """A call id in the form Mistral's chat templates take back: nine letters and digits."""
    return "".join(secrets.choice(_ID_CHARACTERS) for _ in range(MISTRAL_ID_LENGTH))
