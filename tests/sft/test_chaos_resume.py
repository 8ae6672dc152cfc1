"""`harnessrl sft` killed (SIGKILL: no handler runs) at the worst moment of a step, then `--resume`d:
metrics.jsonl ends with one row per step, in order, none lost."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from harnessrl.cli.main import app

runner = CliRunner()

# The real CLI in a child process that SIGKILLs itself once step 2's checkpoint is whole, just before
# the step's metrics row is written (a kill landing in that window on a real machine).
KILLED_AFTER_CHECKPOINT = """
import os, signal, sys
from harnessrl.trainer import metrics

original = metrics.MetricsWriter.write

def write(self, step, row):
    if step == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    original(self, step, row)

metrics.MetricsWriter.write = write
from harnessrl.cli.sft import run_sft
run_sft(sys.argv[1], None, [])
"""


def write_config(tmp_path: Path, teacher: Path) -> Path:
    path = tmp_path / "sft.toml"
    path.write_text(
        "\n".join(
            [
                "[run]",
                'name = "student"',
                "[source]",
                f'run_dir = "{teacher}"',
                "[sft]",
                'model = "tiny"',
                "epochs = 2",
                "sequences_per_step = 1",
                'device = "cpu"',
                "[metrics]",
                "tensorboard = false",
                "progress = false",
            ]
        )
        + "\n"
    )
    return path


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sigkill_between_checkpoint_and_row_loses_no_metrics_row(record, solving, tmp_path):
    """The row of a step whose checkpoint was whole when the process died was lost: the resumed run
    started after that step and never wrote it (metrics.jsonl had steps 1, 3, 4, ...)."""
    rec = record([solving, solving], [1.0, 1.0])
    config = write_config(tmp_path, rec.run_dir)
    run_dir = tmp_path / "runs/student"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_CHECKPOINT, str(config)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    state = json.loads((run_dir / "checkpoints/latest/harnessrl_state.json").read_text())
    assert state["step"] == 2  # the step's checkpoint is whole...
    assert [r["step"] for r in rows(run_dir)] == [1]  # ...its row was never written

    result = runner.invoke(app, ["sft", "--resume", str(run_dir)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == summary["total_steps"] == 4  # 2 sequences, one a step, 2 epochs

    written = rows(run_dir)
    assert [r["step"] for r in written] == [1, 2, 3, 4]
    assert all(isinstance(r.get("sft/loss"), float) for r in written)  # step 2's row is the step's own
    assert written[1]["sft/epoch"] == 0


def test_a_second_resume_of_a_finished_run_says_so(record, solving, tmp_path):
    """It printed "done" and the RL hint as if it had just trained; now it says the run had nothing
    left to do and how to train further (as `harnessrl train --resume` does)."""
    rec = record([solving], [1.0])
    config = write_config(tmp_path, rec.run_dir)
    run_dir = tmp_path / "runs/student"
    first = runner.invoke(app, ["sft", str(config)])
    assert first.exit_code == 0, first.output
    assert "already finished" not in first.output

    again = runner.invoke(app, ["sft", "--resume", str(run_dir)])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout.strip().splitlines()[-1])["already_finished"] is True
    assert (
        f"{run_dir} already finished its 2 steps (2 epochs); to train further: "
        f"harnessrl sft --resume {run_dir} --set sft.epochs=3"
    ) in again.output
    assert "harnessrl: done" not in again.output
