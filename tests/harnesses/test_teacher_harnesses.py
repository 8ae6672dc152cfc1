"""Teacher mode through real, unmodified harnesses (issue 42): Claude Code (Messages), Codex
(Responses) and mini-swe-agent (chat) do the matrix's task in their sandbox through ``harnessrl
rollout`` with ``[engine.teacher]``, answered by an upstream chat endpoint.

The upstream is a second harnessrl gateway serving the matrix's scripted turns (write hello.txt,
read it back, answer) over chat completions; the teacher-mode gateway translates each call of the
harness's API to it and back. The harness doing the task is the proof that the translated shapes and
event sequences are ones the real client accepts; the records are checked against what the upstream
answered (its own store). Claude Code and Codex run with ``api = "native"`` too: their calls
forwarded to the upstream's own /messages and /responses.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.harnesses.test_matrix import CASES, PROMPT, REASONING_CASES, Case, harness_or_skip

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here"),
]

ADMIN = "teacher-harness-admin"
KEY_ENV = "HRL_TEST_TEACHER_KEY"
#: The reasoning variant's turns carry ``<think>`` text (the upstream sends it in ``content``) and one
#: makes two parallel tool calls.
TEACHER_CASES = [
    c for c in CASES + REASONING_CASES if c.preset in ("claude-code", "codex", "mini-swe-agent") and not c.env
]


def write_config(tmp_path: Path, case: Case, upstream: str, api: str) -> Path:
    (tmp_path / "unused.json").write_text(json.dumps({"turns": ["(the policy: unused in teacher mode)"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f"""
[engine]
model = "scripted:{tmp_path / "unused.json"}"
context_length = 262144

[engine.teacher]
base_url = "{upstream}"
model = "the-teacher"
api_key_env = "{KEY_ENV}"
api = "{api}"

[harness]
preset = "{case.preset}"
timeout_s = 180

[harness.limits]
memory_mb = 8192
max_processes = 1024

[evaluator]
type = "command"
command = ["grep", "-qx", "hi", "{{workspace}}/hello.txt"]

[controller]
max_infra_retries = 0
"""
    )
    return config


#: ``api = "native"``: Claude Code's and Codex's calls forwarded to the upstream's own /messages and
#: /responses (the upstream gateway speaks both), not translated to chat.
NATIVE_CASES = [c for c in CASES if c.preset in ("claude-code", "codex") and not c.env]
RUNS = [(c, "chat") for c in TEACHER_CASES] + [(c, "native") for c in NATIVE_CASES]


@pytest.mark.parametrize(("case", "api"), RUNS, ids=[f"{c.id}-{api}" for c, api in RUNS])
def test_a_real_harness_does_the_task_with_the_teacher(case: Case, api: str, tmp_path: Path) -> None:
    harness_or_skip(case.preset)
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    upstream_store = SQLiteStore(tmp_path / "upstream.db")
    with contextlib.ExitStack() as stack:
        stack.callback(upstream_store.close)
        engine = ScriptedEngine({"turns": case.turns}, tokenizer, context_length=262144)
        up_url = stack.enter_context(
            serve_in_thread(create_app(GatewayConfig(admin_key=ADMIN), upstream_store, engine))
        )
        up = stack.enter_context(GatewayClient(up_url, ADMIN)).create_rollout(
            {"prompt": "teach"}, run_id="upstream"
        )
        run_dir = tmp_path / "run"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "harnessrl",
                "rollout",
                "--config",
                str(write_config(tmp_path, case, f"{up_url}/v1", api)),
            ]
            + ["--task", json.dumps({"prompt": PROMPT}), "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=400,
            env={**os.environ, KEY_ENV: up["api_key"]},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        log = Path(summary["log"])
        context = f"{case.preset}: {summary}\nstderr: {(log / 'stderr.log').read_text()[-2000:]}"
        assert summary["outcome"] == "success" and summary["reward"] == 1.0, context
        assert (log / "workspace" / "hello.txt").read_text() == "hi\n", context
        answered = upstream_store.list_calls(up["rollout_id"])
    # Translated, the upstream served chat; native, the harness's own API.
    assert {c.api for c in answered} == {"chat.completions" if api == "chat" else case.api}
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        calls = store.list_calls(summary["rollout_id"])
    finally:
        store.close()
    # Each call in the harness's own API, recorded as the upstream answered it (no token ids).
    assert [c.api for c in calls] == [case.api] * len(case.turns), context
    assert len(answered) == len(calls)
    for mine, theirs in zip(calls, answered, strict=True):
        assert mine.prompt_token_ids == [] and mine.response_token_ids == []
        assert theirs.request["model"] == "the-teacher"
        assert _calls(mine.response) == _calls(theirs.response), context
        assert (mine.response.get("content") or "").strip() == (theirs.response.get("content") or "").strip()
    assert calls[0].response["tool_calls"][0]["function"]["name"] == case.tool


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls") or []
    ]
