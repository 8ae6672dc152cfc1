"""``harnessrl train`` for real, on the tiny model: a real harness process (a stdlib HTTP agent) through
the real gateway and controller, optimizer steps that measurably raise the reward, checkpoints that
load in transformers, and ``--resume`` after SIGKILL that neither re-trains nor loses rollouts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harnessrl.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "tiny" / "train.toml"
HARNESSRL = [sys.executable, "-m", "harnessrl"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


def train(run_dir: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *HARNESSRL,
            "train",
            str(CONFIG),
            "--set",
            f"run.dir={run_dir}",
            "--set",
            "metrics.progress=false",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_reward_goes_up_and_checkpoint_loads(tmp_path):
    run_dir = tmp_path / "run"
    proc = train(run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 12
    rows = [r for r in metrics(run_dir) if r.get("reward/mean") is not None]
    assert [r["step"] for r in rows] == list(range(1, 13))
    rewards = [r["reward/mean"] for r in rows]
    # A random policy gets ~0.32 (step-to-step noise ~0.02); the example's learning rate makes it
    # settle on vowel-heavy tokens (0.5-0.6) within about five steps.
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards
    assert all(r["trajectory/samples_per_rollout"] == 1.0 for r in rows)

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(summary["final_checkpoint"])
    out = model(torch.tensor([[1, 2, 3]])).logits
    assert out.shape[:2] == (1, 3) and torch.isfinite(out).all()

    store = SQLiteStore(run_dir / "harnessrl.db")
    versions = [v.version for v in store.list_policy_versions()]
    assert versions == list(range(1, 13))
    # Calls carry the policy version that sampled them; later groups saw newer policies.
    trained = [r for r in store.list_rollouts(run_id="tiny-vowels") if r.metadata.get("trained_at_step")]
    assert len(trained) == 12 * 4 * 8
    assert max(c.policy_version for c in store.list_calls(trained[-1].rollout_id)) >= 10
    store.close()


def test_resume_after_sigkill_continues_without_retraining(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        *HARNESSRL,
        "train",
        str(CONFIG),
        "--set",
        f"run.dir={run_dir}",
        "--set",
        "metrics.progress=false",
        "--set",
        "trainer.steps=8",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        path = run_dir / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= 3:
            break
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    steps_before = [r["step"] for r in metrics(run_dir)]

    again = train(run_dir, "--set", "trainer.steps=8")  # without --resume: refused
    assert again.returncode == 2 and "--resume" in again.stderr

    resumed = subprocess.run(
        [*HARNESSRL, "train", "--resume", str(run_dir), "--set", "metrics.progress=false"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["steps"] == 8

    state = json.loads((run_dir / "checkpoints" / "latest" / "harnessrl_state.json").read_text())
    assert state["step"] == 8
    assert len(state["consumed_groups"]) == len(set(state["consumed_groups"])) == 8 * 4
    steps_after = [r["step"] for r in metrics(run_dir)]
    # Steps logged after the restart continue from the checkpoint: nothing past it is done twice.
    resumed_steps = steps_after[len(steps_before) :]
    assert resumed_steps == list(range(resumed_steps[0], 9))
    assert resumed_steps[0] <= steps_before[-1] + 1

    store = SQLiteStore(run_dir / "harnessrl.db")
    rollouts = store.list_rollouts(run_id="tiny-vowels")
    consumed = set(state["consumed_groups"])
    for group in consumed:
        members = [r for r in rollouts if r.group_id == group]
        assert len(members) == 8 and all(r.status.value in ("finished", "failed") for r in members)
    assert not [r for r in rollouts if r.status.value == "running"]
    store.close()


def test_bad_config_names_the_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.read_text().replace("group_size = 8", "group_size = 0"))
    proc = subprocess.run(
        [*HARNESSRL, "train", str(bad), "--set", f"run.dir={tmp_path / 'r'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "trainer.group_size" in proc.stderr
