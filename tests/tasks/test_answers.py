"""Answer extraction and comparison shared by the reasoning_gym and exact_match evaluators."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harnessrl.tasks.answers import answers_match, extract_answer

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
    ],
)
def test_answers_match(answer, gold, normalize, same):
    assert answers_match(answer, gold, normalize=normalize) is same


@given(st.text(max_size=200), st.sampled_from(["none", "last_line", "last_number"]))
def test_extract_never_crashes(text, fallback):
    result = extract_answer(text, ANSWER, fallback)
    assert result is None or isinstance(result, str)
