"""The harness matrix: every supported harness, unmodified, through ``harnessrl rollout``.

Each case launches the real harness (installed by ``install.sh``: npm ones in ``.harnesses/``, Python
ones in the venv, OpenHands in ``.harnesses/openhands-venv`` when asked for) with its preset, in the controller's sandbox (loopback-only network namespace),
against the real gateway serving a scripted engine. The script makes the harness call its *own*
shell tool to create ``hello.txt`` containing ``hi``, read it back, then answer with a final message. The test
checks the file in the workspace, that every call is recorded token-exact, and that the trajectory
builder merges the rollout into as few samples as the harness's history allows.

A harness that is not installed is skipped with the reason. Run with ``pytest tests/harnesses -m slow
-s`` to see the samples per rollout of each harness (also written to ``matrix.json`` in the run dir).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.presets import PRESETS
from harnessrl.errors import ConfigError
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.trajectory import build_batch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here"),
]

HARNESSRL = [sys.executable, "-m", "harnessrl"]
PROMPT = "Create a file hello.txt containing the word hi."
WRITE = "printf 'hi\\n' > hello.txt"
DONE = "Created hello.txt containing hi."


CHECK = "cat hello.txt"


def tool_turn(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"content": "Next step.", "tool_calls": [{"name": tool, "arguments": arguments}]}


@dataclass(frozen=True)
class Case:
    """One harness: its own shell tool and the argument holding the command. The scripted policy
    writes the file, reads it back, then gives the final answer: three calls, two tool results."""

    preset: str
    api: str  # what the harness speaks: chat.completions | messages | responses
    tool: str
    command_arg: str
    extra_args: dict[str, Any] = field(default_factory=dict)
    final: Any = DONE  # the last turn (a plain answer unless the harness ends through a tool)
    # The fewest samples its history allows: 1 (every call extends the previous one), or one per
    # call for a harness that rewrites its whole history (``sample_per_call``).
    sample_per_call: bool = False
    env: dict[str, str] = field(default_factory=dict)
    # A known gateway shortfall that splits the rollout into more samples than the history needs:
    # the sample check is then an expected failure (reported, not hidden) until it is fixed.
    known_split: str | None = None
    # The reasoning variant: turns carry reasoning (``<think>`` text) and one turn makes two
    # parallel tool calls, the report's first cause of retokenization (templates that drop or
    # move earlier reasoning) and the shape a thinking model's agent loop has.
    reasoning: bool = False

    def shell(self, *commands: str) -> dict[str, Any]:
        calls = [{"name": self.tool, "arguments": {self.command_arg: c, **self.extra_args}} for c in commands]
        return {"content": "Next step.", "tool_calls": calls}

    @property
    def turns(self) -> list[Any]:
        if not self.reasoning:
            return [self.shell(WRITE), self.shell(CHECK), self.final]
        final = self.final if isinstance(self.final, dict) else {"content": self.final}
        return [
            {**self.shell(WRITE), "reasoning": "The file does not exist yet: write it first."},
            self.shell(CHECK),  # a turn without reasoning between two with it
            {**self.shell(CHECK, "wc -c hello.txt"), "reasoning": "Check content and size together."},
            {**final, "reasoning": "Both checks passed, so the task is done."},
        ]

    @property
    def samples(self) -> int:
        return len(self.turns) if self.sample_per_call else 1

    @property
    def id(self) -> str:
        chat = "-chat" if "OPENAI_AGENTS_API" in self.env else ""
        return self.preset + chat + ("-reasoning" if self.reasoning else "")


CASES = [
    Case(
        "mini-swe-agent",
        "chat.completions",
        "bash",
        "command",
        final=tool_turn("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
    ),
    Case("claude-code", "messages", "Bash", "command", {"description": "Run the command"}),
    # Codex replays output items in streamed order ([function_call, message]); the Responses input
    # converter folds them back into one assistant turn, so its history stays one chain.
    Case("codex", "responses", "exec_command", "cmd"),
    Case("opencode", "chat.completions", "bash", "command", {"description": "Run the command"}),
    Case(
        "qwen-code",
        "chat.completions",
        "run_shell_command",
        "command",
        {"is_background": False, "description": "Run the command"},
    ),
    Case(
        "smolagents",
        "chat.completions",
        "bash",
        "command",
        final=tool_turn("final_answer", answer=DONE),
        # smolagents rewrites its own history: an earlier tool call comes back as assistant *text*
        # ("Calling tools:\n[{...}]") and its result as a user "Observation:", so no call extends
        # the previous one token for token — one sample per call is the fewest possible.
        sample_per_call=True,
    ),
    Case("openai-agents", "responses", "bash", "command"),
    # OpenHands (its own Python 3.12 venv, .harnesses/openhands-venv): chat completions via litellm,
    # not streamed. `terminal` requires `security_risk`; the run ends through its `finish` tool.
    Case(
        "openhands",
        "chat.completions",
        "terminal",
        "command",
        {"security_risk": "LOW", "summary": "Run the command"},
        final=tool_turn("finish", message=DONE),
    ),
    Case(
        "openai-agents", "chat.completions", "bash", "command", env={"OPENAI_AGENTS_API": "chat_completions"}
    ),
    # Hermes Agent (its own venv, .harnesses/hermes-venv), one-shot `hermes -z`: streamed chat
    # completions, 26 tools; its shell tool is `terminal`. Its history is append-only, so the rollout
    # stays one chain.
    Case("hermes", "chat.completions", "terminal", "command"),
    # OpenClaw (Node 24, .harnesses/node24): streamed chat completions; its shell tool is `exec`.
    # Every request ends with a transient user message (<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>: active
    # exec sessions, subagents, media tasks) that the next request drops and re-appends after the new
    # turns, so each answer was sampled after text the next prompt no longer holds: one sample per
    # call is the fewest that stays on-policy.
    Case("openclaw", "chat.completions", "exec", "command", sample_per_call=True),
]


REASONING_CASES = [replace(case, reasoning=True) for case in CASES]


def harness_or_skip(preset: str) -> HarnessSpec:
    """The preset's spec, or skip the case naming what is missing."""
    try:
        spec = PRESETS[preset]()
    except ConfigError as exc:  # a Python agent library that is not installed
        pytest.skip(f"{preset}: {exc}")
    exe = spec.command[0]
    if shutil.which(exe) is None and not Path(exe).is_file():
        pytest.skip(f"{preset}: {exe!r} is not installed (./install.sh puts npm harnesses in .harnesses/)")
    return spec


