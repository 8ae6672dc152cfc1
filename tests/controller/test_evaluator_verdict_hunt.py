"""A command scorer's verdict is its last stdout line as the scorer printed it: lines end at "\\n".
A JSON verdict printed with ``ensure_ascii=False`` holds U+2028 or U+0085 raw (say, in a detail that
quotes the agent's text), which ``str.splitlines`` took for line ends: the honest verdict became
"not JSON", reward 0 with ``scorer_failed``. The controls: the same verdict ASCII-escaped, and a last
line that really is not a verdict. And a ``python`` scoring function's NumPy scalar reward is the
number it holds (it failed every evaluation as "not a finite number")."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from harnessrl.controller.evaluators import EvaluationInput, EvaluatorError, build_evaluator
from harnessrl.controller.evaluators.command import EvaluatorSandbox


def score(tmp_path: Path, code: str, reward_from: str = "json"):
    evaluator = build_evaluator(
        {"type": "command", "command": [sys.executable, "-c", code], "reward_from": reward_from,
         "env": {"PYTHONIOENCODING": "utf-8"}},
        sandbox=EvaluatorSandbox("none"),
    )  # fmt: skip
    return asyncio.run(evaluator.evaluate(EvaluationInput(task={"prompt": "p"}, workspace=tmp_path)))


@pytest.mark.parametrize("separator", ["\\u2028", "\\u2029", "\\x85", "\\x1c"])
@pytest.mark.parametrize("ensure_ascii", [False, True])
def test_a_json_verdict_holding_unicode_line_separators_is_read_whole(tmp_path, separator, ensure_ascii):
    code = (
        "import json; print('collecting tests'); "
        f"print(json.dumps({{'reward': 1.0, 'detail': 'wrote: a{separator}b'}}, ensure_ascii={ensure_ascii}))"
    )
    result = score(tmp_path, code)
    assert result.reward == 1.0 and result.flags == ()
    assert result.details["output"]["detail"].startswith("wrote: a")


def test_a_float_verdict_after_such_a_line_is_read(tmp_path):
    result = score(tmp_path, "print('note: a\\u2028b'); print('0.25')", reward_from="stdout_float")
    assert result.reward == 0.25


def test_a_last_line_that_is_not_a_verdict_is_still_the_policys_zero(tmp_path):
    code = "import json; print(json.dumps({'reward': 1.0})); print('trailing text')"
    result = score(tmp_path, code)
    assert result.reward == 0.0 and result.flags == ("scorer_failed",)


# Scoring functions as users write them with NumPy: each returned a NumPy scalar, which failed every
# evaluation ("not a finite number": an infrastructure failure, retried, the task never trained).
def hits_int64(inp, **_):
    import numpy as np

    return np.sum(np.array([1, 0, 1]) == np.array([1, 1, 1]))  # np.int64(2)


def all_equal_bool(inp, **_):
    import numpy as np

    return (np.array([1, 2]) == np.array([1, 2])).all()  # np.True_


def mean_float32(inp, **_):
    import numpy as np

    return {"reward": np.float32(0.5), "n": 2}


def not_a_number(inp, **_):
    import numpy as np

    return np.float64("nan")


@pytest.mark.parametrize(
    ("function", "reward"), [("hits_int64", 2.0), ("all_equal_bool", 1.0), ("mean_float32", 0.5)]
)
def test_a_scoring_function_returning_a_numpy_scalar_gives_its_number(tmp_path, function, reward):
    evaluator = build_evaluator({"type": "python", "function": f"{__name__}:{function}"})
    result = asyncio.run(evaluator.evaluate(EvaluationInput(task={"prompt": "p"}, workspace=tmp_path)))
    assert result.reward == reward and type(result.reward) is float


def test_a_numpy_nan_is_still_no_reward(tmp_path):
    evaluator = build_evaluator({"type": "python", "function": f"{__name__}:not_a_number"})
    with pytest.raises(EvaluatorError, match="not a finite number"):
        asyncio.run(evaluator.evaluate(EvaluationInput(task={"prompt": "p"}, workspace=tmp_path)))
