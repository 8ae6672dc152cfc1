"""Every attempt sees the same paths in the bubblewrap sandbox: its workspace at /rollout/workspace,
its home at /rollout/home, its task file at /rollout/task.json, whatever the run folder and rollout
id. Harnesses write their cwd and $HOME into the prompt; with host paths there two rollouts of one
task would send different prompts (no prefix cache across a group, no shared-prefix training rows,
run folders shown to the policy). Driven through ``harnessrl rollout`` with a real agent process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.controller.test_rollout_end_to_end import rollout_cli

from harnessrl.controller.base import ROLLOUT_PATHS
from harnessrl.store.sqlite import SQLiteStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")

# What a harness puts into its prompt: where it runs, its home, its task file and the arguments the
# config rendered for it; it also writes one file into each writable folder, as harnesses do.
AGENT = """
import json, os, sys
from openai import OpenAI
seen = {
    "cwd": os.getcwd(),
    "home": os.environ["HOME"],
    "task_file": os.environ["HARNESSRL_TASK_FILE"],
    "prompt": json.load(open(os.environ["HARNESSRL_TASK_FILE"]))["prompt"],
    "argv": sys.argv[1:],
}
open("from-cwd.txt", "w").write("cwd")
open(os.path.join(os.environ["HOME"], "from-home.txt"), "w").write("home")
OpenAI().chat.completions.create(model="policy", messages=[{"role": "user", "content": json.dumps(seen)}])
print(json.dumps(seen))
"""


def rollout(tmp_path: Path, name: str, *, sandbox: str) -> tuple[dict, dict]:
    """One rollout in its own run folder: what the agent reported, and the request the gateway recorded."""
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"content": "ok"}], "on_exhausted": "repeat_last"}))
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f"""
[engine]
model = "scripted:{script}"

[harness]
preset = "python"
command = ["{agent}", "{{workspace}}", "{{task_file}}", "{{workspace}}/../home/out.json"]
sandbox = "{sandbox}"
timeout_s = 60

[evaluator]
type = "exact_match"
field = "hidden.answer"
"""
    )
    run_dir = tmp_path / name
    proc = rollout_cli(config, {"prompt": "Say ok.", "hidden": {"answer": "ok"}}, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    attempt = Path(summary["log"])
    assert (attempt / "workspace" / "from-cwd.txt").read_text() == "cwd"  # landed in the host folders
    assert (attempt / "home" / "from-home.txt").read_text() == "home"
    reported = json.loads((attempt / "stdout.log").read_text().strip().splitlines()[-1])
    with SQLiteStore(run_dir / "harnessrl.db") as store:
        (call,) = store.list_calls(summary["rollout_id"])
    return reported, call.request


def test_two_rollouts_in_different_run_folders_send_the_same_prompt(tmp_path: Path) -> None:
    first, first_request = rollout(tmp_path, "run-a", sandbox="bwrap")
    second, second_request = rollout(tmp_path, "run-b-with-a-longer-name", sandbox="bwrap")
    inside = ROLLOUT_PATHS
    assert first == {
        "cwd": str(inside.workspace),
        "home": str(inside.home),
        "task_file": str(inside.task_file),
        "prompt": "Say ok.",
        "argv": [str(inside.workspace), str(inside.task_file), f"{inside.workspace}/../home/out.json"],
    }
    assert second == first
    assert second_request["messages"] == first_request["messages"]
    assert str(tmp_path) not in json.dumps(first_request)


def test_control_without_the_sandbox_the_agent_sees_each_run_folder(tmp_path: Path) -> None:
    """The probe tells paths apart: with ``sandbox = "none"`` (nothing can be bound elsewhere) each
    rollout reports its own host folders, and the two prompts differ."""
    first, first_request = rollout(tmp_path, "run-a", sandbox="none")
    second, second_request = rollout(tmp_path, "run-b", sandbox="none")
    assert first["cwd"].startswith(str(tmp_path / "run-a")) and first["cwd"].endswith("/workspace")
    assert second["home"].startswith(str(tmp_path / "run-b")) and second["home"].endswith("/home")
    assert first_request["messages"] != second_request["messages"]