def write_config(tmp_path: Path, case: Case) -> Path:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": case.turns, "on_exhausted": "repeat_last"}))
    config = tmp_path / "rollout.toml"
    env = "".join(f"{key} = {json.dumps(value)}\n" for key, value in case.env.items())
    config.write_text(
        f"""
[engine]
model = "scripted:{script}"
context_length = 262144   # the real harnesses' system prompts and tool lists are long (~30k tokens)

[harness]
preset = "{case.preset}"
timeout_s = 180

[harness.env]
{env}
[harness.limits]
memory_mb = 8192          # node harnesses reserve a lot of address space
max_processes = 1024

[evaluator]
type = "command"
command = ["grep", "-qx", "hi", "{{workspace}}/hello.txt"]

[controller]
max_infra_retries = 0
"""
    )
    return config


def run_rollout(config: Path, run_dir: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [
            *HARNESSRL,
            "rollout",
            "--config",
            str(config),
            "--task",
            json.dumps({"prompt": PROMPT}),
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rollout_did_the_task(case: Any, tmp_path: Path, name: str) -> tuple[dict[str, Any], Any, list[Any]]:
    """Run ``case`` (its preset, turns and env) through ``harnessrl rollout``; assert the task's effect
    in the sandboxed workspace and one recorded call per scripted turn. (summary, rollout, calls)."""
    summary = run_rollout(write_config(tmp_path, case), tmp_path / "run")
    log = Path(summary["log"])
    context = f"{name}: {summary}\nstderr: {(log / 'stderr.log').read_text()[-2000:]}"
    assert summary["outcome"] == "success", context
    assert (log / "workspace" / "hello.txt").read_text() == "hi\n", context
    store = SQLiteStore(tmp_path / "run" / "harnessrl.db")
    try:
        rollout = store.get_rollout(summary["rollout_id"])
        calls = store.list_calls(rollout.rollout_id)
    finally:
        store.close()
    assert len(calls) == len(case.turns), context
    return summary, rollout, calls


@pytest.mark.parametrize("case", CASES + REASONING_CASES, ids=[c.id for c in CASES + REASONING_CASES])
def test_harness_does_the_task_through_the_gateway(case: Case, tmp_path: Path) -> None:
    harness_or_skip(case.preset)
    summary, rollout, calls = rollout_did_the_task(case, tmp_path, case.preset)
    assert summary["reward"] == 1.0, summary
    assert summary["flags"] == [], summary

    # Every call recorded, token-exact, in the API the harness speaks.
    for call in calls:
        assert call.api == case.api
        assert call.prompt_token_ids and call.response_token_ids
        assert len(call.response_logprobs) == len(call.response_token_ids)

    # As few samples as the harness's history allows.
    batch = build_batch([(rollout, calls)])
    stats = batch.stats
    report = {
        "preset": case.preset,
        "api": case.api,
        "calls": len(calls),
        "samples_per_rollout": stats.samples_per_rollout,
        "breaks": dict(stats.breaks),
        "prompt_tokens_first_call": len(calls[0].prompt_token_ids),
        "seconds": summary["seconds"],
    }
    (tmp_path / "run" / "matrix.json").write_text(json.dumps(report, indent=2))
    print(f"\nHARNESS-MATRIX {json.dumps(report)}")
    if stats.samples != case.samples and case.known_split:
        pytest.xfail(f"{case.preset}: {stats.samples} samples, not {case.samples}: {case.known_split}")
    assert stats.samples == case.samples, report
    if case.samples == 1:  # each call says its prompt continued the previous one's sampled tokens
        assert [c.usage.prompt_source for c in calls[1:] if c.usage] == ["reused"] * (len(calls) - 1), report
    assert stats.loss_tokens == sum(len(c.response_token_ids) for c in calls), report
