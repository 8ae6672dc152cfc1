"""Red team: the code under test attacks its scorer, through ``harnessrl rollout`` on a real coding task.

The "policy" (``scored_attacks.py``, preset ``python``) leaves the bug in ``solution.py`` and adds code
that runs when the scorer imports it, or leaves files and an exit status behind: each attack is one
way a reward used to be reached without fixing the bug, or a 0 turned into "not counted" (issue 35).
Every attack runs with the real sandbox and the coding tasks' own scorer, where it must earn nothing
(``reward_before_audit``, the scorer's own verdict, is 0), and must never turn into an infrastructure
failure. Its control runs the same attack with ``sandbox = "none"`` and the scorer pattern the docs
once showed (``cp`` the hidden tests, then ``pytest``): there the attack works, which shows the probe
would notice success. ``docs/redteam.md``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.tasks.coding_support import CODING_SCORER, build_outside_tmp, records

from harnessrl.data.records import to_task
from harnessrl.sandbox.bwrap import sandbox_problem
from harnessrl.store.sqlite import SQLiteStore

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's cgroups need root here"),
    pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"),
]

HARNESSRL = [sys.executable, "-m", "harnessrl"]
WRITER = Path(__file__).with_name("scored_attacks.py")

# The coding tasks' scorer (examples/coding/train.toml): probes outside the scored process, pytest
# under tripwires, the scored code in its own domain.
HARDENED = {"command": CODING_SCORER["command"], "reward_from": "json"}
# What docs/evaluators.md showed before: the hidden tests restored, then pytest's exit status.
EXEC_PYTEST = {
    "command": [
        "bash",
        "-c",
        "cp -r {task[hidden.tests]}/files/. . && exec python3 -m pytest -q -p no:cacheprovider tests",
    ],
    "reward_from": "exit_code",
}
# The same, with a JSON verdict printed by a Python scorer that runs pytest as its child.
PYTEST_CHILD_JSON = {
    "command": [
        "python3",
        "-c",
        "import json, shutil, subprocess, sys, time; "
        "shutil.copytree(sys.argv[1] + '/files', '.', dirs_exist_ok=True); "
        "code = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'tests']).returncode; "
        "print(json.dumps({'reward': float(code == 0)}), flush=True); time.sleep(3)",
        "{task[hidden.tests]}",
    ],
    "reward_from": "json",
}


@pytest.fixture(scope="module")
def task() -> dict:
    """humaneval__0.m00 (``has_close_elements`` with a bug), built with the real builder."""
    out = build_outside_tmp("--limit", "1")
    [record] = records(out)
    yield to_task(record)
    shutil.rmtree(out.parent, ignore_errors=True)


def rollout(tmp_path: Path, task: dict, attack: str, *, sandbox: str, evaluator: dict) -> dict:
    """One ``harnessrl rollout``; its summary, with the stored rollout's metadata and flags."""
    folder = tmp_path / f"{attack}-{sandbox}"
    folder.mkdir()
    (folder / "script.json").write_text(json.dumps({"turns": [{"content": "unused"}]}))
    config = {
        "engine": {"model": f"scripted:{folder / 'script.json'}"},
        "harness": {
            "preset": "python",
            "command": [str(WRITER)],
            "repo": "{task[hidden.repo_path]}",
            "sandbox": sandbox,
            "timeout_s": 120,
        },
        "evaluator": {"type": "command", "timeout_s": 120, **evaluator},
        "controller": {"max_infra_retries": 1},
    }
    toml = folder / "rollout.toml"
    toml.write_text(_toml(config))
    proc = subprocess.run(
        [*HARNESSRL, "rollout", "--config", str(toml), "--task", json.dumps({**task, "attack": attack})]
        + ["--run-dir", str(folder / "run")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    store = SQLiteStore(folder / "run" / "harnessrl.db")
    row = store.get_rollout(summary["rollout_id"])
    store.close()
    return {**summary, "row": row}


def _toml(config: dict) -> str:
    lines = []
    for section, values in config.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def earned(result: dict) -> float:
    """The scorer's own verdict (before the audit, which may zero a reward for what it reads)."""
    return result["row"].metadata["reward_before_audit"]


def not_laundered(result: dict) -> bool:
    row = result["row"]
    return row.outcome.value != "infra_failure" and row.attempt == 0 and row.status.value == "finished"


@pytest.mark.parametrize(
    ("attack", "control"),
    [
        ("gold_hunt", EXEC_PYTEST),  # symptom 1: the gold solution within the scorer's reach
        ("exit_zero", EXEC_PYTEST),  # symptom 4: an in-process runner's verdict, os._exit(0)
        ("report_patch", EXEC_PYTEST),  # symptom 4: the tested code rewrites pytest's reports
        ("verdict_daemon", PYTEST_CHILD_JSON),  # symptom 2: a verdict appended to the scorer's stdout
        ("pyc_swap", EXEC_PYTEST),  # what runs is not what the audit read: bytecode beside the source
    ],
)
def test_the_code_under_test_earns_nothing_from_its_scorer(tmp_path, task, attack, control):
    result = rollout(tmp_path, task, attack, sandbox="bwrap", evaluator=HARDENED)
    assert earned(result) == 0.0 and not_laundered(result), result["row"].metadata
    assert '"reward": 1.0' not in json.dumps(result["row"].metadata["evaluation"])

    cheated = rollout(tmp_path, task, attack, sandbox="none", evaluator=control)
    assert earned(cheated) == 1.0, cheated["row"].metadata  # the control: the attack works there


def test_killing_the_scorer_is_the_policys_zero_not_an_infrastructure_failure(tmp_path, task):
    # Symptoms 3 and 6: in the sandbox the scored code cannot even signal its scorer, which goes on
    # to score the bug 0; without it the scorer dies, and that too is a flagged 0, never a retry.
    result = rollout(tmp_path, task, "kill_scorer", sandbox="bwrap", evaluator=HARDENED)
    assert earned(result) == 0.0 and not_laundered(result)
    assert "scorer_failed" not in result["row"].flags  # it survived
    killed = rollout(tmp_path, task, "kill_scorer", sandbox="none", evaluator=PYTEST_CHILD_JSON)
    assert earned(killed) == 0.0 and not_laundered(killed)
    assert "scorer_failed" in killed["row"].flags  # the control: the kill worked there


def test_a_harness_exiting_125_is_its_own_outcome(tmp_path, task):
    # Symptom 6: 125 was the launcher's "sandbox could not be set up".
    result = rollout(tmp_path, task, "exit_125", sandbox="bwrap", evaluator=HARDENED)
    assert not_laundered(result) and result["row"].outcome.value == "policy_failure"
    assert result["row"].metadata["exit"]["code"] == 125 and earned(result) == 0.0


def test_special_files_and_sparse_files_end_the_rollout_with_a_flag(tmp_path, task):
    # Symptom 7: a FIFO hung the workspace copy (the rollout stayed running), a socket crashed it,
    # a sparse file was written out whole.
    result = rollout(tmp_path, task, "special_files", sandbox="bwrap", evaluator=HARDENED)
    assert not_laundered(result) and earned(result) == 0.0
    assert "special_files_skipped" in result["row"].flags
    copied = result["row"].metadata["evaluation"]["workspace_copy"]
    assert sorted(copied["skipped"]) == ["trap.fifo", "trap.sock"] and copied["bytes"] < 10 << 20


def test_a_bomb_in_the_scored_code_is_contained(tmp_path, task):
    # Symptom 7: the evaluator's sandbox had no cgroup (320 processes and 2.6 GB went through).
    result = rollout(tmp_path, task, "bomb", sandbox="bwrap", evaluator=HARDENED)
    assert not_laundered(result) and earned(result) == 0.0
    assert result["row"].metadata["evaluation"].get("oom_killed") or result["row"].flags
    assert processes_in_cgroups_named(f"eval-{result['rollout_id']}") == []


def processes_in_cgroups_named(fragment: str) -> list[int]:
    """Processes still in a cgroup whose path holds ``fragment`` (the evaluator's cgroup of a rollout)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if fragment in (entry / "cgroup").read_text():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
