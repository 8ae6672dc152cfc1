"""Answer extraction and comparison shared by the reasoning_gym and exact_match evaluators."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harnessrl.tasks.answers import answers_match, extract_answer, strip_think

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


def test_strip_think_on_a_megabyte_of_unclosed_blocks():
    """One pass: the regex took time quadratic in the unclosed ``<think>`` (this input: ~11 minutes
    of the controller's event loop, extrapolated from 10 s at 128 KiB)."""
    text = "<think>" * ((1 << 20) // 7) + "Answer: 4"
    assert strip_think(text) == text
    assert strip_think("a<think>x</think>b<think>y") == "ab<think>y"
