"""A command evaluator that runs harnessrl's pytest scorer (``python -I -m harnessrl.tasks.pytest_scoring``,
or ``harnessrl.tasks.coding evaluate``) reads the task file itself, so ``check_task`` could not see
what it needs: a task without ``hidden.FAIL_TO_PASS`` (or with it in ``withheld_fields``, or in a
shape the scorer refuses) made the scorer exit 2 at every attempt, which the controller records as
the policy's flagged 0 (``scorer_failed``): ``harnessrl rollout`` exited 0 and a training run trained
on it. Now it is one ``ConfigError`` naming the field before anything starts (exit 2, no run folder).
Each case has its control: the same check passes a task that has its test lists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.evaluators import parse_evaluator_config
from harnessrl.controller.harness import check_task, check_tasks
from harnessrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
HARNESS = HarnessSpec(command=[sys.executable, "-c", "pass", "{prompt}"], sandbox="none")
PYTEST_SCORER = ["python3", "-I", "-m", "harnessrl.tasks.pytest_scoring", "--files", "/x", "--timeout", "60"]
GOOD = {"prompt": "fix it", "hidden": {"tests": "/x", "FAIL_TO_PASS": ["tests/test_a.py::test_a"]}}


def _section(name: str) -> dict:
    return tomllib.loads((ROOT / "examples" / name / "train.toml").read_text())["evaluator"]


# (evaluator section, a task it cannot score, what the error names)
CASES = {
    "swe example, no FAIL_TO_PASS": (
        _section("swe"),
        {"prompt": "fix it", "hidden": {"tests": "/x", "PASS_TO_PASS": ["tests/test_a.py::test_b"]}},
        "hidden.FAIL_TO_PASS",
    ),
    "coding example, no FAIL_TO_PASS": (
        _section("coding"),
        {"prompt": "fix it", "hidden": {"tests": "/x"}},
        "hidden.FAIL_TO_PASS",
    ),
    "FAIL_TO_PASS withheld from the scorer": (
        {"type": "command", "command": PYTEST_SCORER, "withheld_fields": ["patch", "FAIL_TO_PASS"]},
        GOOD,
        "hidden.FAIL_TO_PASS",
    ),
    "FAIL_TO_PASS not a list of test ids": (
        {"type": "command", "command": PYTEST_SCORER},
        {"prompt": "fix it", "hidden": {"FAIL_TO_PASS": {"tests/test_a.py": "test_a"}}},
        "hidden.FAIL_TO_PASS must be a list",
    ),
    "python flags written together (-Im)": (
        {"type": "command", "command": ["python", "-Im", "harnessrl.tasks.pytest_scoring", "{task_file}"]},
        {"prompt": "fix it", "hidden": {}},
        "hidden.FAIL_TO_PASS",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_task_without_the_pytest_scorers_test_lists_is_named_before_anything_starts(case):
    section, bad, named = CASES[case]
    evaluator = parse_evaluator_config(section)
    # The control: the same scorer passes a task whose test lists it sees (the default withheld_fields).
    control = parse_evaluator_config({k: v for k, v in section.items() if k != "withheld_fields"})
    check_tasks(HARNESS, [("t0", GOOD)], control)
    with pytest.raises(ConfigError) as caught:
        check_tasks(HARNESS, [("t3", bad)], evaluator)
    message = str(caught.value)
    assert message.startswith("task 't3': the evaluator cannot score it: evaluator.command"), message
    assert named in message, message
    with pytest.raises(ConfigError, match="the evaluator cannot score the task"):
        check_task(HARNESS, bad, evaluator)


@pytest.mark.parametrize(
    "command",
    [
        ["python3", "./check.py"],  # another scorer: what it reads of the task is not known
        ["python3", "-I", "-m", "harnessrl.tasks.pytest_scoring", "/data/task.json"],  # its own task file
        ["python3", "-m", "harnessrl.tasks.coding", "build", "--out", "/x"],  # not the scoring subcommand
        ["python3", "-c", "-m harnessrl.tasks.pytest_scoring"],  # code, not a module
        ["bash", "-m", "harnessrl.tasks.pytest_scoring"],  # not python
    ],
)
def test_other_commands_are_not_held_to_the_pytest_scorers_needs(command):
    check_tasks(
        HARNESS,
        [("t0", {"prompt": "q", "hidden": {}})],
        parse_evaluator_config({"type": "command", "command": command}),
    )


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


@needs_root
def test_harnessrl_rollout_refuses_such_a_task_with_exit_2_and_scores_one_with_its_lists(tmp_path):
    """Through the CLI, with the real scorer: before, exit 0 with reward 0 and ``scorer_failed``."""
    files = tmp_path / "files" / "tests"
    files.mkdir(parents=True)
    (files / "test_a.py").write_text("def test_a():\n    assert True\n")
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    scorer = [
        sys.executable,
        "-I",
        "-m",
        "harnessrl.tasks.pytest_scoring",
        "--files",
        str(tmp_path / "files"),
    ]
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "replies.json"}"\n\n'
        f'[harness]\npreset = "python"\ncommand = ["-c", "pass"]\ntimeout_s = 600\n\n'
        f'[evaluator]\ntype = "command"\nreward_from = "json"\ncommand = {json.dumps(scorer)}\n\n'
        "[controller]\nmax_infra_retries = 0\n"
    )

    def rollout(hidden: dict, run: Path) -> subprocess.CompletedProcess:
        task = json.dumps({"prompt": "fix it", "hidden": hidden})
        argv = [sys.executable, "-m", "harnessrl", "rollout", "--config", str(config), "--task", task]
        return subprocess.run([*argv, "--run-dir", str(run)], capture_output=True, text=True, timeout=600)

    refused = rollout({"PASS_TO_PASS": ["tests/test_a.py::test_a"]}, tmp_path / "refused")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "hidden.FAIL_TO_PASS" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "refused").exists()  # nothing half-created
    scored = rollout({"FAIL_TO_PASS": ["tests/test_a.py::test_a"]}, tmp_path / "scored")  # the control
    assert scored.returncode == 0, scored.stderr[-2000:]
    summary = json.loads(scored.stdout.strip().splitlines()[-1])
    assert (summary["reward"], summary["flags"]) == (1.0, []), summary
