"""An unmodified mini-swe-agent (``mini`` CLI, default ``mini.yaml`` with its ``bash`` tool) solves a tiny
task through the gateway with a scripted policy, inside a loopback-only network namespace.

Checked afterwards from the store file: the task's effect in the workspace, every call recorded with
token IDs and logprobs, and each call's prompt extends the previous prompt + sampled response exactly.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.store.sqlite import SQLiteStore

DRIVER = Path(__file__).with_name("mini_driver.py")

# What the policy "samples": create the file, look at it, then mini's documented finish command.
SCRIPT = {
    "turns": [
        {
            "content": "I will create the file with the requested line.",
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "printf 'hello harnessrl\\n' > result.txt"}}
            ],
        },
        {
            "content": "Let me check it.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "cat result.txt"}}],
        },
        {
            "content": "The file is right; submitting.",
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}
            ],
        },
    ],
    "on_exhausted": "error",
}


MINI = Path(sys.executable).with_name("mini")


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not MINI.exists(), reason="mini-swe-agent is not installed in this venv")
@pytest.mark.skipif(not _can_unshare(), reason="needs unshare -n (root or user namespaces) and iproute2")
@pytest.mark.timeout(300)
def test_mini_swe_agent_completes_a_task_through_the_gateway(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    store_path = tmp_path / "store.db"
    workdir = tmp_path / "workspace"
    workdir.mkdir()
    summary_path = tmp_path / "summary.json"
    args = " ".join(
        shlex.quote(str(a)) for a in (sys.executable, DRIVER, script, store_path, workdir, summary_path)
    )
    # One network namespace with only loopback: nothing mini, litellm or the gateway do can leave it.
    proc = subprocess.run(
        ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {args}"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(summary_path.read_text())
    assert summary["returncode"] == 0, summary

    assert (workdir / "result.txt").read_text() == "hello harnessrl\n"
    trajectory = json.loads((tmp_path / "trajectory.json").read_text())
    assert trajectory["info"]["exit_status"] == "Submitted"

    with SQLiteStore(store_path) as store:
        rollout = store.get_rollout(summary["rollout_id"])
        calls = store.list_calls(summary["rollout_id"])
    assert rollout.status == "finished" and rollout.reward == 1.0
    assert len(calls) == 3
    for call in calls:
        assert call.prompt_token_ids and call.response_token_ids
        assert len(call.response_logprobs) == len(call.response_token_ids)
        assert call.finish_reason == "tool_calls"
        assert call.request["tools"][0]["function"]["name"] == "bash"
    for prev, nxt in zip(calls, calls[1:], strict=False):
        head = prev.prompt_token_ids + prev.response_token_ids
        assert nxt.prompt_token_ids[: len(head)] == head, f"call {nxt.seq} does not extend call {prev.seq}"
