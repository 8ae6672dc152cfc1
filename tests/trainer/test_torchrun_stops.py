"""A ``harnessrl.trainer.torchrun`` run stopped from outside: torchrun SIGTERMs rank 0 when a follower
dies of its own error (out of memory: the kernel's OOM killer sends SIGKILL) or when torchrun itself
is stopped (``kill``, a deleted pod). Rank 0 then stops as ``harnessrl train`` does on SIGTERM: its
harnesses killed, the rollouts in flight requeued for ``--resume``, the run marked stopped, and the
``--resume`` line printed.

The test runs the real stack on two gloo ranks (CPU) with an agent that sleeps, so rank 0 collects
rollouts (in its event loop) and rank 1 waits for its next command when rank 1 is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.fakes.processes import processes_running, wait_for
from tests.trainer.test_train_end_to_end import assert_run_stopped_and_requeued

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "tiny" / "train.toml"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def worker_pid(torchrun_pid: int, rank: int) -> int | None:
    """The pid of torchrun's worker of ``rank`` (a child whose environment says ``RANK=rank``)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == torchrun_pid and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")
def test_a_follower_killed_stops_rank_0_cleanly(tmp_path):
    """Regression: rank 0 had no SIGTERM handler, so the SIGTERM torchrun sends it when a follower
    dies killed it on the spot: the run stayed "running" in the store, its rollouts "running", and
    nothing said how to go on."""
    agent = tmp_path / "slow_agent.py"
    agent.write_text("import time\ntime.sleep(600)\n")
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    argv = [*TORCHRUN, "--log-dir", str(tmp_path / "torchrun-logs"), "-m", "harnessrl.trainer.torchrun"]
    argv += [str(CONFIG), "--set", f"run.dir={run_dir}", "--set", "metrics.progress=false"]
    argv += ["--set", f'harness.command=["{agent}"]']
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def harnesses_running() -> bool:
        assert proc.poll() is None, proc.communicate()[1][-4000:]  # the run ended before its harnesses ran
        return len(processes_running(str(agent))) >= 4

    try:
        wait_for("4 harnesses running", harnesses_running, 300)
        follower = worker_pid(proc.pid, 1)
        assert follower is not None
        os.kill(follower, signal.SIGKILL)  # as the OOM killer does
        try:
            _, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail("torchrun still running 180 s after its follower was killed")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert "SIGTERM: run stopped" in err and f"--resume {run_dir}" in err, err[-4000:]
    assert processes_running(str(agent)) == []
    assert_run_stopped_and_requeued(run_dir)


@pytest.mark.slow
def test_a_start_up_that_fails_on_every_rank_leaves_no_run_folder(tmp_path):
    """Regression: a new torchrun run whose start-up failed (here FSDP cannot shard the model, on
    every rank) kept its folder, so the same command, fixed, was refused with "already exists; pass
    --resume" for a run that never trained, where ``harnessrl train`` removes it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    unshardable = tmp_path / "gpt2-one-layer"  # no decoder.layers for FSDP to wrap
    small = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=64, eos_token_id=0)
    GPT2LMHeadModel(small).save_pretrained(str(unshardable))
    run_dir = tmp_path / "runs" / "new"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    argv = [*TORCHRUN, "--log-dir", str(tmp_path / "torchrun-logs"), "-m", "harnessrl.trainer.torchrun"]
    argv += [str(CONFIG), "--set", f"run.dir={run_dir}", "--set", f"engine.model={unshardable}"]
    proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "harnessrl: error: cannot shard GPT2LMHeadModel" in proc.stderr, proc.stderr[-4000:]
    assert not (tmp_path / "runs").exists()


def test_config_with_resume_is_refused_not_ignored(tmp_path, capsys):
    """Regression: ``torchrun ... CONFIG --resume RUN`` resumed RUN and ignored CONFIG's changes
    without a word; ``harnessrl train`` refuses the pair. Refused before joining the other ranks
    (every rank parses the same arguments), so no torchrun is needed to see it."""
    from harnessrl.trainer.torchrun import main

    with pytest.raises(SystemExit) as exited:
        main([str(CONFIG), "--resume", str(tmp_path)])
    assert exited.value.code == 2
    assert (
        "give CONFIG for a new run or --resume RUN_DIR to continue one, not both" in capsys.readouterr().err
    )


def test_started_without_torchrun_says_so_without_a_traceback(capsys):
    """Regression: ``python -m harnessrl.trainer.torchrun CONFIG`` (torchrun forgotten) ended in a
    ``ConfigError`` traceback; it is the command's named error, exit 2."""
    from harnessrl.trainer.torchrun import main

    assert main([str(CONFIG)]) == 2
    assert "harnessrl: error: not started by torchrun" in capsys.readouterr().err
