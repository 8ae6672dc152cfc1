"""Fixtures for dashboard tests: a run folder made by a real tiny training run (once per session),
a small hand-built store with tool calls, audit flags and a chain break, and clients for both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from harnessrl.dashboard import create_dashboard_app
from harnessrl.schemas import Call, Outcome
from harnessrl.store.sqlite import SQLiteStore

ADMIN_KEY = "dash-admin-key"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class RunFolder:
    path: Path
    run_id: str


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> RunFolder:
    """``harnessrl train examples/tiny/train.toml`` for 2 steps (~20 s): a real store and metrics."""
    run_dir = tmp_path_factory.mktemp("dash") / "run"
    cmd = [
        sys.executable, "-m", "harnessrl", "train", "examples/tiny/train.toml",
        "--set", f"run.dir={run_dir}", "--set", "trainer.steps=2", "--set", "metrics.progress=false",
        "--set", "trainer.tasks_per_step=2", "--set", "controller.concurrency=8",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return RunFolder(path=run_dir, run_id=json.loads((run_dir / "config.json").read_text())["run"]["name"])


@pytest.fixture(scope="session")
def client(tiny_run: RunFolder) -> Iterator[TestClient]:
    """Signed in as the admin (through ``?key=``, which sets the cookie)."""
    with TestClient(create_dashboard_app(tiny_run.path, ADMIN_KEY)) as c:
        assert c.get(f"/ui/?key={ADMIN_KEY}").status_code == 200
        yield c


def _call(rollout_id: str, prompt: list[int], sampled: list[int], version: int, **kw: object) -> Call:
    return Call(
        rollout_id=rollout_id,
        prompt_token_ids=prompt,
        response_token_ids=sampled,
        response_logprobs=[-0.5 - i for i in range(len(sampled))],
        policy_version=version,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def crafted(tmp_path: Path) -> Iterator[TestClient]:
    """A run folder whose rollout ``r-hack`` ran a tool, got flagged, and broke its chain once."""
    run_dir = tmp_path / "crafted"
    store = SQLiteStore(run_dir / "harnessrl.db")
    store.create_run("crafted", {"run": {"name": "crafted"}})
    for name in ("r-hack", "r-honest"):
        store.create_rollout(
            rollout_id=name, run_id="crafted", task_id="t<script>", group_id="g1", step=3,
            task={"prompt": "<b>fix the bug</b>"},
        )  # fmt: skip
        store.start_rollout(name)
    tool_call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
    request = {
        "messages": [
            {"role": "user", "content": "fix the <bug>"},
            {"role": "assistant", "content": None, "tool_calls": [tool_call]},
            {"role": "tool", "tool_call_id": "c1", "content": "tests/ <main.py>"},
        ]
    }
    store.add_call(_call("r-hack", [1, 2, 3], [4, 5], 7, request={"messages": request["messages"][:1]}))
    store.add_call(_call("r-hack", [1, 2, 3, 4, 5, 6], [8, 9], 7, request=request))
    # A prompt that is no extension of the chain: a new sample (new context).
    store.add_call(
        _call(
            "r-hack", [10, 11], [12], 8, request=request, response={"role": "assistant", "content": "done!"}
        )
    )
    store.add_call(
        _call("r-honest", [1, 2], [3], 7, request={"messages": [{"role": "user", "content": "hi"}]})
    )
    audit = [
        {
            "rule": "test_tampering",
            "call_seq": 1,
            "command": "cd x && rm -rf tests/ && pytest",
            "match": "rm -rf tests/",
        }
    ]
    store.set_rollout_flags("r-hack", ["test_tampering"])
    store.finish_rollout(
        "r-hack", Outcome.SUCCESS, 1.0, metadata={"audit": audit, "evaluation": {"stdout": "PASSED <ok>"}}
    )
    store.finish_rollout(
        "r-honest", Outcome.POLICY_FAILURE, 0.0, metadata={"evaluation": {"stdout": "FAILED"}}
    )
    store.close()
    (run_dir / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps(
                {
                    "step": s,
                    "time": 1000.0 + 90 * s,
                    "reward/mean": s / 10,
                    "heldout/reward": s / 20,
                    "custom/x": s * s,
                }
            )
            for s in (1, 2, 3)
        )
        + "\n{torn"
    )
    with TestClient(create_dashboard_app(run_dir, ADMIN_KEY)) as c:
        c.get(f"/ui/?key={ADMIN_KEY}")
        yield c
