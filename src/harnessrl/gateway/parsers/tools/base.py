"""What every tool-call parser shares: the events it emits and the ``ToolParser`` protocol.

A parser is incremental (``feed`` text as it is sampled, ``finish`` at the end) and emits
``ContentEvent`` / ``ToolCallEvent`` items, so streaming and non-streaming answers come from the
same code. A parser never invents a call the policy did not fully make: a block that does not parse
(or is cut short by ``max_tokens``) stays in the content as text.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from harnessrl.errors import BadRequest
from harnessrl.gateway.json_input import INT64_MAX, INT64_MIN, json_problem, parse_json

#: The request's tools in OpenAI's chat shape (``{"type": "function", "function": {"name",
#: "parameters"}}``). Parsers of formats that write arguments as text (Qwen3-Coder's XML, GLM's
#: ``<arg_value>``) read each parameter's JSON-schema type from them; the others ignore them.
Tools = Sequence[dict[str, Any]] | None


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, serialized (OpenAI sends arguments as a string)
    id: str = field(default_factory=lambda: f"call_{secrets.token_hex(12)}")
    #: The id is the model family's own: the model wrote it (Kimi's ``functions.NAME:N``) or its chat
    #: template checks its form (Mistral's nine letters and digits). Every API then answers with it
    #: as it is, since the template renders it back into the next prompt; an id the gateway made up
    #: (``call_...``) is each API's to shape (Messages gives ``toolu_...``).
    family_id: bool = False

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
    #: Calls the policy began but did not form (bad JSON, no name) or finish, returned as text.
    malformed: int

    def feed(self, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


class CountingParser:
    """A parser whose malformed calls are added to a metric as they are found."""

    def __init__(self, parser: ToolParser, on_malformed: Callable[[int], None]):
        self.parser = parser
        self._on_malformed = on_malformed
        self._counted = 0

    @property
    def malformed(self) -> int:
        return self.parser.malformed

    def _count(self) -> None:
        if self.parser.malformed != self._counted:
            self._on_malformed(self.parser.malformed - self._counted)
            self._counted = self.parser.malformed

    def feed(self, text: str) -> list[Event]:
        events = self.parser.feed(text)
        self._count()
        return events

    def finish(self) -> list[Event]:
        events = self.parser.finish()
        self._count()
        return events


#: How the gateway makes a parser for one answer: ``factory(request_tools)``.
ToolParserFactory = Callable[[Tools], ToolParser]


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag`` (a tag maybe starting)."""
    if tag[:1] not in text[max(0, len(text) - len(tag) + 1) :]:
        return 0  # no tail could start the tag (most text, checked once per streamed token)
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def model_json(text: str) -> tuple[bool, Any]:
    """``(True, value)`` if the policy wrote strict JSON, else ``(False, None)``.

    As strict as a request body (``json_input.parse_json``): no NaN or Infinity, no integer past
    64 bits, bounded nesting. Arguments the lenient parser would accept come out as JSON no client
    can read back (``NaN``), or overflow the store; such a call is returned as text instead.
    """
    try:
        return True, parse_json(text, "tool-call arguments")
    except BadRequest:
        return False, None


#: Levels above a call's arguments when the harness sends the call back in its next request: an
#: Anthropic body nests a ``tool_use`` block's ``input`` under body, ``messages``, the message,
#: ``content`` and the block (chat and Responses send arguments as a string, a JSON text of its own).
ECHO_LEVELS = 5


def arguments_fit(arguments: dict[str, Any]) -> bool:
    """Whether a call's arguments come back through the gateway's request check when the harness
    echoes the call next turn: integers within 64 bits, and nesting within ``MAX_JSON_DEPTH`` less
    the ``ECHO_LEVELS`` above them. A call that would not is returned as text (the next request
    would be refused with a 400 the policy cannot learn from)."""
    echoed: Any = arguments
    for _ in range(ECHO_LEVELS):
        echoed = [echoed]  # json_problem counts levels from its value: these stand for the body's
    return json_problem(echoed) is None


