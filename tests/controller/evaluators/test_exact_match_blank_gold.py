"""``exact_match`` against a blank gold: ``""`` (or ``" "``, ``"."``) equalled every reply that says
nothing, so an empty reply (``""``, ``"."``, ``"**"``) earned 1 on a task whose gold, or one of its
alternatives, was blank. Now a blank gold matches nothing, and ``check_task`` refuses a task whose
gold has no answer that is not blank (or a null one, compared as the text "None") before anything
starts. Each attack has its control: the right answer still earns 1, a wrong one 0."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.evaluators import build_evaluator, parse_evaluator_config
from harnessrl.controller.evaluators.types import EvaluationInput
from harnessrl.controller.harness import check_tasks
from harnessrl.errors import ConfigError

HARNESS = HarnessSpec(command=[sys.executable, "-c", "pass", "{prompt}"], sandbox="none")
EMPTY_REPLIES = ["", ".", "**", "$\\boxed{}$", "`.`"]


def _reward(gold, reply: str, tmp_path: Path, **section) -> float:
    evaluator = build_evaluator(
        parse_evaluator_config({"type": "exact_match", "source": "stdout", **section})
    )
    task = {"prompt": "capital of France?", "hidden": {"answer": gold}}
    return asyncio.run(
        evaluator.evaluate(EvaluationInput(task=task, workspace=tmp_path, stdout=reply))
    ).reward


@pytest.mark.parametrize("reply", EMPTY_REPLIES)
@pytest.mark.parametrize("normalize", [True, False])
def test_an_empty_reply_earns_nothing_from_a_blank_alternative(reply, normalize, tmp_path):
    golds = ["", "Paris"]
    assert _reward(golds, reply, tmp_path, normalize=normalize) == 0.0
    assert _reward(golds, "Paris", tmp_path, normalize=normalize) == 1.0  # the control: the answer pays
    assert _reward(golds, "Lyon", tmp_path, normalize=normalize) == 0.0


@pytest.mark.parametrize("gold", ["", " ", ".", [], ["", " "], [None, "Paris"]])
def test_a_task_whose_gold_matches_nothing_is_refused_before_anything_starts(gold):
    evaluator = parse_evaluator_config({"type": "exact_match"})
    check_tasks(HARNESS, [("t0", {"prompt": "q", "hidden": {"answer": ["", "Paris"]}})], evaluator)  # control
    with pytest.raises(
        ConfigError, match=r"task 't1': the evaluator cannot score it: evaluator\.field: .*hidden\.answer"
    ):
        check_tasks(HARNESS, [("t1", {"prompt": "q", "hidden": {"answer": gold}})], evaluator)
