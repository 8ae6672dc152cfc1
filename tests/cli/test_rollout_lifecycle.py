"""``harnessrl rollout`` as a process: SIGTERM stops it the way Ctrl-C does (the sandbox gone, the
rollout requeued, exit 143) instead of leaving the harness under PID 1 and the rollout ``running``;
it runs only its own rollout, never another run's queued ones in the same store; its summary counts
the final attempt's calls; and it waits for the evaluator and the audit as well as the harness."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.controller.test_lifecycle_kill import sandbox_processes, wait_for

from harnessrl.controller.stack import RolloutConfig, rollout_time_limit
from harnessrl.schemas import RolloutStatus
from harnessrl.store.sqlite import SQLiteStore

HARNESSRL = [sys.executable, "-m", "harnessrl"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


def write_config(tmp_path: Path, command: list[str], evaluator: str = 'command = ["true"]') -> Path:
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "replies.json"}"\n\n'
        f'[harness]\npreset = "python"\ncommand = {json.dumps(command)}\ntimeout_s = 600\n\n'
        f'[evaluator]\ntype = "command"\nreward_from = "exit_code"\n{evaluator}\n\n'
        "[controller]\nmax_infra_retries = 0\n"
    )
    return config


@needs_root
def test_sigterm_stops_the_rollout_like_ctrl_c(tmp_path):
    # The python preset runs ``command`` with its interpreter: the harness is a Python sleep that no
    # other process runs (``["sleep", mark]`` was ``python sleep …``, gone in milliseconds: the test
    # passed only when its poll caught that failing interpreter, and waited 120 s when it did not).
    sleep = f"time.sleep({500 + os.getpid() % 1000}.{time.time_ns() % 10**6})"
    config = write_config(tmp_path, ["-c", f"import time; {sleep}"])
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [*HARNESSRL, "rollout", "--config", str(config), "--task", '{"prompt": "hi"}', "--run-dir", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: sandbox_processes(sleep) != [] or proc.poll() is not None, timeout_s=120)
        assert proc.poll() is None, proc.communicate()[1][-2000:]  # ended before its harness slept
        assert sandbox_processes(sleep) != [], "never started"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err[-2000:]
        assert "SIGTERM" in err
        assert wait_for(lambda: sandbox_processes(sleep) == [], timeout_s=30)
        store = SQLiteStore(run / "harnessrl.db")
        [rollout] = store.list_rollouts()
        store.close()
        assert rollout.status is RolloutStatus.QUEUED  # requeued, as after Ctrl-C: not left "running"
    finally:
        proc.kill()
        for pid in sandbox_processes(sleep):
            os.kill(pid, signal.SIGKILL)


@needs_root
def test_a_rollout_runs_only_its_own_rollout_in_a_shared_store(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    store = SQLiteStore(run / "harnessrl.db")
    others = [store.create_rollout(task={"prompt": f"theirs {i}"}, run_id="train-run-a") for i in range(2)]
    store.close()
    config = write_config(tmp_path, ["-c", "pass"])
    proc = subprocess.run(
        [*HARNESSRL, "rollout", "--config", str(config), "--task", '{"prompt": "hi"}', "--run-dir", str(run)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    store = SQLiteStore(run / "harnessrl.db")
    try:
        assert store.get_rollout(summary["rollout_id"]).status is RolloutStatus.FINISHED  # control
        for other in others:  # another run's queued rollouts are not this command's to run
            assert store.get_rollout(other.rollout_id).status is RolloutStatus.QUEUED
    finally:
        store.close()


def test_the_wait_covers_the_evaluator_and_the_audit_of_every_attempt():
    """An evaluator slower than the harness used to end the command with a TimeoutError traceback
    while its rollout was still being scored (harness 5 s, evaluator 300 s: the wait was 125 s)."""
    config = RolloutConfig.model_validate(
        {
            "harness": {"command": ["true"], "timeout_s": 5},
            "evaluator": {"type": "command", "command": ["true"], "timeout_s": 300},
            "controller": {"max_infra_retries": 1, "audit": {"max_seconds": 60}},
        }
    )
    assert rollout_time_limit(config) == (5 + 300 + 60) * 2 + 120
    exact = RolloutConfig.model_validate({"harness": {"command": ["true"], "timeout_s": 5}})
    retries = exact.controller.max_infra_retries  # exact_match has no time limit of its own
    assert rollout_time_limit(exact) == (5 + exact.controller.audit.max_seconds) * (retries + 1) + 120


def test_controller_store_must_be_the_gateways_existing_store(tmp_path):
    """A folder was a sqlite traceback; a typo'd path became a new empty store polled forever."""
    config = tmp_path / "c.toml"
    config.write_text('[harness]\npreset = "python"\ncommand = ["true"]\n')
    (tmp_path / "folder").mkdir()
    for store, why in ((tmp_path / "folder", "a folder"), (tmp_path / "typo" / "x.db", "no file")):
        proc = subprocess.run(
            [*HARNESSRL, "controller", "--config", str(config), "--store", str(store)]
            + ["--gateway-url", "http://127.0.0.1:9", "--run-dir", str(tmp_path / "c")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and why in proc.stderr and "--store" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "typo").exists() and not (tmp_path / "c").exists()
