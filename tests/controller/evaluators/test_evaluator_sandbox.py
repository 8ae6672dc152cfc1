"""The command evaluator's sandbox: the scorer sees only what scoring needs, within limits, and a
workspace built to hang or flood the copy ends the rollout instead. Each property is tried from
inside a real scorer; the controls run the same scorer with ``sandbox = "none"``."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from harnessrl.controller.evaluators import EvaluationInput, EvaluationResult, EvaluatorError, build_evaluator
from harnessrl.controller.evaluators.command import EvaluatorSandbox
from harnessrl.sandbox.bwrap import sandbox_problem

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
)

# A scorer that reports what it can reach: files by path, its mount table, environment and argv.
PROBE = r"""
import json, os, sys
targets = json.loads(sys.argv[1])
def readable(path):
    try:
        with open(path, "rb") as f:
            return f.read(200).decode(errors="replace")
    except OSError:
        try:
            return os.listdir(path)
        except OSError:
            return None
seen = {name: readable(path) for name, path in targets.items()}
mounts = open("/proc/self/mountinfo").read()
pid1 = open("/proc/1/cmdline", "rb").read().decode(errors="replace")
print(json.dumps({"reward": 0, "seen": seen, "pid1": pid1, "here": os.path.dirname(os.path.abspath(__file__)),
    "listing": sorted(os.listdir(os.path.dirname(os.path.abspath(__file__)))),
    "mounts": mounts, "environ": dict(os.environ), "argv": sys.argv}))
