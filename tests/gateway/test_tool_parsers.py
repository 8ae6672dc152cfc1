"""Hermes tool-call parsing: whole text and streamed in arbitrary pieces give the same answer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harnessrl.errors import ConfigError
from harnessrl.gateway.parsers.tools import (
    ContentEvent,
    HermesToolParser,
    collect,
    get_tool_parser,
    parse_tool_calls,
)
from harnessrl.gateway.parsers.tools.base import partial_suffix

TEXT = (
    'I will list files.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "read", "arguments": "{\\"path\\": \\"a.txt\\"}"}\n</tool_call>'
)


def test_hermes_blocks_become_openai_tool_calls() -> None:
    parsed = parse_tool_calls(TEXT)
    assert parsed.content == "I will list files."
    assert [c.name for c in parsed.tool_calls] == ["bash", "read"]
    assert json.loads(parsed.tool_calls[0].arguments) == {"command": "ls -la"}
    assert json.loads(parsed.tool_calls[1].arguments) == {"path": "a.txt"}
    assert all(c.id.startswith("call_") for c in parsed.tool_calls)
    assert parsed.tool_calls[0].to_openai()["type"] == "function"


def test_only_tool_calls_gives_none_content() -> None:
    parsed = parse_tool_calls('<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>')
    assert parsed.content is None and len(parsed.tool_calls) == 1


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "bash", "arguments": [1]}\n</tool_call>',  # arguments not an object
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"',  # cut by max_tokens
        # Lenient JSON a client could not read back, or the store could not keep: text, not a call.
        '<tool_call>\n{"name": "bash", "arguments": {"n": NaN}}\n</tool_call>',
        '<tool_call>\n{"name": "bash", "arguments": {"n": 123456789012345678901234567890}}\n</tool_call>',
        '<tool_call>\n{"name": "bash", "arguments": "{\\"n\\": Infinity}"}\n</tool_call>',
        "plain text with a < sign and <tool",
    ],
)
def test_malformed_or_unclosed_blocks_stay_text(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.tool_calls == []
    assert parsed.content == text


def test_unknown_parser_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="tool_call_parser"):
        get_tool_parser("nope")


@given(cuts=st.lists(st.integers(0, len(TEXT)), max_size=12))
def test_streaming_in_any_pieces_equals_whole(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(TEXT)]
    parser = HermesToolParser()
    events = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        events += parser.feed(TEXT[a:b])
    events += parser.finish()
    streamed = collect(events)
    whole = parse_tool_calls(TEXT)
    assert streamed.content == whole.content
    assert [(c.name, c.arguments) for c in streamed.tool_calls] == [
        (c.name, c.arguments) for c in whole.tool_calls
    ]
    # Content is never emitted as part of a tag.
    assert all("<tool_call" not in e.text for e in events if isinstance(e, ContentEvent))


@given(
    text=st.text(alphabet="<tol_ca>/x", max_size=14),
    tag=st.sampled_from(["<tool_call>", "</tool_call>", "<", "ab", ""]),
)
def test_partial_suffix_is_the_longest_tail_that_starts_the_tag(text: str, tag: str) -> None:
    longest = max((k for k in range(1, len(tag)) if text.endswith(tag[:k])), default=0)
    assert partial_suffix(text, tag) == longest


def test_text_that_cannot_start_a_tag_is_content_as_it_comes() -> None:
    # The per-token case: nothing held, no "<" in the piece; the piece is released whole at once.
    parser = HermesToolParser()
    assert parser.feed("Hello") == [ContentEvent("Hello")]
    assert parser.feed("") == []
    assert parser.feed(" wor<") == [ContentEvent(" wor")]  # "<" may start a tag: held
    assert parser.feed("ld") == [ContentEvent("<ld")]
    assert parser.feed("<tool") == []
    assert parser.feed("box") == [ContentEvent("<toolbox")]
    assert parser.feed("<tool_call>") == []
    assert parser.feed('{"name": "a", "arguments": {}}') == []  # inside a block: held, no "<"
    events = parser.feed("</tool_call>!")
    assert [type(e).__name__ for e in events] == ["ToolCallEvent", "ContentEvent"] and events[1].text == "!"
