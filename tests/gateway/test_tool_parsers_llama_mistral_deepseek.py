"""Llama 3 JSON, Mistral, DeepSeek V3/V3.1 and Kimi K2 tool-call parsing, without vLLM.

Every parser must give the same answer for the whole text and for the text streamed in any
pieces, keep malformed or cut-short calls in the content verbatim (counting them), and never raise.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.gateway.parsers.tools.base import ContentEvent, ToolCallEvent, collect
from harnessrl.gateway.parsers.tools.deepseek import DeepSeekV3ToolParser, DeepSeekV31ToolParser
from harnessrl.gateway.parsers.tools.json_scan import JsonValueScanner
from harnessrl.gateway.parsers.tools.kimi import KimiK2ToolParser
from harnessrl.gateway.parsers.tools.llama import Llama3JsonToolParser
from harnessrl.gateway.parsers.tools.mistral import MistralToolParser

Parser = type[Llama3JsonToolParser | MistralToolParser | DeepSeekV3ToolParser | KimiK2ToolParser]

NESTED = {"cmd": 'echo "héllo 世界" }{ ][', "opts": {"n": [1, {"deep": None}], "ok": True}}
NESTED_JSON = json.dumps(NESTED, ensure_ascii=False)


def ds3_call(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"


def ds31_call(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"


def kimi_call(name: str, args: str, index: int = 0) -> str:
    return f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
KIMI_BEGIN, KIMI_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"

# (parser, text, content, [(name, arguments)])
GOOD: list[tuple[Parser, str, str | None, list[tuple[str, dict[str, Any]]]]] = [
    (Llama3JsonToolParser, '{"name": "bash", "parameters": {"cmd": "ls"}}', None, [("bash", {"cmd": "ls"})]),
    (
        Llama3JsonToolParser,
        f'\n<|python_tag|>{{"name": "bash", "arguments": {NESTED_JSON}}}; {{"name": "read", "parameters": {{}}}}',
        None,
        [("bash", NESTED), ("read", {})],
    ),
    (
        Llama3JsonToolParser,
        '{"name": "a", "parameters": "{\\"x\\": 1}"} <|python_tag|>{"name": "b", "parameters": {"y": "é"}}\nDone.',
        "Done.",
        [("a", {"x": 1}), ("b", {"y": "é"})],
    ),
    (
        Llama3JsonToolParser,
        'Let me see. <|python_tag|>{"name": "ls", "parameters": {}}',
        "Let me see.",
        [("ls", {})],
    ),
    (
        MistralToolParser,
        f'Sure.[TOOL_CALLS][{{"name": "bash", "arguments": {NESTED_JSON}}}, {{"name": "ls"}}] after',
        "Sure. after",
        [("bash", NESTED), ("ls", {})],
    ),
    (MistralToolParser, '[TOOL_CALLS] {"name": "ls", "arguments": "{}"}', None, [("ls", {})]),
    (
        MistralToolParser,
        f'Hi [TOOL_CALLS]bash[ARGS]{NESTED_JSON}[TOOL_CALLS]read{{"path": "日本.txt"}}\nbye',
        "Hi \nbye",
        [("bash", NESTED), ("read", {"path": "日本.txt"})],
    ),
    (
        DeepSeekV3ToolParser,
        f"Plan: ls.{DS_BEGIN}{ds3_call('bash', NESTED_JSON)}\n{ds3_call('ls', '{}')}{DS_END} after",
        "Plan: ls. after",
        [("bash", NESTED), ("ls", {})],
    ),
    (
        DeepSeekV3ToolParser,  # pretty-printed arguments over several lines
        f"{DS_BEGIN}{ds3_call('bash', json.dumps(NESTED, indent=2, ensure_ascii=False))}{DS_END}",
        None,
        [("bash", NESTED)],
    ),
    (
        DeepSeekV31ToolParser,
        f"思考{DS_BEGIN}{ds31_call('bash', NESTED_JSON)}{ds31_call('ls', '{}')}{DS_END}",
        "思考",
        [("bash", NESTED), ("ls", {})],
    ),
    (
        DeepSeekV31ToolParser,  # the answer ended before the section's end marker
        f"{DS_BEGIN}{ds31_call('ls', '{}')}",
        None,
        [("ls", {})],
    ),
    (
        KimiK2ToolParser,
        f"Hi{KIMI_BEGIN}\n{kimi_call('bash', NESTED_JSON)}\n{kimi_call('ls', '{}', 1)}\n{KIMI_END}",
        "Hi",
        [("bash", NESTED), ("ls", {})],
    ),
]

# (parser, text, malformed count): each must come back as the content, verbatim, with no calls.
BAD: list[tuple[Parser, str, int]] = [
    (Llama3JsonToolParser, '{"name": "bash", "parameters": {"cmd": "ls"', 1),  # cut by max_tokens
    (Llama3JsonToolParser, '{"name": "bash"}', 1),  # no arguments
    (Llama3JsonToolParser, '{"arguments": {}}', 1),  # no name
    (Llama3JsonToolParser, '{"name": "bash", "parameters": [1]}', 1),
    (Llama3JsonToolParser, '{"name": "bash", "parameters": {}]', 1),  # bad JSON
    (Llama3JsonToolParser, '{"answer": 42}', 1),  # a JSON answer, not a call
    (Llama3JsonToolParser, '{"name": "a", "parameters": {"x": NaN}}', 1),  # not strict JSON
    (Llama3JsonToolParser, 'The call would be {"name": "bash", "parameters": {}}.', 0),  # JSON inside prose
    (Llama3JsonToolParser, '<|python_tag|>brave_search.call(query="x")', 1),  # a built-in tool
    (Llama3JsonToolParser, "text <|python_tag|>", 1),
    (Llama3JsonToolParser, "<|python_t", 0),
    (MistralToolParser, 'Hi[TOOL_CALLS][{"name": "bash", "arguments": {"cmd": "l', 1),
    (MistralToolParser, '[TOOL_CALLS][{"arguments": {}}]', 1),  # no name
    (MistralToolParser, '[TOOL_CALLS][{"name": "a", "arguments": {}}, 3]', 1),
    (MistralToolParser, "[TOOL_CALLS][]", 1),
    (MistralToolParser, '[TOOL_CALLS]bash[ARGS]{"cmd": "l', 1),
    (MistralToolParser, "[TOOL_CALLS]bash[ARGS]{bad}", 1),
    (MistralToolParser, "[TOOL_CALLS]bash[ARGS]", 1),
    (MistralToolParser, "[TOOL_CALLS]bash", 1),
    (MistralToolParser, "[TOOL_CALLS]two words[ARGS]{}", 1),
    (MistralToolParser, '[TOOL_CALLS]bash[ARGS]"ls"', 1),
    (MistralToolParser, "[TOOL_CALLS][ARGS]{}", 1),
    (MistralToolParser, "[TOOL_CALLS][TOOL_CALLS]", 2),
    (MistralToolParser, "a [TOOL_CALL", 0),
    (DeepSeekV3ToolParser, f"Hi{DS_BEGIN}{ds3_call('bash', '{')[:-20]}", 1),  # cut inside the call
    (DeepSeekV3ToolParser, f"{DS_BEGIN}{ds3_call('bash', '{bad}')}{DS_END}", 1),
    (DeepSeekV3ToolParser, f"{DS_BEGIN}{ds3_call('ls', '{}')}{ds3_call('', '{}')}{DS_END}", 1),  # one bad
    (DeepSeekV3ToolParser, f"{DS_BEGIN}{DS_END}", 1),
    (DeepSeekV3ToolParser, f"{DS_BEGIN}stray{ds3_call('ls', '{}')}{DS_END}", 1),
    (DeepSeekV31ToolParser, f"{DS_BEGIN}{ds31_call('bash', '[1]')}{DS_END}", 1),
    (
        DeepSeekV31ToolParser,
        f"{DS_BEGIN}<｜tool▁call▁begin｜>bash{{}}<｜tool▁call▁end｜>{DS_END}",
        1,
    ),  # no sep
    (DeepSeekV31ToolParser, f'x{DS_BEGIN}{ds31_call("ls", "{}")}<｜tool▁call▁begin｜>a<｜tool▁sep｜>{{"', 1),
    (KimiK2ToolParser, f"{KIMI_BEGIN}{kimi_call('bash', '{')}{KIMI_END}", 1),
    (
        KimiK2ToolParser,
        f"{KIMI_BEGIN}<|tool_call_begin|>bash<|tool_call_argument_begin|>{{}}<|tool_call_end|>",
        1,
    ),
    (KimiK2ToolParser, f"{KIMI_BEGIN}{kimi_call('bash', '{}')[:-5]}", 1),
]


def parse(parser: Parser, pieces: list[str]) -> tuple[str | None, list[tuple[str, str]], int]:
    p = parser()
    events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
    message = collect(events)
    return message.content, [(c.name, c.arguments) for c in message.tool_calls], p.malformed


def splits(text: str) -> list[list[str]]:
    """The text in two pieces at every position, and character by character."""
    return [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), GOOD)
def test_calls_are_read_streamed_or_not(
    parser: Parser, text: str, content: str | None, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    whole = parse(parser, [text])
    assert whole[0] == content
    assert [(name, json.loads(args)) for name, args in whole[1]] == calls
    assert whole[2] == 0
    # Arguments are serialized as JSON objects, non-ASCII characters kept as they are.
    assert all(args == json.dumps(json.loads(args), ensure_ascii=False) for _, args in whole[1])
    for pieces in splits(text):
        assert parse(parser, pieces) == whole, pieces


@pytest.mark.parametrize(("parser", "text", "malformed"), BAD)
def test_malformed_or_cut_calls_stay_text(parser: Parser, text: str, malformed: int) -> None:
    whole = parse(parser, [text])
    assert whole == (text, [], malformed)
    for pieces in splits(text):
        assert parse(parser, pieces) == whole, pieces


@pytest.mark.parametrize("parser", [Llama3JsonToolParser, MistralToolParser, DeepSeekV31ToolParser])
def test_arguments_nested_past_any_sane_depth_are_text_not_a_crash(parser: Parser) -> None:
    deep = '{"x": ' + "[" * 3000 + "]" * 3000 + "}"
    text = {
        Llama3JsonToolParser: f'{{"name": "a", "parameters": {deep}}}',
        MistralToolParser: f"[TOOL_CALLS]a[ARGS]{deep}",
        DeepSeekV31ToolParser: f"{DS_BEGIN}{ds31_call('a', deep)}{DS_END}",
    }[parser]
    assert parse(parser, [text]) == (text, [], 1)
    assert parse(parser, [text[:100], text[100:3500], text[3500:]]) == (text, [], 1)


def test_kimi_keeps_its_own_call_ids() -> None:
    p = KimiK2ToolParser()
    message = collect(p.feed(f"{KIMI_BEGIN}{kimi_call('ls', '{}', 3)}{KIMI_END}") + p.finish())
    assert [c.id for c in message.tool_calls] == ["functions.ls:3"]


@pytest.mark.parametrize(
    ("parser", "text", "hold"),
    [
        (Llama3JsonToolParser, "Hello <|python", "<|python"),
        (MistralToolParser, "Hello [TOOL_", "[TOOL_"),
        (DeepSeekV3ToolParser, "Hello <｜tool▁calls", "<｜tool▁calls"),
        (KimiK2ToolParser, "Hello <|tool_calls_sec", "<|tool_calls_sec"),
    ],
)
def test_content_is_released_unless_it_may_start_a_marker(parser: Parser, text: str, hold: str) -> None:
    p = parser()
    released = "".join(e.text for e in p.feed(text) if isinstance(e, ContentEvent))
    assert released == text[: -len(hold)]
    assert "".join(e.text for e in p.finish() if isinstance(e, ContentEvent)) == hold


def test_a_call_is_emitted_as_soon_as_it_is_complete() -> None:
    p = MistralToolParser()
    assert any(isinstance(e, ToolCallEvent) for e in p.feed('[TOOL_CALLS]ls[ARGS]{"a": "}"}'))
    p = Llama3JsonToolParser()
    assert any(isinstance(e, ToolCallEvent) for e in p.feed('{"name": "ls", "parameters": {}}'))


@pytest.mark.parametrize(
    ("text", "end"), [('{"a": "\\"}"}', 12), ('[1, {"b": [2]}, "]"] x', 20), ('{"a": "\\\\"} tail', 11)]
)
def test_json_scanner_finds_the_end_over_a_growing_text(text: str, end: int) -> None:
    for cut in range(1, len(text) + 1):
        scanner = JsonValueScanner()
        if scanner.end(text[:cut]) is None:  # a scanner is done once it has found the end
            assert cut < end
            assert scanner.end(text) == end
        else:
            assert cut >= end


FRAGMENTS = [
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    DS_BEGIN,
    DS_END,
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "function",
    "\n```json\n",
    "\n```",
    KIMI_BEGIN,
    KIMI_END,
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "<|tool_call_argument_begin|>",
    "functions.ls:0",
    '{"name": "ls", "parameters": {}}',
    '{"name": "ls"',
    '{"x": 1}',
    "ls",
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    ";",
    " ",
    "\n",
    "é",
    "<|",
    "<｜",
]
PARSERS = [
    Llama3JsonToolParser,
    MistralToolParser,
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    KimiK2ToolParser,
]


@settings(max_examples=150, deadline=None)
@given(
    parts=st.lists(st.sampled_from(FRAGMENTS), max_size=14),
    cuts=st.lists(st.integers(0, 400), max_size=6),
    parser=st.sampled_from(PARSERS),
)
def test_any_text_in_any_pieces_never_raises_and_equals_whole(
    parts: list[str], cuts: list[int], parser: Parser
) -> None:
    text = "".join(parts)
    bounds = [0, *sorted(c for c in cuts if c < len(text)), len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    whole = parse(parser, [text])
    assert parse(parser, pieces) == whole
    content, calls, _ = whole
    if not calls:
        assert content == text  # nothing is lost: without calls the text comes back as it was
