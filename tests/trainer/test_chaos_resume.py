"""``harnessrl train`` killed (SIGKILL, SIGTERM) at the worst moments, then ``--resume``d or run again:
the resumed run does what was left, the same command starts a run its start-up stop left nothing of."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "tiny" / "train.toml"
HARNESSRL = [sys.executable, "-m", "harnessrl"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")

# The real CLI in a child process that SIGKILLs itself as the run starts writing checkpoints/final:
# after its last step's checkpoint and metrics row, the window a kill on a real machine can land in.
KILLED_WRITING_FINAL = """
import os, signal, sys
from harnessrl.trainer import policy

original = policy.TrainablePolicy.save_checkpoint

def save_checkpoint(self, path, *args, **kwargs):
    if os.path.basename(path) == "final":
        os.kill(os.getpid(), signal.SIGKILL)
    return original(self, path, *args, **kwargs)

policy.TrainablePolicy.save_checkpoint = save_checkpoint
from harnessrl.cli.main import app
app(sys.argv[1:])
"""

SHORT = ("--set", "metrics.progress=false", "--set", "trainer.steps=2", "--set", "trainer.eval_every=0")


def resume(run_dir: Path) -> subprocess.CompletedProcess:
    argv = [*HARNESSRL, "train", "--resume", str(run_dir), "--set", "metrics.progress=false"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


def test_a_kill_before_the_final_checkpoint_leaves_resume_to_write_it(tmp_path):
    """Killed after its last step's checkpoint but before ``checkpoints/final`` was written, the run
    was "already finished" to ``--resume``, which never wrote it: the weights the docs point the next
    stage at were missing for good (or an earlier run's, after a resume that trained further)."""
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_WRITING_FINAL,
            "train",
            str(CONFIG),
            "--set",
            f"run.dir={run_dir}",
            *SHORT,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    latest = run_dir / "checkpoints/latest"
    assert json.loads((latest / "harnessrl_state.json").read_text())["step"] == 2  # every step done...
    assert not (run_dir / "checkpoints/final").exists()  # ...but no final weights

    resumed = resume(run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "already finished its 2 steps" in resumed.stderr  # nothing is trained again
    final = run_dir / "checkpoints/final"
    assert json.loads((final / "harnessrl_final.json").read_text()) == {"step": 2}
    assert not (final / "trainer_state.pt").exists()  # weights only, as a run's end writes it
    weights, expected = load_file(final / "model.safetensors"), load_file(latest / "model.safetensors")
    assert weights.keys() == expected.keys() and all(weights[k].equal(expected[k]) for k in expected)
    assert (final / "tokenizer.json").is_file()
    rows = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2]

    again = resume(run_dir)  # whole now: left as it is
    assert again.returncode == 0 and "already finished its 2 steps" in again.stderr, again.stderr[-3000:]
    assert "final written" not in again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["already_finished"] is True


# SIGTERM (a pod deleted, systemd stopping a unit) while the process imports torch and builds the
# trainer, before the event loop's handlers exist: delivered for real, from inside that window.
TERMINATED_STARTING = """
import os, signal, sys
from harnessrl.trainer import allocator

def tune():
    os.kill(os.getpid(), signal.SIGTERM)

allocator.tune = tune
from harnessrl.cli.main import app
app(sys.argv[1:])
"""


def test_sigterm_during_start_up_stops_cleanly_and_leaves_no_folder(tmp_path):
    """It killed the process (exit -15, no word), leaving the new run's folder: the same command was
    then refused as "already exists". Now it stops as Ctrl-C there does: 143, a message, no folder."""
    run_dir = tmp_path / "run"
    argv = ["train", str(CONFIG), "--set", f"run.dir={run_dir}", *SHORT]
    proc = subprocess.run(
        [sys.executable, "-c", TERMINATED_STARTING, *argv], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert f"SIGTERM: run stopped while starting; nothing was kept in {run_dir}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists()
