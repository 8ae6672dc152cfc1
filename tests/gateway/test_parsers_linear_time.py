"""The parsers do work linear in the text they are fed, however it is split: a long run of whitespace,
a long name or a long argument streamed a few characters at a time is looked at once, not again with
every piece (a 200k-space answer once took a gateway a minute of event-loop time).

No clocks: the work is counted. ``work`` runs a parser over a text cut into 4-character pieces and
counts (a) the Python lines executed in the gateway's modules (a character-by-character loop shows
there) and (b) the characters copied by concatenations involving fed text or text sliced from it
(a string grown by ``+=`` with every piece, copied whole each time, shows there). Feeding 4x the text
must cost about 4x the work; the quadratic paths these tests were written against cost 10-30x.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import harnessrl.gateway
from harnessrl.gateway.apis.anthropic_blocks import BlockAssembler
from harnessrl.gateway.apis.responses_output import OutputStream
from harnessrl.gateway.parsers.reasoning import ContentText, ReasoningEvent, get_reasoning_parser
from harnessrl.gateway.parsers.tools import (
    ContentWhitespace,
    GlmToolParser,
    HarmonyToolParser,
    HermesToolParser,
    KimiK2ToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    QwenXmlToolParser,
    collect,
)
from harnessrl.gateway.pipeline.generation import Piece

GATEWAY = str(Path(harnessrl.gateway.__file__).parent)
PIECE = 4  # characters per fed piece: about a token
N = 600  # characters of the long part; the check feeds N and 4N
LINEAR = 6.0  # 4N may cost this many times N's work (linear: ~4; the old paths: 10 or more)


class CountedPiece(str):
    """Text that counts the characters copied to the left of it when text is appended to it or it
    to other text: ``held += piece`` copies ``held`` whole, and a parser that does so with every
    piece copies quadratically much. Its slices and sums are counted pieces too, so text held as a
    slice of what was fed is followed."""

    copied = 0

    def __add__(self, other: str) -> CountedPiece:
        CountedPiece.copied += len(self)
        return CountedPiece(str.__add__(self, other))

    def __radd__(self, other: str) -> CountedPiece:
        CountedPiece.copied += len(other)
        return CountedPiece(str.__add__(other, self))

    def __getitem__(self, key: Any) -> CountedPiece:
        return CountedPiece(str.__getitem__(self, key))


def work(feed: Callable[[str], Any], finish: Callable[[], Any], head: str, long: str, tail: str) -> int:
    """Lines run in the gateway's modules plus characters copied by appends, to feed ``head``, then
    ``long`` in ``PIECE``-character pieces, then ``tail``, and finish."""
    lines = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if not frame.f_code.co_filename.startswith(GATEWAY):
            return None
        if event == "line":
            lines += 1
        return tracer

    CountedPiece.copied = 0
    sys.settrace(tracer)
    try:
        feed(head)
        for i in range(0, len(long), PIECE):
            feed(CountedPiece(long[i : i + PIECE]))
        feed(tail)
        finish()
    finally:
        sys.settrace(None)
    return lines + CountedPiece.copied


def tool_parser_work(make: Callable[[], Any], head: str, body: Callable[[int], str], tail: str = ""):
    def run(n: int) -> int:
        parser = make()
        return work(parser.feed, parser.finish, head, body(n), tail)

    return run


def assert_linear(run: Callable[[int], int]) -> None:
    small, large = run(N), run(4 * N)
    assert large <= LINEAR * small, f"feeding 4x the text cost {large / small:.1f}x the work"


ARGS_HEAD = '<tool_call>{"name": "write", "arguments": {"code": "'
CASES: dict[str, Callable[[int], int]] = {
    # Whitespace after <tool_call> while the next tag is awaited (a per-character loop from the
    # block's start, again with every piece).
    "qwen3_coder: whitespace in a block": tool_parser_work(
        QwenXmlToolParser, "<tool_call>", lambda n: " " * n
    ),
    "glm45: whitespace in a block": tool_parser_work(GlmToolParser, "<tool_call>run\n", lambda n: " " * n),
    # A long name or key searched for its end from its start with every piece.
    "qwen3_coder: a long name": tool_parser_work(
        QwenXmlToolParser, "<tool_call><function=", lambda n: "a" * n
    ),
    "glm45: a long key": tool_parser_work(GlmToolParser, "<tool_call>run<arg_key>", lambda n: "k" * n),
    # A long value (a file's text): the block held as one string grown with every piece.
    "qwen3_coder: a long value": tool_parser_work(
        QwenXmlToolParser,
        "<tool_call>\n<function=write>\n<parameter=code>\n",
        lambda n: "x = 1\n" * (n // 6),
        "\n</parameter>\n</function>\n</tool_call>",
    ),
    "glm45: a long value": tool_parser_work(
        GlmToolParser,
        "<tool_call>write<arg_key>code</arg_key><arg_value>",
        lambda n: "y" * n,
        "</arg_value></tool_call>",
    ),
    # A long argument in a Hermes block: searched for </tool_call> from the block's start.
    "hermes: a long argument": tool_parser_work(
        HermesToolParser, ARGS_HEAD, lambda n: "z" * n, '"}}</tool_call>'
    ),
    # Mistral: a long v11 name, and whitespace after the marker.
    "mistral: a long name": tool_parser_work(MistralToolParser, "[TOOL_CALLS]", lambda n: "a" * n, "{}"),
    "mistral: whitespace after the marker": tool_parser_work(
        MistralToolParser, "[TOOL_CALLS]", lambda n: " " * n
    ),
    # A long JSON argument after Mistral's marker or at Llama's start: the block grown with every piece.
    "mistral: a long argument": tool_parser_work(
        MistralToolParser, '[TOOL_CALLS]write[ARGS]{"code": "', lambda n: "z" * n, '"}'
    ),
    "llama3_json: a long argument": tool_parser_work(
        Llama3JsonToolParser, '{"name": "write", "parameters": {"code": "', lambda n: "z\\n" * (n // 3), '"}}'
    ),
    # A long Kimi section or Harmony message body: grown with every piece.
    "kimi_k2: a long argument": tool_parser_work(
        KimiK2ToolParser,
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.write:0<|tool_call_argument_begin|>{"c": "',
        lambda n: "z" * n,
        '"}<|tool_call_end|><|tool_calls_section_end|>',
    ),
    "openai (harmony): a long argument": tool_parser_work(
        HarmonyToolParser,
        '<|channel|>commentary to=functions.write <|constrain|>json<|message|>{"c": "',
        lambda n: "z" * n,
        '"}<|call|>',
    ),
    # Llama: whitespace at the start, where a call may still begin.
    "llama3_json: whitespace at the start": tool_parser_work(
        Llama3JsonToolParser, "", lambda n: " " * n, "hi"
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tool_parsers_read_long_parts_in_linear_work(case: str) -> None:
    assert_linear(CASES[case])


def test_content_whitespace_holds_a_long_run_in_linear_work() -> None:
    def run(n: int) -> int:
        trim = ContentWhitespace()
        return work(trim.text, trim.end, "text", " " * n, "more")

    assert_linear(run)
    events = HermesToolParser().feed("a" + " " * 9 + "b")
    assert collect(events).content == "a" + " " * 9 + "b"  # what was held is sent, in order


@pytest.mark.parametrize("parser", ["qwen3", "glm45", "deepseek_v3"])
def test_reasoning_start_whitespace_is_read_in_linear_work(parser: str) -> None:
    def run(n: int) -> int:
        reasoning = get_reasoning_parser(parser)()
        return work(reasoning.feed, reasoning.finish, "", " " * n, "<think>plan</think>answer")

    assert_linear(run)


class NoReasoning:
    """The reasoning parser of a model that does not reason: each piece is content, passed on as it
    came (so the count sees what the API module does with it)."""

    in_reasoning = False

    def feed(self, text: str) -> list[ReasoningEvent]:
        return [ContentText(text)]

    def finish(self) -> list[ReasoningEvent]:
        return []


def test_anthropic_blocks_hold_trailing_whitespace_in_linear_work() -> None:
    def run(n: int) -> int:
        blocks = BlockAssembler(HermesToolParser(), reasoning=NoReasoning())
        return work(blocks.feed, blocks.finish, "text", " " * n, "more")

    assert_linear(run)
    blocks = BlockAssembler(HermesToolParser())
    for piece in ("text", "   ", " \n", "more  "):
        blocks.feed(piece)
    blocks.finish()
    assert blocks.blocks == [{"type": "text", "text": "text    \nmore"}]


def test_responses_output_holds_trailing_whitespace_in_linear_work() -> None:
    def run(n: int) -> int:
        out = OutputStream(HermesToolParser(), reasoning=NoReasoning())

        def feed(text: str) -> None:
            out.feed(Piece(text, -1, 0.0))
            out.flush()

        return work(feed, lambda: out.finish("completed"), "text", " " * n, "more")

    assert_linear(run)
