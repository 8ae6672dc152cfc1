"""Hidden data on a command scorer's command line reaches the code it scores.

``/proc/<pid>/cmdline`` is readable to every process in the scorer's sandbox, the code under test
run through ``run_scored`` (Landlock, the scorer non-dumpable) included: a scorer given the gold
answer as an argument (``["python3", "check.py", "{task[hidden.answer]}"]``) paid 1.0 to code that
printed the answer it read there. Such a command is refused for the task, naming the argument, before
any rollout starts (``check_task``); the environment (``evaluator.env``) is the way to pass a value,
and a hidden *path* (``{task[hidden.tests]}``) is copied in and named by its copy. The end-to-end
control runs the same attack against a scorer that takes the answer from its environment."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from harnessrl.controller.evaluators import EvaluationInput, build_evaluator, parse_evaluator_config
from harnessrl.controller.evaluators.command import EvaluatorSandbox
from harnessrl.errors import ConfigError
from harnessrl.sandbox.bwrap import sandbox_problem

TASK = {"prompt": "What is the taxicab number?", "hidden": {"answer": "1729", "tests": "/data/tests/t1"}}


@pytest.mark.parametrize(
    ("command", "where"),
    [
        (["python3", "check.py", "{task[hidden.answer]}"], r"evaluator\.command\[2\]"),
        (["python3", "check.py", "--gold={task[hidden.answer]}"], r"evaluator\.command\[2\]"),
        (["bash", "-c", "python3 check.py '{task[hidden.answer]}'"], r"evaluator\.command\[2\]"),
    ],
)
def test_a_hidden_value_on_the_scorers_command_line_is_refused(command, where):
    config = parse_evaluator_config({"type": "command", "command": command, "reward_from": "json"})
    with pytest.raises(
        ConfigError, match=rf"{where}: .*hidden data on the scorer's command line.*evaluator\.env"
    ):
        config.check_task(TASK)


@pytest.mark.parametrize(
    "section",
    [
        {"command": ["python3", "-I", "check.py", "--hidden", "{task[hidden.tests]}"]},  # a path: copied in
        {"command": ["python3", "-I", "check.py"], "env": {"GOLD": "{task[hidden.answer]}"}},
        {"command": ["python3", "-I", "check.py", "{prompt}"]},  # the harness saw it
    ],
)
def test_hidden_paths_and_values_in_the_environment_are_accepted(section):
    parse_evaluator_config({"type": "command", "reward_from": "json", **section}).check_task(TASK)


CHECK = """
import json, os, sys
from pathlib import Path
from harnessrl.sandbox.scored import run_scored
gold = os.environ["GOLD"]
run = run_scored([sys.executable, "-I", "solution.py"], cwd=Path(os.environ["HARNESSRL_WORKSPACE"]),
                 env={"PATH": "/usr/bin:/bin"}, timeout_s=60)
lines = run.output.decode(errors="replace").split()
print(json.dumps({"reward": 1.0 if lines and lines[-1] == gold else 0.0, "isolation": run.isolation}))
"""

# The code under test: reads every command line it can see and prints the scorer's last argument.
STEAL = """
import os
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")[:-1]
        except OSError:
            continue
        if args and args[-1].isdigit():
            print(args[-1].decode())
"""


needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
)


def _score(tmp_path: Path, solution: str, *, gold_in: str) -> float:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    check = CHECK if gold_in == "env" else CHECK.replace('os.environ["GOLD"]', "sys.argv[1]")
    (hidden / "check.py").write_text(check)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "solution.py").write_text(solution)
    task = {"prompt": "p", "hidden": {"answer": "1729", "check": str(hidden / "check.py")}}
    config = {"type": "command", "command": ["python3", "-I", "{task[hidden.check]}"], "reward_from": "json"}
    if gold_in == "env":
        config["env"] = {"GOLD": "{task[hidden.answer]}"}
        parse_evaluator_config(config).check_task(task)
    else:  # what check_task refuses, run anyway: the attack's control
        config["command"] = [*config["command"], "{task[hidden.answer]}"]
    evaluator = build_evaluator(config, sandbox=EvaluatorSandbox("bwrap"))
    return asyncio.run(evaluator.evaluate(EvaluationInput(task=task, workspace=workspace))).reward


@needs_sandbox
@pytest.mark.parametrize(("solution", "reward"), [(STEAL, 0.0), ("print(1729)", 1.0), ("print(1)", 0.0)])
def test_the_scored_code_cannot_read_a_gold_answer_passed_in_the_environment(
    tmp_path: Path, solution, reward
):
    assert _score(tmp_path, solution, gold_in="env") == reward


@needs_sandbox
def test_the_attack_reads_a_gold_answer_on_the_command_line_which_is_why_it_is_refused(tmp_path: Path):
    assert _score(tmp_path, STEAL, gold_in="argv") == 1.0
