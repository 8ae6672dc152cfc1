"""Answer extraction and comparison shared by the reasoning_gym and exact_match evaluators."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harnessrl.tasks.answers import (
    answers_match,
    blank_answer,
    extract_answer,
    final_answer_text,
    normalize_answer,
    sampled_text,
    strip_think,
)

ANSWER = re.compile(r"Answer:\s*(.+)")


@pytest.mark.parametrize(
    ("text", "fallback", "expected"),
    [
        ("Answer: 42", "none", "42"),
        ("Answer: 1\nno wait\nAnswer: 2", "none", "2"),
        ("**Answer:** **42**", "none", "42"),
        ("Answer: `x = 3`.", "none", "x = 3"),
        ("Answer: $\\boxed{17}$", "none", "17"),
        ("Answer: e.g..", "none", "e.g.."),
        ("so the result is 12", "none", None),
        ("so the result is\n12\n\n", "last_line", "12"),
        ("between 1,200 and 3.5 apples", "last_number", "3.5"),
        ("no digits", "last_number", None),
        ("", "last_line", None),
        # Two boxes are not one: a greedy \\boxed\{(.*)\} read this as "1} or \\boxed{2".
        ("Answer: \\boxed{1} or \\boxed{2}", "none", "\\boxed{1} or \\boxed{2}"),
        ("Answer: \\boxed{\\frac{1}{2}}", "none", "\\frac{1}{2}"),
        ("Answer: \\boxed{1}}", "none", "\\boxed{1}}"),
        # Invisible format characters (RLM, zero-width space, BOM) at the ends are not the answer.
        ("Answer: 42\u200f", "none", "42"),
        ("Answer: \u200b\\boxed{42}\u200b.", "none", "42"),
        ("the result is \u22125", "last_number", "-5"),
    ],
)
def test_extract_answer(text, fallback, expected):
    assert extract_answer(text, ANSWER, fallback) == expected


def test_without_pattern_the_whole_text():
    assert extract_answer("  Paris. ", None) == "Paris"
    assert extract_answer("Answer: A", re.compile(r"Answer: \w")) == "Answer: A"  # no group: whole match


@pytest.mark.parametrize(
    ("answer", "gold", "normalize", "same"),
    [
        ("Paris", "paris", True, True),
        ("Paris", "paris", False, False),
        ("7.0", "7", True, True),
        ("1e3", "1000", True, True),
        ("7", "8", True, False),
        ("a  b", "A B.", True, True),
        ("nan", "nan", True, True),
        ("1,000", "1000", True, True),
        ("-0", "0", True, True),
        # Nearly equal is not equal: floats matched these on their first ~16 digits.
        ("987654321000", "987654321987", True, False),
        ("12345678901234567891", "12345678901234567890", True, False),
        ("123456789012346", "123456789012345", True, False),
        ("0.30000000000000004", "0.3", True, False),
        # Not numbers as written: compared as text.
        ("123", "1,2,3", True, False),
        ("1,2", "12", True, False),
        ("1_000", "1000", True, False),
        ("\u0664\u0662", "42", True, False),
        # A leading zero makes it a code, compared as text: "110" is not the gold "0110".
        ("110", "0110", True, False),
        ("0110", "0110", True, True),
        ("42", "00042", True, False),
        ("00042", "042", True, False),
        ("0,110", "110", True, False),
        ("0.5", "0.50", True, True),
        ("0", "0.0", True, True),
        # The typeset minus, a bare fraction, an invisible mark at the end.
        ("\u22125", "-5", True, True),
        ("\u22120.5", "-.5", True, True),
        (".5", "0.5", True, True),
        ("42\u200f", "42", True, True),
        ("\ufeffParis\u200b", "paris", True, True),
    ],
)
def test_answers_match(answer, gold, normalize, same):
    assert answers_match(answer, gold, normalize=normalize) is same


@given(st.text(max_size=200), st.sampled_from(["none", "last_line", "last_number"]))
def test_extract_never_crashes(text, fallback):
    result = extract_answer(text, ANSWER, fallback)
    assert result is None or isinstance(result, str)


@given(st.lists(st.sampled_from(["<think>", "</think>", "a", "\n", "<", "think>"]), max_size=30).map("".join))
def test_strip_think_removes_what_the_regex_removed(text):
    assert strip_think(text) == re.sub(r"<think>.*?</think>", "", text, flags=re.S)


def test_sampled_text_holds_tool_call_arguments_in_every_shape():
    chat = {
        "choices": [
            {
                "message": {
                    "content": "I'll look.",
                    "tool_calls": [
                        {
                            "type": "function",
                            "function": {"name": "act", "arguments": '{"action": "look around"}'},
                        }
                    ],
                }
            }
        ]
    }
    anthropic = {"content": [{"type": "tool_use", "name": "act", "input": {"action": "Open door", "n": [0]}}]}
    responses = {"output": [{"type": "function_call", "name": "act", "arguments": "go to kitchen"}]}
    assert "look around" in sampled_text(chat) and "I'll look." in sampled_text(chat)
    assert "Open door" in sampled_text(anthropic) and "0" in sampled_text(anthropic).split("\n")
    assert "go to kitchen" in sampled_text(responses)  # not JSON: the text as written
    # Separate arguments are separate segments: no match across them.
    split = {"content": [{"type": "tool_use", "input": {"a": "open", "b": "door"}}]}
    assert "open door" not in " ".join(sampled_text(split).split())
    # The final answer is still the reply's text alone.
    assert final_answer_text([_call(chat)]) == "I'll look."


def _call(response):
    from harnessrl.schemas import Call

    return Call(rollout_id="r", seq=0, response=response, prompt_token_ids=[1], response_token_ids=[2],
                response_logprobs=[0.0])  # fmt: skip


def test_answer_functions_stay_linear_on_hostile_text():
    """No backtracking on the policy's text: a megabyte of braces or format characters is one pass."""
    braces = "\\boxed{" + "{" * 500_000 + "}" * 499_999
    assert extract_answer(braces, None) == braces
    marks = "\u200f" * 500_000 + "7" + "\u200b" * 500_000
    assert extract_answer(marks, None) == "7"
    assert answers_match("0" * 500_000 + "1", "1") is False


