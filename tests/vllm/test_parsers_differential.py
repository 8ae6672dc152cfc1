"""harnessrl's tool-call and reasoning parsers against vLLM's own, on the same sampled texts.

Each family's texts are read by vLLM's parser (``parser_reference.vllm_parse``, one subprocess per
module) and by ours, non-streaming and streamed in every split of the text into two pieces and in
single characters: the tool calls (name and parsed arguments) and the content must agree.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.vllm.parser_reference import vllm_parse

from harnessrl.gateway.parsers.tools import collect, get_tool_parser

pytestmark = pytest.mark.vllm

BASH = {
    "type": "function",
    "function": {"name": "bash", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
}

HERMES_TEXTS = [
    'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>',
    '<tool_call>{"name": "bash", "arguments": {"cmd": "echo \\"héllo 世界\\""}}</tool_call>\n'
    '<tool_call>{"name": "bash", "arguments": {"cmd": "cat a.txt", "opts": {"n": [1, 2]}}}</tool_call>',
    "No tools needed: the answer is 42.",
]


def ours(parser: str, text: str, pieces: list[str] | None = None) -> dict[str, Any]:
    p = get_tool_parser(parser)([BASH])
    events = [e for piece in (pieces or [text]) for e in p.feed(piece)] + p.finish()
    message = collect(events)
    return {
        "content": message.content,
        "tool_calls": [{"name": c.name, "arguments": json.loads(c.arguments)} for c in message.tool_calls],
    }


def splits(text: str) -> list[list[str]]:
    """The text in two pieces at every position, and character by character."""
    return [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


def test_hermes_matches_vllm_streamed_or_not() -> None:
    cases = [{"tool_parser": "hermes", "text": t, "tools": [BASH]} for t in HERMES_TEXTS]
    reference = vllm_parse(cases, special_tokens=["<tool_call>", "</tool_call>"])
    for text, theirs in zip(HERMES_TEXTS, reference, strict=True):
        assert "error" not in theirs, theirs
        whole = ours("hermes", text)
        assert whole["tool_calls"] == theirs["tool_calls"], text
        for pieces in splits(text):
            assert ours("hermes", text, pieces) == whole, pieces