def echo_stable(value: Any) -> Any:
    """``value`` with every integral float written as the integer its decimal spells, where that is
    within 64 bits (``30.0``, ``1e2``, ``-0.0`` and ``9.223372036854775e18`` as ``30``, ``100``,
    ``0`` and ``9223372036854775000``), so a harness's JSON round trip gives it back as it was.

    A harness in JavaScript (``JSON.parse`` then ``JSON.stringify``) or Go (``encoding/json`` with
    ``float64``) sends an integral number back without a fraction, spelled by its shortest decimal,
    and history matching compares parsed values, where ``30.0`` is not ``30``: the next call would
    not continue the answer and the chain would break. JSON has one number type, and the shortest
    decimal (``repr``) is the number the model wrote, so this is the same value; the typed formats
    (``schema_values``) already write an integral ``number`` as an integer. Past 64 bits a float
    stays a float (an integer there would be refused). Only for arguments that passed
    ``arguments_fit`` (bounded depth)."""
    if isinstance(value, float):
        if not value.is_integer():
            return value
        whole = int(Decimal(repr(value)))
        return whole if INT64_MIN <= whole <= INT64_MAX else value
    if isinstance(value, dict):
        return {key: echo_stable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [echo_stable(item) for item in value]
    return value


def arguments_json(arguments: dict[str, Any]) -> str:
    """A call's arguments (that fit an echo) as the JSON text the harness receives (``echo_stable``)."""
    return json.dumps(echo_stable(arguments), ensure_ascii=False)


def call_with_arguments(name: str, arguments: Any) -> ToolCall | None:
    """The call, with arguments a JSON object (given parsed or as a JSON string) that fits an echo
    (``arguments_fit``), else None."""
    if isinstance(arguments, str):
        ok, arguments = model_json(arguments)
        if not ok:
            return None
    if not isinstance(arguments, dict) or not arguments_fit(arguments):
        return None
    return ToolCall(name=name, arguments=arguments_json(arguments))


def call_from_json(data: Any, argument_keys: tuple[str, ...]) -> ToolCall | None:
    """A ``{"name", <arguments key>}`` object as a call, or None when it is not a well-formed one."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    key = next((k for k in argument_keys if k in data), None)
    if key is None:
        return None
    return call_with_arguments(data["name"], data[key])


@dataclass
class ParsedMessage:
    content: str | None
    tool_calls: list[ToolCall]


class HeldWhitespace:
    """Trailing whitespace held back until text follows it, kept as its pieces.

    A long run of whitespace streamed a token at a time is joined once when text follows, not copied
    and stripped again with every piece (which made a megabyte of spaces take tens of seconds)."""

    def __init__(self) -> None:
        self.pieces: list[str] = []  # what is held

    def before(self, text: str) -> str:
        """``text`` after what is held, less its own trailing whitespace, which is held instead
        ("" while there is only whitespace)."""
        if not self.pieces and not text[-1:].isspace():
            return text  # most pieces: nothing held, nothing to hold
        stripped = text.rstrip()
        if not stripped:
            if text:
                self.pieces.append(text)
            return ""
        body = stripped
        if self.pieces:
            body = "".join(self.pieces) + stripped
            self.pieces.clear()
        if len(stripped) < len(text):
            self.pieces.append(text[len(stripped) :])
        return body

    def take(self) -> str:
        """What is held, no longer held."""
        out = "".join(self.pieces)
        self.pieces.clear()
        return out


class ContentWhitespace:
    """What of an answer's content to send as it comes, so that a stream and the whole answer say the
    same (``collect`` folds a whole answer's events through one): whitespace is held until text
    follows. Before the first text, held whitespace is dropped if a tool call came first (the
    newline after a call's block), else sent with it; at the end it is dropped if the answer has
    calls, else sent. So an answer without calls is its text exactly as sampled."""

    def __init__(self) -> None:
        self.held = HeldWhitespace()  # whitespace not sent yet
        self.sent = False  # some text was
        self.calls = 0

    def text(self, text: str) -> str:
        """The part of ``text`` (with what is held) to send now."""
        if self.sent and not self.held.pieces and not text[-1:].isspace():
            return text  # once per sampled token: text after text, nothing held, nothing to hold
        body = self.held.before(text)
        if body and not self.sent:
            self.sent = True
            if self.calls:
                body = body.lstrip()
        return body

    def call(self) -> None:
        self.calls += 1

    def end(self) -> str:
        """What is still to send when the answer ends."""
        out = self.held.take()
        return "" if self.calls else out


def collect(events: list[Event]) -> ParsedMessage:
    """Fold events into one message: its content as ``ContentWhitespace`` sends it (with tool calls,
    None when nothing is left), so a streamed answer (``apis.chat``) and a whole one say the same."""
    trim = ContentWhitespace()
    parts: list[str] = []
    calls: list[ToolCall] = []
    for event in events:
        if isinstance(event, ContentEvent):
            parts.append(trim.text(event.text))
        else:
            trim.call()
            calls.append(event.call)
    parts.append(trim.end())
    content = "".join(parts)
    return ParsedMessage(content=(content or None) if calls else content, tool_calls=calls)