def test_strip_think_on_a_megabyte_of_unclosed_blocks():
    """One pass: the regex took time quadratic in the unclosed ``<think>`` (this input: ~11 minutes
    of the controller's event loop, extrapolated from 10 s at 128 KiB)."""
    text = "<think>" * ((1 << 20) // 7) + "Answer: 4"
    assert strip_think(text) == text
    assert strip_think("a<think>x</think>b<think>y") == "ab<think>y"


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("the options were 1,2,3", "3"),  # was "123": every comma dropped, a list read as one number
        ("I counted 4,5", "5"),
        ("pick 1/2,3", "3"),
        ("so 12,345.5 in all", "12345.5"),  # thousands separators still read as such
        ("-1,234,567 it is", "-1234567"),
        ("2,000/3,000 of them", "2000/3000"),
        ("a list: 7,", "7"),
    ],
)
def test_last_number_reads_a_comma_list_as_a_list(text, number):
    assert extract_answer(text, ANSWER, "last_number") == number
    assert answers_match(extract_answer(text, ANSWER, "last_number"), number)
    if text.startswith(("the options", "I counted")):  # the concatenation is never the answer
        assert not answers_match(
            extract_answer(text, ANSWER, "last_number"), text.split()[-1].replace(",", "")
        )


def test_last_number_stays_linear_on_a_megabyte_of_commas():
    assert extract_answer("1," * 500_000, ANSWER, "last_number") == "1"
    assert extract_answer("999," * 250_000 + "/" + "1," * 250_000, ANSWER, "last_number") == "1"


@pytest.mark.parametrize("gold", ["", " ", ".", "\u200b", " . "])
@pytest.mark.parametrize("reply", ["", ".", "**", "$$", "`.`"])
def test_a_blank_gold_matches_no_reply(gold, reply):
    """A blank gold matched every reply that says nothing: an empty reply earned 1 on such a task."""
    answer = extract_answer(reply, None)
    assert normalize_answer(answer) == normalize_answer(gold) == ""  # what used to make them equal
    assert answers_match(answer, gold) is False
    assert answers_match(answer, gold, normalize=False) is False
    assert blank_answer(gold) and blank_answer(answer)
    # The control: a gold that says something still matches, normalized or not.
    assert answers_match("Paris", "paris.") is True
    assert answers_match("Paris", "Paris", normalize=False) is True
