"""Red team: the calculator agent out of turns printed the calculator's result as its answer.

``examples/calculator_agent/agent.py`` prints the model's final answer, which an evaluator with
``source = "stdout"`` scores. When the model never answered (every turn a tool call, until
``--max-turns``) it printed the last message instead, the calculator's result: a policy that only
asked the calculator for the question's expression earned 1 from stdout, never saying an answer.
Through ``harnessrl rollout`` (real gateway, real sandbox, scripted policy): now it prints the model's
last words and earns 0. The control: a policy that writes the answer still earns 1, and the same
tool-only policy earns 0 where the answer is read from the recorded calls (``final_answer``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "examples" / "calculator_agent" / "agent.py"
TASK = {"prompt": "Calculate 34 - 6.", "hidden": {"answer": "28"}}
TOOL_ONLY = [{"content": "", "tool_calls": [{"name": "calculator", "arguments": {"expression": "34 - 6"}}]}]
ANSWERS = [TOOL_ONLY[0], {"content": "Answer: 28"}]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


def _rollout(tmp_path: Path, name: str, turns: list[dict], source: str) -> dict:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "script.json").write_text(json.dumps({"turns": turns, "on_exhausted": "repeat_last"}))
    (folder / "task.json").write_text(json.dumps(TASK))
    (folder / "rollout.toml").write_text(
        f'[engine]\nmodel = "scripted:{folder / "script.json"}"\n\n'
        f'[harness]\npreset = "python"\ncommand = ["{AGENT}", "{{prompt}}"]\ntimeout_s = 120\n\n'
        f'[evaluator]\ntype = "exact_match"\nsource = "{source}"\nfallback = "last_number"\n'
        "pattern = 'Answer:\\\\s*(-?[0-9.]+)'\n\n[controller]\nmax_infra_retries = 0\n"
    )
    argv = [sys.executable, "-m", "harnessrl", "rollout", "--config", str(folder / "rollout.toml")]
    argv += ["--task", f"@{folder / 'task.json'}", "--run-dir", str(folder / "run")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    summary["stdout"] = Path(summary["log"], "stdout.log").read_text()
    return summary


def test_a_policy_that_only_calls_the_calculator_earns_nothing_from_stdout(tmp_path):
    tool_only = _rollout(tmp_path, "tool_only", TOOL_ONLY, "stdout")
    assert tool_only["calls"] == 4  # the agent's --max-turns: every call a tool call, no answer said
    assert "28" not in tool_only["stdout"], tool_only["stdout"]
    assert tool_only["reward"] == 0.0, tool_only
    # Controls: the answer said earns 1 from stdout; the tool-only policy earns 0 from the calls.
    answered = _rollout(tmp_path, "answered", ANSWERS, "stdout")
    assert (answered["reward"], answered["stdout"].strip()) == (1.0, "Answer: 28"), answered
    assert _rollout(tmp_path, "from_calls", TOOL_ONLY, "final_answer")["reward"] == 0.0
