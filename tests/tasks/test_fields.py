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


def test_search_r1_and_verl_rows_loaded_as_plain_jsonl_are_refused(tmp_path):
    """A Search-R1 / FlashRAG file (``golden_answers``) or verl's processed rows
    (``reward_model.ground_truth``) loaded as ``type = "jsonl"`` put the answers in what the harness
    sees (``HARNESSRL_TASK``, task.json): the agent could read them instead of searching."""
    import json

    from harnessrl.controller.harness import harness_view
    from harnessrl.tasks import load_tasks
    from harnessrl.tasks.search import load_searchqa

    rows = [
        ({"id": "nq-1", "question": "who?", "golden_answers": ["Arlen Voss"]}, "golden_answers"),
        (
            {"id": "v-1", "question": "who?", "reward_model": {"ground_truth": {"target": ["Keth"]}}},
            "reward_model",
        ),
        ({"id": "g-1", "question": "who?", "ground_truth": "Keth"}, "ground_truth"),
    ]
    for row, name in rows:
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(row) + "\n")
        with pytest.raises(ConfigError, match=rf"{name}\.jsonl:1: task field '{name}' is evaluator-only"):
            load_tasks(path)
    # Control: the searchqa source reads the same files, its answers under hidden, out of the view.
    for _, name in rows[:2]:
        [task] = load_searchqa(tmp_path / f"{name}.jsonl", split="train")
        assert task.data["hidden"]["answers"] and "hidden" not in harness_view(task.data)
        check_visible(task.data, where="here")
