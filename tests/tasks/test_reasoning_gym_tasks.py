"""reasoning-gym task source: deterministic ids, the seed-overlap pitfall, scoring the stored entry."""

from __future__ import annotations

import json

import pytest

from harnessrl.errors import ConfigError
from harnessrl.tasks.reasoning_gym import (
    PROMPT_SUFFIX,
    check_disjoint,
    eval_seed,
    overlapping_questions,
    reasoning_gym_tasks,
    score_answer,
    task_id_for,
)


def test_tasks_are_deterministic_and_complete():
    a = reasoning_gym_tasks("basic_arithmetic", 8, seed=11)
    b = reasoning_gym_tasks("basic_arithmetic", 8, seed=11)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert len({t.task_id for t in a}) == 8 and a[3].task_id == task_id_for("basic_arithmetic", 11, 3)
    data = a[0].data
    assert data["prompt"] == data["question"] + PROMPT_SUFFIX and "Answer: X" in data["prompt"]
    # The harness sees the question; the answer and what regenerates it are for the evaluator only.
    assert set(data) == {"prompt", "question", "dataset", "hidden"}
    assert set(data["hidden"]) == {"answer", "config", "seed", "size", "index", "metadata"}
    assert json.loads(json.dumps(data)) == data  # storable as-is
    assert a[0].split == "train"
    assert reasoning_gym_tasks("basic_arithmetic", 1, seed=11, split="eval")[0].split == "eval"


def test_config_changes_the_questions_and_the_id():
    config = {"min_terms": 3, "max_terms": 3}
    tasks = reasoning_gym_tasks("chain_sum", 5, seed=1, config=config)
    assert all(t.data["question"].count("+") + t.data["question"].count("-") >= 2 for t in tasks)
    assert tasks[0].data["hidden"]["config"] == config
    assert tasks[0].task_id != reasoning_gym_tasks("chain_sum", 1, seed=1)[0].task_id


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset": "no_such_dataset", "size": 1, "seed": 0}, "unknown dataset"),
        ({"dataset": "chain_sum", "size": 0, "seed": 0}, "size"),
        ({"dataset": "chain_sum", "size": 1, "seed": 0, "config": {"seed": 3}}, "seed and size"),
        ({"dataset": "chain_sum", "size": 1, "seed": 0, "config": {"no_such_option": 1}}, "bad config"),
        ({"dataset": "puzzle24", "size": 1, "seed": 0}, "'puzzle24' is refused"),
        ({"dataset": "countdown", "size": 1, "seed": 0}, "'countdown' is refused"),
        ({"dataset": "coin_flip", "size": 1, "seed": 0}, "'coin_flip' is refused"),
        ({"dataset": "game_of_life_halting", "size": 1, "seed": 0}, "'game_of_life_halting' is refused"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        reasoning_gym_tasks(**kwargs)


def test_nearby_seeds_overlap_and_check_disjoint_catches_it():
    # Item i comes from Random(seed + i): train [2000, 2040) contains eval [2010, 2020) entirely.
    train = reasoning_gym_tasks("basic_arithmetic", 40, seed=2000)
    evaluation = reasoning_gym_tasks("basic_arithmetic", 10, seed=2010, split="eval")
    assert len(overlapping_questions(train, evaluation)) == 10
    with pytest.raises(ConfigError, match="10 of 10 evaluation questions"):
        check_disjoint(train, evaluation)
    far = reasoning_gym_tasks("basic_arithmetic", 10, seed=eval_seed(2000, 40, 10), split="eval")
    check_disjoint(train, far)


def test_score_answer_regenerates_the_entry():
    task = reasoning_gym_tasks("chain_sum", 3, seed=5)[2].data
    assert score_answer(task, task["hidden"]["answer"]) == 1.0
    assert score_answer(task, "not a number") == 0.0
    assert score_answer(task, None) == 0.0


def test_score_answer_falls_back_to_the_stored_entry():
    task = dict(reasoning_gym_tasks("basic_arithmetic", 1, seed=5)[0].data)
    task["question"] = "What is 100 + 1?"  # e.g. another reasoning-gym version
    task["hidden"] = {**task["hidden"], "answer": "101"}
    assert score_answer(task, "101") == 1.0
    handwritten = {"dataset": "basic_arithmetic", "question": "Calculate 2 + 2.", "hidden": {"answer": "4"}}
    assert score_answer(handwritten, "4") == 1.0
    assert score_answer(handwritten, "44") == 0.5  # reasoning-gym's default partial credit
    with pytest.raises(ValueError, match="dataset"):
        score_answer({"question": "q", "hidden": {"answer": "4"}}, "4")
    with pytest.raises(ValueError, match="hidden.answer"):  # a top-level answer is not read
        score_answer({"dataset": "basic_arithmetic", "question": "Calculate 2 + 2.", "answer": "4"}, "4")
