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


# The scorer runs the agent's code (solution.py) as a real scorer does, through run_scored, and passes
# on what that code printed. That code is the attacker: it tries to fill the host's disk through
# the workspace copy, which lies on the host.
DISK_SCORER = r"""
import json, os, sys
from pathlib import Path
from harnessrl.sandbox.scored import run_scored
run = run_scored([sys.executable, "solution.py"], cwd=Path.cwd(), env={"PATH": os.environ["PATH"]}, timeout_s=300)
print(json.dumps({"reward": 1.0 if run.exit_code == 0 else 0.0, "said": run.output.decode()[-300:]}))
"""
ONE_BIG_FILE = r"""
written = 0
try:
    with open("big", "wb") as f:
        for _ in range(64):
            f.write(b"x" * (1 << 20))
            f.flush()
            written += 1 << 20
except OSError:
    pass
print("written", written)
"""
MANY_EMPTY_FILES = r"""
import os
os.mkdir("many")
for i in range(100_000):
    open(f"many/{i}", "wb").close()
print("made them all")
"""
SPREAD_THEN_WAIT = r"""
import os, time
for i in range(64):  # 1 MiB each: no file is big, all of them are
    with open(f"part{i}", "wb") as f:
        f.write(os.urandom(1 << 20))
print("written", flush=True)
time.sleep(600)  # only the disk watchdog ends it before the scorer's timeout
"""
UNLINKED_HELD_OPEN = r"""
import os, time
held = []
for i in range(8):  # 8 MiB each, unlinked while held open: no name for a walk of the folder to find
    f = open(f"gone{i}", "wb")
    f.write(os.urandom(8 << 20))
    f.flush()
    os.unlink(f"gone{i}")
    held.append(f)
print("written", flush=True)
time.sleep(600)  # only the disk watchdog ends it before the scorer's timeout
"""


def disk_attack(tmp_path: Path, solution: str, limits: dict, timeout_s: float = 240) -> EvaluationResult:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "solution.py").write_text(solution)
    config = {
        "type": "command",
        "command": [sys.executable, "-c", DISK_SCORER],
        "reward_from": "json",
        "timeout_s": timeout_s,
        "limits": limits,
    }
    return evaluate(config, EvaluationInput(task={}, workspace=ws))


def test_no_file_of_the_scored_code_grows_past_file_mb(tmp_path):
    capped = disk_attack(tmp_path, ONE_BIG_FILE, {"file_mb": 16, "memory_mb": 128, "tmp_mb": 8})
    assert f"written {16 << 20}" in capped.details["output"]["said"], capped.details
    # Control: under the default cap the same code writes all it meant to.
    control = disk_attack(tmp_path, ONE_BIG_FILE, {"memory_mb": 128, "tmp_mb": 8})
    assert f"written {64 << 20}" in control.details["output"]["said"], control.details


def test_a_scorer_killed_past_file_mb_is_the_policys_zero_with_a_flag(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    # The scorer's stdout is a file on the host too: 32 MiB of it kill a scorer capped at 8.
    config = {"type": "command", "command": ["sh", "-c", f"exec head -c {32 << 20} /dev/zero"]}
    capped = evaluate({**config, "limits": {"file_mb": 8}}, EvaluationInput(task={}, workspace=ws))
    assert capped.reward == 0.0 and capped.flags == ("file_size_limit_exceeded",), capped.details
    # Control: under the default cap it prints its 32 MiB and passes.
    assert evaluate(config, EvaluationInput(task={}, workspace=ws)).reward == 1.0


@pytest.mark.parametrize(
    "solution",
    [MANY_EMPTY_FILES, SPREAD_THEN_WAIT, UNLINKED_HELD_OPEN],
    ids=["100k-empty-files", "64-files-then-wait", "unlinked-held-open"],
)
def test_the_scored_code_cannot_fill_the_disk_with_files_under_the_cap(tmp_path, solution):
    capped = disk_attack(tmp_path, solution, {"disk_mb": 32, "memory_mb": 256, "tmp_mb": 8})
    # Killed by the disk watchdog (or judged after it exited): the policy's 0 with a flag, never
    # an infrastructure failure (EvaluatorError) nor the scorer's timeout.
    assert capped.reward == 0.0 and capped.flags == ("disk_limit_exceeded",), capped.details
    assert capped.details["exit_code"] is not None
    # Control: with the default disk cap the same code gets its files written (the one that then
    # waits runs into a short timeout after saying so; 100k files may take long on a loaded machine).
    timeout_s = 240 if solution is MANY_EMPTY_FILES else 15
    control = disk_attack(tmp_path, solution, {"memory_mb": 256, "tmp_mb": 8}, timeout_s=timeout_s)
    said = control.details.get("output", {}).get("said", "") + control.details["stdout_tail"]
    assert "disk_limit_exceeded" not in control.flags, control.details
    assert control.reward == 1.0 if solution is MANY_EMPTY_FILES else control.flags == ("scorer_timeout",)
    assert "made them all" in said if solution is MANY_EMPTY_FILES else control.details["exit_code"] is None


def test_a_device_named_in_the_command_is_the_sandboxes_own_never_a_copy(tmp_path):
    # It was copied in: /dev/null as an empty regular file, and /dev/zero (or /dev/urandom) until the
    # host's disk was full (not named here: the test must not do that to the old code's host).
    ws = tmp_path / "ws"
    ws.mkdir()
    config = {"type": "command", "command": ["sh", "-c", 'test -c "$0"', "/dev/null"]}
    result = evaluate(config, EvaluationInput(task={}, workspace=ws))
    assert result.reward == 1.0, result.details
    # Control: a regular file named the same way is copied in, and is no device.
    (tmp_path / "plain").write_text("x")
    plain = {**config, "command": ["sh", "-c", 'test -c "$0"', str(tmp_path / "plain")]}
    assert evaluate(plain, EvaluationInput(task={}, workspace=ws)).reward == 0.0


def test_a_fifo_named_as_an_input_is_an_infrastructure_error_naming_it(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(tmp_path / "pipe")
    config = {"type": "command", "command": ["cat", "{task[hidden.input]}"]}
    inp = EvaluationInput(task={"hidden": {"input": str(tmp_path / "pipe")}}, workspace=ws)
    with pytest.raises(EvaluatorError, match="not a regular file or folder"):
        evaluate(config, inp)
