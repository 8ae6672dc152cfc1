"""Red team: what a search agent leaves as ``answer.txt`` never turns its 0 into "not counted".

The hunter's repro, end to end through ``harnessrl rollout`` (the scripted engine, a shell harness in
the sandbox, ``score_search`` on the workspace copy): a harness that made ``answer.txt`` a directory
got outcome ``infra_failure`` after its retries (``read_answer_file`` raised, the python evaluator
reported the scorer's failure, the controller requeued the rollout and left it out of the baseline).
Now a directory or a FIFO there is no answer: outcome ``success``, reward 0, one attempt. Control: the
same harness writing the gold answer earns 1, so the scorer did read the workspace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.sandbox.bwrap import sandbox_problem

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's cgroups need root here"),
    pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"),
]

CONFIG = """\
[engine]
model = "scripted:script.json"

[harness]
command = ["./agent.sh"]
timeout_s = 60

[evaluator]
type = "python"
function = "harnessrl.tasks.search:score_search"
kwargs = { source = "file", metric = "em" }

[controller]
max_infra_retries = 1
"""
TASK = {"prompt": "Which river flows through Tarsk?", "hidden": {"answers": ["Keth"]}}


def rollout(tmp_path: Path, script: str) -> dict:
    (tmp_path / "rollout.toml").write_text(CONFIG)
    (tmp_path / "script.json").write_text(json.dumps({"turns": ["unused"]}))
    agent = tmp_path / "agent.sh"
    agent.write_text(f"#!/bin/sh\n{script}\n")
    agent.chmod(0o755)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harnessrl",
            "rollout",
            "--config",
            "rollout.toml",
            "--task",
            json.dumps(TASK),
            "--run-dir",
            "run",
        ],  # fmt: skip
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("script", ["mkdir answer.txt", "mkfifo answer.txt", "mkdir -p answer.txt/Keth"])
def test_an_answer_txt_that_is_no_file_is_a_counted_zero(tmp_path: Path, script: str) -> None:
    result = rollout(tmp_path, script)
    assert (result["outcome"], result["reward"], result["attempts"]) == ("success", 0.0, 1), result


def test_control_the_gold_answer_in_answer_txt_earns_one(tmp_path: Path) -> None:
    result = rollout(tmp_path, "echo Keth > answer.txt")
    assert (result["outcome"], result["reward"], result["attempts"]) == ("success", 1.0, 1), result