"""


def evaluate(config: dict, inp: EvaluationInput, mode: str = "bwrap") -> EvaluationResult:
    evaluator = build_evaluator(config, sandbox=EvaluatorSandbox(mode))
    return asyncio.run(evaluator.evaluate(inp))


@pytest.fixture
def task_files(tmp_path: Path) -> dict:
    """A task laid out as builders often do: hidden tests beside the gold patch and the original repo."""
    root = tmp_path / "taskset"
    hidden = root / "hidden" / "t1"
    hidden.mkdir(parents=True)
    (hidden / "probe.py").write_text(PROBE)
    (hidden / "expected.txt").write_text("what the tests expect")
    gold = root / "gold" / "t1"
    gold.mkdir(parents=True)
    (gold / "gold.patch").write_text("GOLD-PATCH")
    repo = root / "repos" / "t1"
    repo.mkdir(parents=True)
    (repo / "HISTORY").write_text("the fix is in the history")
    ws = tmp_path / "run" / "rollouts" / "r1" / "attempt-0" / "workspace"
    ws.mkdir(parents=True)
    task = {
        "prompt": "fix it",
        "hidden": {"tests": str(hidden), "repo_path": str(repo), "patch": "GOLD-PATCH-TEXT"},
    }
    targets = {
        "gold": str(gold / "gold.patch"),
        "repo": str(repo / "HISTORY"),
        "hidden_on_host": str(hidden / "expected.txt"),
        "taskset": str(root),
    }
    return {"root": root, "hidden": hidden, "ws": ws, "task": task, "targets": targets}


def probe_config(targets: dict) -> dict:
    return {
        "type": "command",
        "reward_from": "json",
        "command": [sys.executable, "{task[hidden.tests]}/probe.py", json.dumps(targets)],
    }


def test_the_scorer_sees_its_inputs_copied_and_nothing_else_of_the_task(task_files):
    inp = EvaluationInput(task=task_files["task"], workspace=task_files["ws"], rollout_id="r1")
    out = evaluate(probe_config(task_files["targets"]), inp).details["output"]
    # The folder the command named is there, copied, under a neutral path...
    assert out["here"].startswith("/run/harnessrl/inputs/") and out["listing"] == ["expected.txt", "probe.py"]
    # ...and nothing else of the task set: not the gold patch, the original repository or the folder.
    assert out["seen"] == {"gold": None, "repo": None, "hidden_on_host": None, "taskset": None}
    # No host path of the task set in its mount table, environment or command line.
    root = str(task_files["root"])
    assert root not in out["mounts"] and root not in json.dumps(out["environ"]) and root not in out["argv"]
    # The sandbox's pid 1 (a copy of bwrap) shows no bind of the evaluator's: its options came on a
    # descriptor, not its command line.
    options = out["pid1"].split("\x00--\x00", 1)[0].split("\x00")
    assert options[0].endswith("bwrap") and options[1:] == ["--args", options[2]] and len(options) == 3
    assert "GOLD-PATCH-TEXT" not in json.dumps(out)

    # Control: without the sandbox the same scorer reaches all of it.
    control = evaluate(probe_config(task_files["targets"]), inp, mode="none").details["output"]
    assert control["seen"]["gold"] == "GOLD-PATCH" and control["seen"]["repo"] == "the fix is in the history"


def test_the_scorers_task_file_withholds_the_solution_unless_told(task_files):
    script = "import json, os; print(json.dumps({'reward': 0, 'task': json.load(open(os.environ['HARNESSRL_TASK_FILE']))}))"
    inp = EvaluationInput(task=task_files["task"], workspace=task_files["ws"])
    config = {"type": "command", "reward_from": "json", "command": [sys.executable, "-c", script]}
    hidden = evaluate(config, inp).details["output"]["task"]["hidden"]
    assert set(hidden) == {"tests"}  # no patch, no repo_path
    told = evaluate({**config, "withheld_fields": ["repo_path"]}, inp).details["output"]["task"]["hidden"]
    assert told["patch"] == "GOLD-PATCH-TEXT" and "repo_path" not in told


def test_a_fifo_or_socket_in_the_workspace_does_not_hang_the_rollout(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "solution.py").write_text("x = 1\n")
    os.mkfifo(ws / "trap")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(ws / "sock"))
    try:
        config = {"type": "command", "command": ["sh", "-c", "test -f solution.py && test ! -e trap"]}
        result = evaluate(config, EvaluationInput(task={}, workspace=ws))
    finally:
        server.close()
    assert result.reward == 1.0 and result.flags == ("special_files_skipped",)
    assert sorted(result.details["workspace_copy"]["skipped"]) == ["sock", "trap"]


def test_a_sparse_file_is_not_multiplied_and_a_big_workspace_is_not_scored(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with (ws / "sparse").open("wb") as f:
        f.seek(1 << 40)  # 1 TiB apparent size
        f.write(b"x")
    script = "import os, sys; st = os.stat('sparse'); sys.exit(0 if st.st_blocks * 512 < 1 << 20 < st.st_size else 1)"
    config = {"type": "command", "command": [sys.executable, "-c", script]}
    result = evaluate(config, EvaluationInput(task={}, workspace=ws))
    assert result.reward == 1.0, result.details
    (ws / "big").write_bytes(os.urandom(3 << 20))
    capped = evaluate({**config, "max_workspace_mb": 2}, EvaluationInput(task={}, workspace=ws))
    assert capped.reward == 0.0 and capped.flags == ("workspace_too_large",)
    assert "exit_code" not in capped.details  # the scorer never ran


@pytest.mark.parametrize(
    ("script", "limits"),
    [
        ("x = bytearray(600 << 20); print('allocated')", {"memory_mb": 128}),
        (
            "import os\nfor _ in range(60):\n    if os.fork() == 0:\n        import time; time.sleep(30); os._exit(0)\nprint('forked')",
            {"max_processes": 20},
        ),
        ("open('/tmp/fill', 'wb').write(b'z' * (64 << 20)); print('written')", {"tmp_mb": 16}),
    ],
)
def test_the_scorer_runs_under_limits(tmp_path, script, limits):
    ws = tmp_path / "ws"
    ws.mkdir()
    config = {"type": "command", "command": [sys.executable, "-c", script], "timeout_s": 60}
    capped = evaluate({**config, "limits": limits}, EvaluationInput(task={}, workspace=ws))
    assert capped.reward == 0.0, capped.details
    # Control: with the default limits the same script gets through.
    assert evaluate(config, EvaluationInput(task={}, workspace=ws)).reward == 1.0


def test_a_scorer_whose_sandbox_cannot_start_is_an_infrastructure_failure(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.setenv("HARNESSRL_BWRAP", "/bin/false")  # a "bwrap" that fails before the scorer runs
    with pytest.raises(EvaluatorError, match="did not start"):
        evaluate({"type": "command", "command": ["true"]}, EvaluationInput(task={}, workspace=ws))
