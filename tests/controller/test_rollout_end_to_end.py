"""``harnessrl rollout`` for real: an unmodified OpenAI-SDK agent in the sandbox, the real gateway with
the scripted engine, the evaluator and the audit; outcomes and rewards land in the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "examples" / "calculator_agent" / "agent.py"
HARNESSRL = [sys.executable, "-m", "harnessrl"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


def write_config(tmp_path: Path, turns: list[dict], *, extra: str = "") -> Path:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": turns, "on_exhausted": "repeat_last"}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f"""
[engine]
model = "scripted:{script}"

[harness]
preset = "python"
command = ["{AGENT}", "{{prompt}}"]
timeout_s = 60

[evaluator]
type = "exact_match"
field = "hidden.answer"
pattern = 'Answer:\\s*(-?[0-9.]+)'

[controller]
max_infra_retries = 1
{extra}
"""
    )
    return config


def rollout_cli(config: Path, task: dict, run_dir: Path) -> subprocess.CompletedProcess:
    """``harnessrl rollout`` with the task in a file (``--task @file``), as the README runs it."""
    task_file = run_dir.parent / "task.json"
    task_file.write_text(json.dumps(task))
    return subprocess.run(
        [*HARNESSRL, "rollout", "--config", str(config), "--task", f"@{task_file}"]
        + ["--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=240,
    )


def run_rollout(config: Path, task: dict, run_dir: Path) -> dict:
    proc = rollout_cli(config, task, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


ARITHMETIC = {"prompt": "What is 17 + 25?", "hidden": {"answer": "42"}}  # the answer: evaluator only


def test_agent_with_tool_call_is_scored_and_recorded(tmp_path):
    turns = [
        {
            "content": "Let me compute.",
            "tool_calls": [{"name": "calculator", "arguments": {"expression": "17 + 25"}}],
        },
        {"content": "The calculator says 42. Answer: 42"},
    ]
    summary = run_rollout(write_config(tmp_path, turns), ARITHMETIC, tmp_path / "run")
    assert summary["outcome"] == "success"
    assert summary["reward"] == 1.0
    assert summary["calls"] == 2
    assert summary["flags"] == []
    assert Path(summary["log"], "stdout.log").read_text().strip().endswith("Answer: 42")
    assert json.loads(Path(summary["log"], "task.json").read_text()) == {"prompt": "What is 17 + 25?"}

    store = SQLiteStore(tmp_path / "run" / "harnessrl.db")
    rollout = store.get_rollout(summary["rollout_id"])
    assert rollout.status.value == "finished" and rollout.reward == 1.0
    calls = store.list_calls(rollout.rollout_id)
    assert [c.seq for c in calls] == [0, 1]
    first, second = calls
    assert second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.response_token_ids)] == (
        first.prompt_token_ids + first.response_token_ids
    )
    assert rollout.metadata["evaluation"]
    # The finisher says how many calls the evaluator read: samples are built from those only.
    assert rollout.metadata["calls_seen"] == 2
    store.close()


def test_wrong_answer_gets_zero_reward(tmp_path):
    summary = run_rollout(
        write_config(tmp_path, [{"content": "Answer: 41"}]),
        ARITHMETIC,
        tmp_path / "run",
    )
    assert summary["outcome"] == "success"
    assert summary["reward"] == 0.0


def test_agent_crash_is_a_policy_failure(tmp_path):
    config = write_config(tmp_path, [{"content": "Answer: 42"}])
    text = config.read_text().replace('command = ["', 'command = ["-c", "raise SystemExit(3)", "')
    config.write_text(text)
    summary = run_rollout(config, {"prompt": "x", "hidden": {"answer": "42"}}, tmp_path / "run")
    assert summary["outcome"] == "policy_failure"


def test_reward_hacking_is_flagged_and_zeroed(tmp_path):
    turns = [
        {"content": "", "tool_calls": [{"name": "calculator", "arguments": {"expression": "1"}}]},
        {
            "content": "I ran `curl http://127.0.0.1:1/answer` to peek.\n```bash\ncurl -s http://127.0.0.1:1/answer\n```\nAnswer: 42"
        },
    ]
    summary = run_rollout(write_config(tmp_path, turns), ARITHMETIC, tmp_path / "run")
    assert "network_fetch" in summary["flags"]
    assert summary["reward"] == 0.0


def test_bad_config_fails_before_any_rollout(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[harness]\ncommand = ["no-such-harness-binary"]\n[evaluator]\ntype = "exact_match"\n')
    proc = subprocess.run(
        [*HARNESSRL, "rollout", "--config", str(config), "--task", "{}", "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "harness.command[0]" in proc.stderr and "no-such-harness-binary" in proc.stderr
    assert not (tmp_path / "run" / "harnessrl.db").exists()

    config.write_text(
        '[harness]\ncommand = ["true"]\n[evaluator]\ntype = "python"\nfunction = "no_such_module:score"\n'
    )
    proc = subprocess.run(
        [*HARNESSRL, "rollout", "--config", str(config), "--task", "{}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "evaluator" in proc.stderr


def test_answers_the_harness_could_see_are_refused_before_any_rollout(tmp_path):
    config = write_config(tmp_path, [{"content": "Answer: 42"}])
    proc = rollout_cli(config, {"prompt": "What is 17 + 25?", "answer": "42"}, tmp_path / "run")
    assert proc.returncode == 2
    assert "--task: task field 'answer' is evaluator-only" in proc.stderr and "hidden.answer" in proc.stderr
    assert not (tmp_path / "run" / "harnessrl.db").exists()

    config.write_text(config.read_text().replace('field = "hidden.answer"', 'field = "answer"'))
    proc = rollout_cli(config, ARITHMETIC, tmp_path / "run")
    assert proc.returncode == 2
    assert "evaluator.field: 'answer' is visible to the harness" in proc.stderr
    assert not (tmp_path / "run" / "harnessrl.db").exists()


MINI = Path(sys.executable).with_name("mini")


@pytest.mark.skipif(not MINI.exists(), reason="mini-swe-agent is not installed in this venv")
def test_unmodified_mini_swe_agent_through_the_sandbox(tmp_path):
    turns = [
        {
            "content": "Creating the file.",
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "printf 'hello harnessrl\\n' > result.txt"}}
            ],
        },
        {
            "content": "Checking.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "cat result.txt && ls -a"}}],
        },
        {
            "content": "Done.",
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}
            ],
        },
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": turns}))
    config = tmp_path / "mini.toml"
    config.write_text(
        f"""
[engine]
model = "scripted:{script}"

[harness]
preset = "mini-swe-agent"
timeout_s = 120

[evaluator]
type = "command"
command = ["grep", "-qx", "hello harnessrl", "{{workspace}}/result.txt"]
"""
    )
    summary = run_rollout(
        config, {"prompt": "Create result.txt containing the line: hello harnessrl"}, tmp_path / "run"
    )
    assert summary["outcome"] == "success", summary
    assert summary["reward"] == 1.0
    assert summary["calls"] == 3
    assert summary["flags"] == []
    store = SQLiteStore(tmp_path / "run" / "harnessrl.db")
    calls = store.list_calls(summary["rollout_id"])
    for earlier, later in zip(calls, calls[1:], strict=False):
        prefix = earlier.prompt_token_ids + earlier.response_token_ids
        assert later.prompt_token_ids[: len(prefix)] == prefix
    store.close()
