"""Task fields: dotted paths, and the rule that evaluator-only data lives under ``hidden``."""

from __future__ import annotations

import pytest

from harnessrl.errors import ConfigError
from harnessrl.tasks.fields import EVALUATOR_ONLY, check_visible, get_field, is_hidden_path


def test_get_field_follows_dots():
    task = {"prompt": "p", "hidden": {"answer": "4", "meta": {"n": 2}}, "n": [1]}
    assert get_field(task, "prompt") == "p" and get_field(task, "n") == [1]
    assert get_field(task, "hidden.answer") == "4" and get_field(task, "hidden.meta.n") == 2
    for missing in ("nope", "hidden.nope", "prompt.x", "hidden.answer.x"):
        with pytest.raises(KeyError):
            get_field(task, missing)


def test_is_hidden_path():
    assert is_hidden_path("hidden") and is_hidden_path("hidden.answer")
    assert not is_hidden_path("answer") and not is_hidden_path("hidden_tests")


@pytest.mark.parametrize("name", sorted(EVALUATOR_ONLY))
def test_evaluator_only_names_at_top_level_are_refused(name):
    with pytest.raises(ConfigError, match=rf"^here: task field '{name}' is evaluator-only.*'hidden\.{name}'"):
        check_visible({"prompt": "p", name: "x"}, where="here")
    check_visible({"prompt": "p", "hidden": {name: "x"}}, where="here")


def test_hidden_must_be_an_object():
    with pytest.raises(ConfigError, match="'hidden' must be a JSON object"):
        check_visible({"hidden": ["4"]}, where="here")
    check_visible({"prompt": "p", "answer_format": "a number"}, where="here")  # only the exact names
