"""Per-step metrics: JSONL (always), TensorBoard (if installed and on), W&B (if configured), and the
run's progress display on stderr (``trainer.progress``).

A step's row is written once the step and its held-out evaluation (when one is due) are done, while
its checkpoint may still be written in the background. So a resumed run first drops the rows after
its checkpoint's step (``drop_after``: those steps are trained again), and a row at the checkpoint's
step says its evaluation was done (``has_row``). TensorBoard hides those steps' points the same way
(its ``purge_step``); W&B starts a new run on resume, so the dropped steps stay in the earlier one.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from harnessrl.trainer.progress import RunProgress


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def clean_row(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` as its JSONL row holds them: a non-finite number as None (JSON has no NaN)."""
    return {k: _clean(v) for k, v in metrics.items()}


METRICS_FILE = "metrics.jsonl"


class MetricsWriter:
    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool,
        wandb_project: str | None,
        run_name: str,
        progress: bool,
        total_steps: int = 0,
        start_step: int = 0,
    ):
        self.path = run_dir / METRICS_FILE
        self._tb = None
        self._wandb = None
        self._progress: RunProgress | None = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # A resumed run trains the steps after ``start_step`` again: purge_step hides the
                # points a killed process wrote for them, as drop_after drops their JSONL rows.
                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=start_step + 1)
            except ImportError:  # tensorboard not installed: JSONL still has everything
                self._tb = None
        if wandb_project:
            import wandb  # an explicit opt-in: fail loudly if it is missing

            self._wandb = wandb.init(project=wandb_project, name=run_name, dir=str(run_dir))
        if progress:
            from rich.console import Console

            self._progress = RunProgress(
                Console(file=sys.stderr), total_steps=total_steps, start_step=start_step
            )

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, "time": time.time(), **clean_row(metrics)}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def drop_after(self, step: int) -> None:
        """Forget the rows of steps after ``step`` (a resumed run's checkpoint), and a row a kill cut
        short: a kill while a step's checkpoint was still being written resumes from the step
        before, which trains that step again and writes its row again. The file is replaced whole."""
        if not self.path.exists():
            return
        lines = self.path.read_text().splitlines(keepends=True)
        steps = [_row_step(line) for line in lines]
        kept = [line for line, at in zip(lines, steps, strict=True) if at is not None and at <= step]
        if len(kept) == len(lines) and all(line.endswith("\n") for line in lines):
            return
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text("".join(line if line.endswith("\n") else line + "\n" for line in kept))
        os.replace(partial, self.path)

    def has_row(self, step: int) -> bool:
        """Whether ``step`` has its row: the step, and its evaluation when one was due, are done."""
        return step in row_steps(self.path)

    def progress(self, step: int, metrics: dict[str, Any]) -> None:
        """A finished step's line (and the bar, in a terminal): ``trainer.progress``."""
        if self._progress is not None:
            self._progress.step_done(step, metrics)

    def phase(self, text: str, *, announce: bool = False) -> None:
        if self._progress is not None:
            self._progress.phase(text, announce=announce)

    def message(self, text: str) -> None:
        if self._progress is not None:
            self._progress.print(text)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def row_steps(path: Path) -> set[int]:
    """The steps with a whole row in the metrics file at ``path`` (none if it does not exist)."""
    if not path.exists():
        return set()
    return {step for line in path.read_text().splitlines() if (step := _row_step(line)) is not None}


def _row_step(line: str) -> int | None:
    """A JSONL row's step; None for a blank line or one a kill cut short."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if isinstance(step, int) else None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
