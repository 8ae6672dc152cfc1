"""Per-step metrics: JSONL (always), TensorBoard (if installed and on), W&B (if configured), and the
run's progress display on stderr (``trainer.progress``)."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from harnessrl.trainer.progress import RunProgress


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


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
        self.path = run_dir / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        self._progress: RunProgress | None = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
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
        row = {"step": step, "time": time.time(), **{k: _clean(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

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


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
