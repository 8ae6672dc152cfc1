"""The ``harmony`` (gpt-oss) tool parser, alone and behind the ``openai_gptoss`` reasoning parser."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harnessrl.gateway.parsers.reasoning import ContentText, GptOssReasoningParser
from harnessrl.gateway.parsers.tools import ContentEvent, ToolCallEvent, collect
from harnessrl.gateway.parsers.tools.harmony import HarmonyToolParser, parse_header


def call(name: str, args: str, *, recipient_first: bool = False, end: str = "<|call|>") -> str:
    if recipient_first:
        return f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>{args}{end}"
    return (
        f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}{end}"
    )


def parse(pieces: list[str]) -> tuple[dict[str, Any], int]:
    parser = HarmonyToolParser(None)
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
    message = collect(events)
    calls = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in message.tool_calls]
    return {"content": message.content, "tool_calls": calls}, parser.malformed


def through_splitter(text: str) -> dict[str, Any]:
    """What the gateway will do: the reasoning parser first, the tool parser on its content."""
    splitter, tools = GptOssReasoningParser(), HarmonyToolParser(None)
    contents = [e.text for e in splitter.feed(text) + splitter.finish() if isinstance(e, ContentText)]
    events = [e for piece in contents for e in tools.feed(piece)] + tools.finish()
    message = collect(events)
    return {
        "content": message.content,
        "tool_calls": [{"name": c.name, "arguments": json.loads(c.arguments)} for c in message.tool_calls],
    }


def splits(text: str) -> list[list[str]]:
    return [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


def test_one_call() -> None:
    result, malformed = parse([call("bash", '{"cmd": "ls -la"}')])
    assert result == {"content": None, "tool_calls": [{"name": "bash", "arguments": {"cmd": "ls -la"}}]}
    assert malformed == 0


def test_recipient_before_the_channel_and_no_stop_token() -> None:
    # <|call|> is a stop token the engine does not decode: the end of the text ends the call.
    result, _ = parse([call("bash", '{"cmd": "pwd"}', recipient_first=True, end="")])
    assert result["tool_calls"] == [{"name": "bash", "arguments": {"cmd": "pwd"}}]


def test_several_calls_and_text_around_them() -> None:
    text = "Let me look." + call("bash", '{"cmd": "ls"}') + call("read", '{"path": "a.txt", "n": [1, 2]}')
    result, _ = parse([text])
    assert result == {
        "content": "Let me look.",
        "tool_calls": [
            {"name": "bash", "arguments": {"cmd": "ls"}},
            {"name": "read", "arguments": {"path": "a.txt", "n": [1, 2]}},
        ],
    }


def test_arguments_keep_unicode() -> None:
    parser = HarmonyToolParser()
    events = parser.feed(call("bash", '{"cmd": "echo héllo 世界"}')) + parser.finish()
    (event,) = events
    assert isinstance(event, ToolCallEvent)
    assert event.call.arguments == '{"cmd": "echo héllo 世界"}'


@pytest.mark.parametrize(
    "block",
    [
        call("bash", "{not json"),
        call("bash", "[1, 2]"),  # arguments must be an object
        call("bash", '{"cmd": "ls"', end=""),  # cut by max_tokens
        "<|start|>assistant<|channel|>commentary to=browser.search json<|message|>{}<|call|>",  # built-in
        "<|start|>assistant<|channel|>commentary to=functions. json<|message|>{}<|call|>",  # no name
    ],
)
def test_a_malformed_call_stays_text(block: str) -> None:
    result, malformed = parse(["before " + block])
    assert result == {"content": "before " + block, "tool_calls": []}
    assert malformed == 1


def test_a_call_cut_short_in_its_header_is_counted() -> None:
    text = "<|start|>assistant<|channel|>commentary to=functions.ba"
    assert parse([text]) == ({"content": text, "tool_calls": []}, 1)


def test_a_bare_recipient_is_a_function() -> None:
    # gpt-oss sometimes drops the functions. prefix; vLLM's chat API takes the bare name.
    text = '<|start|>assistant<|channel|>commentary to=bash <|constrain|>json<|message|>{"cmd": "x"}'
    assert parse([text])[0]["tool_calls"] == [{"name": "bash", "arguments": {"cmd": "x"}}]


def test_raw_harmony_passes_other_messages_through() -> None:
    analysis = "<|channel|>analysis<|message|>think<|end|>"
    result, malformed = parse([analysis + call("bash", "{}")])
    assert result == {"content": analysis, "tool_calls": [{"name": "bash", "arguments": {}}]}
    assert malformed == 0


def test_a_start_tag_that_opens_no_header_is_text() -> None:
    text = "<|start|>" + "x" * 300
    assert parse([text])[0] == {"content": text, "tool_calls": []}
    assert parse(["ends in <|start|>assist"])[0]["content"] == "ends in <|start|>assist"


def test_behind_the_reasoning_parser() -> None:
    text = (
        "<|channel|>analysis<|message|>I should list files.<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Listing.<|end|>"
        + call("bash", '{"cmd": "ls"}')
        + call("bash", '{"cmd": "pwd"}', recipient_first=True, end="")
    )
    assert through_splitter(text) == {
        "content": "Listing.",
        "tool_calls": [
            {"name": "bash", "arguments": {"cmd": "ls"}},
            {"name": "bash", "arguments": {"cmd": "pwd"}},
        ],
    }
    # The turn's first message is a call: its <|start|>assistant was in the prompt.
    first = call("bash", '{"cmd": "ls"}').removeprefix("<|start|>assistant")
    assert through_splitter(first)["tool_calls"] == [{"name": "bash", "arguments": {"cmd": "ls"}}]


def test_parse_header() -> None:
    header = parse_header(
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    )
    assert (header.role, header.channel, header.recipient) == (
        "assistant",
        "commentary",
        "functions.get_weather",
    )
    assert header.function_name == "get_weather"
    glued = parse_header(" to=functions.f<|constrain|>json<|channel|>analysis")
    assert (glued.role, glued.channel, glued.recipient) == ("assistant", "analysis", "functions.f")


SPLIT_TEXTS = [
    "Hi " + call("bash", '{"cmd": "ls 世界"}') + " after " + call("bash", "{bad"),
    "<|channel|>analysis<|message|>a<|end|>" + call("f", '{"x": 1}', recipient_first=True, end=""),
    "x <|start|>assistant<|channel|>final<|message|>y<|end|><|sta",
]


@pytest.mark.parametrize("text", SPLIT_TEXTS)
def test_any_split_gives_the_same_result(text: str) -> None:
    whole = parse([text])
    for pieces in splits(text):
        assert parse(pieces) == whole, pieces


def test_content_is_released_as_soon_as_it_cannot_be_a_tag() -> None:
    parser = HarmonyToolParser()
    assert parser.feed("hello <|sta") == [ContentEvent("hello ")]
    assert parser.feed("rt|>assistant") == []
