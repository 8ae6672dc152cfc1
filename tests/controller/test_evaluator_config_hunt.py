"""A command evaluator's config that no evaluation could run is refused when it is built, naming the
field: an environment variable name that is empty or holds ``=``, a NUL byte in a name, value or
argument (each failed every evaluation as "the scorer did not start", an infrastructure failure, or
as a ``ConfigError`` mid-run), and a timeout of ``inf`` (a scorer that never exits held its rollout
forever). The controls build and run a real scorer with the same shapes, well formed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from harnessrl.controller.evaluators import EvaluationInput, build_evaluator
from harnessrl.controller.evaluators.command import EvaluatorSandbox
from harnessrl.errors import ConfigError

SCORER = [sys.executable, "-c", "import json, os; print(json.dumps({'reward': float(os.environ['R'])}))"]


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"env": {"R=1": "1"}}, "evaluator.command.env"),
        ({"env": {"": "1"}}, "evaluator.command.env"),
        ({"env": {"R": "1\0--bind"}}, "evaluator.command.env"),
        ({"command": [*SCORER, "a\0b"]}, "evaluator.command.command"),
        ({"timeout_s": float("inf")}, "evaluator.command.timeout_s"),
    ],
)
def test_a_command_evaluator_no_evaluation_could_run_is_refused_naming_the_field(section, field):
    with pytest.raises(ConfigError, match=field):
        build_evaluator(
            {"type": "command", "command": SCORER, "reward_from": "json", "env": {"R": "1"}, **section}
        )


def test_a_python_evaluator_without_a_finite_timeout_is_refused():
    with pytest.raises(ConfigError, match="evaluator.python.timeout_s"):
        build_evaluator({"type": "python", "function": "os:getcwd", "timeout_s": float("inf")})


def test_a_well_formed_environment_reaches_the_scorer(tmp_path: Path):
    evaluator = build_evaluator(
        {"type": "command", "command": SCORER, "reward_from": "json", "env": {"R": "0.5"}, "timeout_s": 1e6},
        sandbox=EvaluatorSandbox("none"),
    )
    result = asyncio.run(evaluator.evaluate(EvaluationInput(task={"prompt": "p"}, workspace=tmp_path)))
    assert result.reward == 0.5 and result.flags == ()
