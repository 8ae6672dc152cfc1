"""Reasoning parsers: each family's split of sampled text, the same for every way the text is streamed."""

from __future__ import annotations

import pytest

from harnessrl.errors import ConfigError
from harnessrl.gateway.parsers.reasoning import (
    REASONING_PARSERS,
    ContentText,
    GptOssReasoningParser,
    Qwen3ReasoningParser,
    ReasoningEvent,
    ReasoningText,
    get_reasoning_parser,
    split_reasoning,
)

THINK_FAMILIES = ["qwen3", "deepseek_r1", "deepseek_v3", "glm45", "kimi_k2"]


def run(name: str, pieces: list[str], starts_in_reasoning: bool = False) -> list[tuple[str, str]]:
    """The parser's output with adjacent pieces of one kind merged (how a client sees it)."""
    parser = get_reasoning_parser(name)(starts_in_reasoning=starts_in_reasoning)
    events: list[ReasoningEvent] = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
    merged: list[tuple[str, str]] = []
    for event in events:
        kind = "reasoning" if isinstance(event, ReasoningText) else "content"
        assert isinstance(event, ReasoningText | ContentText) and event.text
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + event.text)
        else:
            merged.append((kind, event.text))
    return merged


def splits(text: str) -> list[list[str]]:
    return [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


def split(name: str, text: str, starts_in_reasoning: bool = False) -> tuple[str | None, str]:
    return split_reasoning(text, name, starts_in_reasoning=starts_in_reasoning)


# -- <think> families -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", THINK_FAMILIES)
def test_a_leading_block_is_reasoning_and_the_rest_content(name: str) -> None:
    assert split(name, "<think>\nplan it\n</think>\n\nThe answer.") == ("\nplan it\n", "\n\nThe answer.")
    assert split(name, "<think>plan</think>answer", starts_in_reasoning=True) == ("plan", "answer")


@pytest.mark.parametrize("name", THINK_FAMILIES)
def test_a_prompt_opened_block_needs_no_opening_tag(name: str) -> None:
    assert split(name, "plan\n</think>\n\nanswer", starts_in_reasoning=True) == ("plan\n", "\n\nanswer")


@pytest.mark.parametrize("name", ["qwen3", "glm45", "kimi_k2"])
def test_without_an_opened_block_tagless_text_is_content(name: str) -> None:
    assert split(name, "just the answer") == (None, "just the answer")
    # No block was open, so the closing tag is the answer's own text.
    assert split(name, "a</think>b") == (None, "a</think>b")


def test_deepseek_r1_always_starts_in_reasoning() -> None:
    assert split("deepseek_r1", "plan</think>answer") == ("plan", "answer")
    assert split("deepseek_r1", "still thinking") == ("still thinking", "")
    # Only its first <think> is a tag; after the block the text is content verbatim.
    assert split("deepseek_r1", "<think>a<think>b</think>c</think>d") == ("a<think>b", "c</think>d")


def test_deepseek_v3_thinks_only_when_the_prompt_opened_the_block() -> None:
    assert split("deepseek_v3", "plan</think>answer", starts_in_reasoning=True) == ("plan", "answer")
    # Non-thinking mode: the prompt closed the block (``</think>``), so the text is the answer.
    assert split("deepseek_v3", "answer</think>x") == (None, "answer</think>x")
    assert split("deepseek_v3", "<think>a<think>b</think>c</think>d") == ("a<think>b", "c</think>d")


@pytest.mark.parametrize("name", THINK_FAMILIES)
@pytest.mark.parametrize("starts", [False, True])
def test_an_unclosed_block_stays_reasoning(name: str, starts: bool) -> None:
    assert split(name, "<think>cut by max_tok", starts_in_reasoning=starts) == ("cut by max_tok", "")
    assert split(name, "<think>cut at a tag </thi", starts_in_reasoning=starts) == ("cut at a tag </thi", "")


@pytest.mark.parametrize("name", ["qwen3", "kimi_k2"])
def test_think_later_in_content_is_text(name: str) -> None:
    assert split(name, "<think>a</think>b <think>c</think>d") == ("a", "b <think>cd")
    assert split(name, "say <think> here") == (None, "say <think> here")


def test_glm45_opens_another_block_in_content() -> None:
    assert split("glm45", "<think>a</think>b<think>c</think>d") == ("ac", "bd")
    assert run("glm45", ["pre<think>x</think>post"]) == [
        ("content", "pre"),
        ("reasoning", "x"),
        ("content", "post"),
    ]


@pytest.mark.parametrize("name", ["qwen3", "glm45", "kimi_k2"])
def test_repeated_open_tags_in_reasoning_are_dropped(name: str) -> None:
    assert split(name, "<think>a<think>b</think>c") == ("ab", "c")
    assert split(name, "<think>a</think>b</think>c") == ("a", "bc")  # a stray close after the block


@pytest.mark.parametrize(
    ("name", "marker"),
    [("qwen3", "<tool_call>"), ("glm45", "<tool_call>"), ("kimi_k2", "<|tool_calls_section_begin|>")],
)
def test_a_tool_call_ends_the_reasoning(name: str, marker: str) -> None:
    text = f"<think>I will call{marker}body"
    assert split(name, text) == ("I will call", f"{marker}body")


def test_deepseek_r1_keeps_tool_markers_in_reasoning() -> None:
    assert split("deepseek_r1", "a<tool_call>b</think>c") == ("a<tool_call>b", "c")


@pytest.mark.parametrize("name", THINK_FAMILIES)
def test_unicode_survives(name: str) -> None:
    assert split(name, "<think>思考 🤔 é</think>答え ✓") == ("思考 🤔 é", "答え ✓")


def test_whitespace_before_the_opening_tag_is_not_reasoning() -> None:
    assert split("qwen3", "  \n<think>a</think>b") == ("a", "b")
    assert split("qwen3", "   ") == (None, "   ")
    assert split("qwen3", "") == (None, "")


def test_in_reasoning_follows_the_block() -> None:
    qwen = get_reasoning_parser("qwen3")(starts_in_reasoning=False)
    assert not qwen.in_reasoning
    qwen.feed("<think>a")
    assert qwen.in_reasoning
    qwen.feed("</think>b")
    assert not qwen.in_reasoning
    harmony = get_reasoning_parser("openai_gptoss")(starts_in_reasoning=False)
    harmony.feed("<|channel|>analysis<|message|>a")
    assert harmony.in_reasoning
    harmony.feed("<|end|><|start|>assistant<|channel|>final<|message|>b")
    assert not harmony.in_reasoning


def test_prompt_opens_reasoning() -> None:
    assert Qwen3ReasoningParser.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not Qwen3ReasoningParser.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not GptOssReasoningParser.prompt_opens_reasoning("<|start|>assistant")


THINK_TEXTS = [
    "<think>\nplan 计划 🤔\n</think>\n\nanswer <think> x </think> y",
    "  <think>a<think>b</thinking></think>c</think>d<tool_call>{}</tool_call>",
    "plan</think>answer<|tool_calls_section_begin|>z",
    "<think>unclosed </thi",
    "<thin",
    "no tags at all",
]


@pytest.mark.parametrize("name", THINK_FAMILIES)
@pytest.mark.parametrize("starts", [False, True])
@pytest.mark.parametrize("text", THINK_TEXTS)
def test_any_split_gives_the_same_result(name: str, starts: bool, text: str) -> None:
    whole = run(name, [text], starts)
    for pieces in splits(text):
        assert run(name, pieces, starts) == whole, pieces


# -- gpt-oss (Harmony) ------------------------------------------------------------------------------

CALL = '<|start|>assistant<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{"cmd": "ls"}<|call|>'


def test_gptoss_analysis_is_reasoning_and_final_is_content() -> None:
    text = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>answer<|return|>"
    assert split("openai_gptoss", text) == ("think", "answer")
    # The engine does not decode the stop token: the text just ends.
    assert split("openai_gptoss", text.removesuffix("<|return|>")) == ("think", "answer")


def test_gptoss_an_unclosed_analysis_stays_reasoning() -> None:
    assert split("openai_gptoss", "<|channel|>analysis<|message|>cut sh") == ("cut sh", "")
    assert split("openai_gptoss", "<|channel|>analysis<|message|>cut <|en") == ("cut <|en", "")


def test_gptoss_tool_calls_pass_through_verbatim() -> None:
    text = "<|channel|>analysis<|message|>think<|end|>" + CALL
    assert split("openai_gptoss", text) == ("think", CALL)
    # The first message's <|start|>assistant was in the prompt: it is restored for the tool parser.
    first = CALL.removeprefix("<|start|>assistant")
    assert split("openai_gptoss", first) == (None, CALL)
    # A call cut off by the next <|start|> is closed with <|end|>, so the tool parser sees its end.
    body = CALL.removesuffix("<|call|>")
    assert split("openai_gptoss", body + "<|start|>assistant<|channel|>final<|message|>ok") == (
        None,
        body + "<|end|>ok",
    )


def test_gptoss_joins_messages_of_a_kind_with_newlines() -> None:
    text = (
        "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>preamble"
        "<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
        "<|start|>assistant<|channel|>final<|message|>answer"
    )
    assert split("openai_gptoss", text) == ("a\nb", "preamble\nanswer")


def test_gptoss_text_that_is_not_harmony_is_content() -> None:
    assert split("openai_gptoss", "plain text") == (None, "plain text")
    long = "x" * 400 + "<|start|>assistant<|channel|>final<|message|>hi"
    assert split("openai_gptoss", long) == (None, "x" * 400 + "hi")
    assert split("openai_gptoss", "<|channel|>analysis<|message|>a<|end|><|start|>assis") == (
        "a",
        "<|start|>assis",
    )


def test_gptoss_unicode() -> None:
    assert split("openai_gptoss", "<|channel|>final<|message|>héllo 世界 🌍<|return|>") == (
        None,
        "héllo 世界 🌍",
    )


HARMONY_TEXTS = [
    "<|channel|>analysis<|message|>思考 🤔<|end|><|start|>assistant<|channel|>final<|message|>答え<|return|>",
    "<|channel|>analysis<|message|>a<|end|>" + CALL + CALL.replace("ls", "pwd"),
    ' to=functions.bash<|channel|>commentary json<|message|>{"cmd": "x"}',
    "<|channel|>analysis<|message|>a<|end|>junk<|start|>assistant<|channel|>final<|message|>b<|end|>",
    "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>fi",
    "not harmony <|start",
]


@pytest.mark.parametrize("text", HARMONY_TEXTS)
def test_gptoss_any_split_gives_the_same_result(text: str) -> None:
    whole = run("openai_gptoss", [text])
    for pieces in splits(text):
        assert run("openai_gptoss", pieces) == whole, pieces


# -- the registry -----------------------------------------------------------------------------------


def test_registry_names() -> None:
    assert set(REASONING_PARSERS) >= {"qwen3", "deepseek_r1", "glm45", "kimi_k2", "openai_gptoss"}


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        get_reasoning_parser("nope")
    message = str(err.value)
    assert "'nope'" in message
    for name in REASONING_PARSERS:
        assert name in message
