"""A command scorer with no valid verdict earns the bottom of a negative ``reward_range``, not 0.

With ``reward_range = [-1, 1]`` a scorer gives -1 to code that fails its tests. The agent's code
runs inside the scorer, so it can also crash it, or make it print a reward out of range: each was
reward 0 with a flag, which paid the agent more for breaking the scorer than for failing honestly.
Now a failure earns ``min(0, low)``: -1 here, still 0 with the default range [0, 1]."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.evaluators.types import EvaluationInput, EvaluationResult

# The scorer sources the agent's solution, which sets R (its reward) or does something else.
SCORER = ["sh", "-c", '. ./solution.sh; echo "{\\"reward\\": $R}"']


def _score(tmp_path: Path, solution: str, reward_range: list[float]) -> EvaluationResult:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "solution.sh").write_text(solution + "\n")
    evaluator = build_evaluator(
        {"type": "command", "command": SCORER, "reward_from": "json", "reward_range": reward_range}
    )
    return asyncio.run(evaluator.evaluate(EvaluationInput(task={}, workspace=workspace)))


@pytest.mark.parametrize(
    ("solution", "flag"),
    [("exit 3", "scorer_failed"), ("R=5", "reward_out_of_range"), ("R=oops", "scorer_failed")],
)
def test_breaking_the_scorer_earns_no_more_than_failing_it(tmp_path, solution, flag):
    broken = _score(tmp_path, solution, [-1.0, 1.0])
    assert (broken.reward, broken.flags) == (-1.0, (flag,))


@pytest.mark.parametrize(("solution", "reward"), [("R=-1", -1.0), ("R=1", 1.0), ("R=0.5", 0.5)])
def test_controls_a_valid_verdict_is_the_reward(tmp_path, solution, reward):
    result = _score(tmp_path, solution, [-1.0, 1.0])
    assert (result.reward, result.flags) == (reward, ())


def test_control_with_the_default_range_a_failure_is_still_zero(tmp_path):
    result = _score(tmp_path, "exit 3", [0.0, 1.0])
    assert (result.reward, result.flags) == (0.0, ("scorer_failed",))
