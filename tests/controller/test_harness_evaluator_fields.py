"""``check_tasks`` with an evaluator: a task that lacks a field its evaluator needs to score it (no
``hidden.answer`` for ``exact_match``, a ``{task[hidden.x]}`` a command scorer names) is a
``ConfigError`` naming the task and the field before anything starts. It used to be found only when
each attempt was scored: an infrastructure failure, retried, the run going on with the task never
trained. Each case has its control: the same check passes a task that has the field."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.evaluators import parse_evaluator_config
from harnessrl.controller.harness import check_task, check_tasks
from harnessrl.errors import ConfigError

HARNESS = HarnessSpec(command=[sys.executable, "-c", "pass", "{prompt}"], sandbox="none")

# (evaluator section, a task it can score, the same task without what it needs, the field named)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]] = {
    "exact_match": (
        {"type": "exact_match"},
        {"prompt": "2+2?", "hidden": {"answer": "4"}},
        {"prompt": "2+2?"},
        "'hidden.answer'",
    ),
    "exact_match, a null answer": (
        {"type": "exact_match", "field": "hidden.gold"},
        {"prompt": "2+2?", "hidden": {"gold": ["4", "four"]}},
        {"prompt": "2+2?", "hidden": {"gold": None}},  # would match an answer "None"
        "'hidden.gold'",
    ),
    "command's argv": (
        {"type": "command", "command": ["true", "{task[hidden.tests]}", "{workspace}"]},
        {"prompt": "fix it", "hidden": {"tests": "/x"}},
        {"prompt": "fix it", "hidden": {}},
        "evaluator.command[1]",
    ),
    "command's env": (
        {"type": "command", "command": ["true"], "env": {"LEVEL": "{task[meta.level]}"}},
        {"prompt": "fix it", "meta": {"level": 3}},
        {"prompt": "fix it", "meta": {}},
        "evaluator.env.LEVEL",
    ),
    "reasoning_gym's entry": (
        {"type": "reasoning_gym"},
        {"prompt": "q", "dataset": "chain_sum", "hidden": {"seed": 1, "index": 0}},
        {"prompt": "q", "dataset": "chain_sum", "hidden": {"seed": 1}},
        "'hidden.answer'",
    ),
    "score_search (declared by the function)": (
        {"type": "python", "function": "harnessrl.tasks.search:score_search"},
        {"prompt": "who?", "hidden": {"answers": ["Arlen Voss"]}},
        {"prompt": "who?", "hidden": {"answer": "Arlen Voss"}},
        "hidden.answers",
    ),
    "replay_reward (declared by the function)": (
        {"type": "python", "function": "harnessrl.tasks.scienceworld:replay_reward"},
        {"prompt": "boil water", "task_name": "boil", "variation": 3},
        {"prompt": "boil water", "task_name": "boil"},
        "'variation'",
    ),
    "reasoning_gym's dataset": (
        {"type": "reasoning_gym"},
        {"prompt": "q", "hidden": {"answer": "3", "metadata": {"source_dataset": "chain_sum"}}},
        {"prompt": "q", "hidden": {"answer": "3"}},
        "'dataset'",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_task_without_a_field_its_evaluator_needs_is_named_before_anything_starts(case):
    section, good, bad, field = CASES[case]
    evaluator = parse_evaluator_config(section)
    check_tasks(HARNESS, [("t0", good)], evaluator)  # the control: a task with the field passes
    check_task(HARNESS, good, evaluator)
    with pytest.raises(ConfigError) as caught:
        check_tasks(HARNESS, [("t0", good), ("t7", bad)], evaluator)
    message = str(caught.value)
    assert message.startswith("task 't7': the evaluator cannot score it: "), message
    assert field in message, message
    with pytest.raises(ConfigError, match="the evaluator cannot score the task"):
        check_task(HARNESS, bad, evaluator)


def test_the_evaluators_dataset_stands_in_for_the_tasks():
    """``evaluator.dataset`` is used when the task has none: such tasks are fine."""
    evaluator = parse_evaluator_config({"type": "reasoning_gym", "dataset": "chain_sum"})
    check_tasks(HARNESS, [("t0", {"prompt": "q", "hidden": {"answer": "3"}})], evaluator)


def test_a_python_function_is_checked_only_when_it_declares_what_it_needs(tmp_path, monkeypatch):
    """A user's function cannot be known from its name: unchecked, unless it carries ``check_task``
    (called with the task and the evaluator's ``kwargs``)."""
    (tmp_path / "hrl_declared_scorer.py").write_text(
        "from harnessrl.errors import ConfigError\n"
        "def score(inp, **kwargs):\n    return 0.0\n"
        "def check(task, *, key):\n"
        "    if key not in task.get('hidden', {}):\n"
        "        raise ConfigError(f'the task has no hidden.{key}')\n"
        "score.check_task = check\n"
        "def plain(inp):\n    return 0.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    declared = parse_evaluator_config(
        {"type": "python", "function": "hrl_declared_scorer:score", "kwargs": {"key": "answers"}}
    )
    plain = parse_evaluator_config({"type": "python", "function": "hrl_declared_scorer:plain"})
    bare = {"prompt": "q"}
    check_tasks(HARNESS, [("t0", {"prompt": "q", "hidden": {"answers": ["x"]}})], declared)
    check_tasks(HARNESS, [("t0", bare)], plain)  # nothing declared: nothing checked
    with pytest.raises(ConfigError, match=r"task 't0': the evaluator cannot score it: .*hidden\.answers"):
        check_tasks(HARNESS, [("t0", bare)], declared)
    # One that does not import is left to validate(), which names evaluator.function.
    missing = parse_evaluator_config({"type": "python", "function": "hrl_no_such_module:score"})
    check_tasks(HARNESS, [("t0", bare)], missing)


def test_without_an_evaluator_only_the_harness_is_checked():
    """Callers that pass no evaluator (the API's tasks) get the harness's check alone, as before."""
    check_tasks(HARNESS, [("t0", {"prompt": "2+2?"})])


def test_score_search_names_a_mistyped_metric_before_anything_starts():
    """Its kwargs were read only when the first rollout was scored (an infrastructure failure)."""
    task = {"prompt": "who?", "hidden": {"answers": ["Arlen Voss"]}}
    section = {"type": "python", "function": "harnessrl.tasks.search:score_search"}
    check_tasks(HARNESS, [("t0", task)], parse_evaluator_config({**section, "kwargs": {"metric": "f1"}}))
    with pytest.raises(ConfigError, match=r"evaluator\.kwargs\.metric must be one of"):
        check_tasks(HARNESS, [("t0", task)], parse_evaluator_config({**section, "kwargs": {"metric": "EM"}}))
