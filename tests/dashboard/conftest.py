"""Fixtures for dashboard tests: a run folder made by a real tiny training run (once per session),
a small hand-built store with tool calls, audit flags, a chain break, trainer metadata and harness
logs, and clients for both; ``make_run_folder`` for the several-runs overlay."""

from __future__ import annotations

import json
import os
import sqlite3
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

    def rollout_id(self, group: int, k: int) -> str:
        """The stored id of training group ``group``'s rollout ``k``: ``g000000-r0``, or that after
        a prefix naming the run (the trainer may add one), so tests need not know which."""
        bare = f"g{group:06d}-r{k}"
        with sqlite3.connect(self.path / "harnessrl.db") as conn:
            ids = [row[0] for row in conn.execute("SELECT rollout_id FROM rollouts")]
        return next(rid for rid in ids if rid == bare or rid.endswith(f"-{bare}"))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> RunFolder:
    """``harnessrl train examples/tiny/train.toml`` for 2 steps (~20 s): a real store and metrics."""
    run_dir = tmp_path_factory.mktemp("dash") / "run"
    train_tiny(run_dir, "trainer.steps=2", "trainer.tasks_per_step=2", "controller.concurrency=8")
    return RunFolder(path=run_dir, run_id=json.loads((run_dir / "config.json").read_text())["run"]["name"])


def train_tiny(run_dir: Path, *overrides: str) -> None:
    """``harnessrl train examples/tiny/train.toml`` into ``run_dir``, with ``--set`` ``overrides``."""
    sets = [arg for override in ("metrics.progress=false", *overrides) for arg in ("--set", override)]
    cmd = [
        sys.executable,
        "-m",
        "harnessrl",
        "train",
        "examples/tiny/train.toml",
        "--set",
        f"run.dir={run_dir}",
        *sets,
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-3000:]


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


def write_logs(run_dir: Path, rollout_id: str, attempt: int, **streams: str) -> None:
    """Harness logs where the controller writes them (``Controller._attempt_dir``)."""
    folder = run_dir / "rollouts" / rollout_id / f"attempt-{attempt}"
    folder.mkdir(parents=True, exist_ok=True)
    for stream, text in streams.items():
        (folder / f"{stream}.log").write_text(text)


def make_run_folder(
    path: Path, run_id: str, metrics: list[dict[str, float]], *, status: str = "finished"
) -> Path:
    """A run folder with a store holding one finished rollout ``{run_id}-r0`` and ``metrics``."""
    store = SQLiteStore(path / "harnessrl.db")
    store.create_run(run_id, {"run": {"name": run_id}})
    store.set_run_status(run_id, status)
    store.create_rollout(rollout_id=f"{run_id}-r0", run_id=run_id, step=0, metadata={"kind": "train"})
    store.start_rollout(f"{run_id}-r0")
    store.finish_rollout(f"{run_id}-r0", Outcome.SUCCESS, 1.0)
    store.close()
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return path


@pytest.fixture
def crafted(tmp_path: Path) -> Iterator[TestClient]:
    """A signed-in client of ``build_crafted``'s run folder."""
    with TestClient(create_dashboard_app(build_crafted(tmp_path), ADMIN_KEY)) as c:
        c.get(f"/ui/?key={ADMIN_KEY}")
        yield c


def build_crafted(tmp_path: Path) -> Path:
    """``tmp_path/crafted``: a run folder whose training rollout ``r-hack`` ran a tool, got flagged,
    broke its chain once and was trained with advantage 0.5 (``r-honest``, its group-mate, taught
    nothing; its stdout.log is a link to ``tmp_path/secret.txt``), and whose held-out ``r-retried``
    had two attempts. Also used by ``screenshots.py``."""
    run_dir = tmp_path / "crafted"
    store = SQLiteStore(run_dir / "harnessrl.db")
    store.create_run("crafted", {"run": {"name": "crafted"}})
    for name in ("r-hack", "r-honest"):
        store.create_rollout(
            rollout_id=name, run_id="crafted", task_id="t<script>", group_id="g000001", step=3,
            task={"prompt": "<b>fix the bug</b>"}, metadata={"kind": "train", "group": 1},
        )  # fmt: skip
        store.start_rollout(name)
    # A held-out rollout retried once (an infrastructure failure): two attempts, two pairs of logs.
    store.create_rollout(rollout_id="r-retried", run_id="crafted", step=4, metadata={"kind": "eval"})
    store.start_rollout("r-retried")
    store.requeue_rollout("r-retried", error="runner lost")
    store.start_rollout("r-retried")
    store.finish_rollout("r-retried", Outcome.SUCCESS, 0.5)
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
    # What the trainer's _record_step writes: r-honest was in the batch but taught nothing.
    store.update_rollout_metadata("r-hack", {"trained_at_step": 4, "advantage": 0.5})
    store.update_rollout_metadata("r-honest", {"trained_at_step": 4, "advantage": None})
    store.close()
    write_logs(run_dir, "r-hack", 0, stdout="<script>alert(1)</script> hacked", stderr="Traceback: boom")
    write_logs(run_dir, "r-retried", 0, stderr="first attempt: runner lost")
    write_logs(run_dir, "r-retried", 1, stdout="second attempt ok", stderr="")
    (tmp_path / "secret.txt").write_text("SECRET outside the run folder")
    honest = run_dir / "rollouts" / "r-honest" / "attempt-0"
    honest.mkdir(parents=True)
    (honest / "stdout.log").symlink_to(tmp_path / "secret.txt")  # a link out must not be followed
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
    return run_dir
