"""Per-step metrics: JSONL (always), TensorBoard (if installed and on), W&B (if configured), and a
live progress line in the terminal (rich)."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    def __init__(
        self, run_dir: Path, *, tensorboard: bool, wandb_project: str | None, run_name: str, progress: bool
    ):
        self.path = run_dir / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        self._console = None
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

            self._console = Console(file=sys.stderr)

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

    def progress(self, step: int, total: int, metrics: dict[str, Any]) -> None:
        if self._console is None:
            return
        parts = [f"[bold]step {step}/{total}[/bold]"]
        for key, label, fmt in (
            ("reward/mean", "reward", "{:.3f}"),
            ("heldout/reward", "held-out", "{:.3f}"),
            ("trajectory/samples_per_rollout", "samples/rollout", "{:.2f}"),
            ("loss", "loss", "{:.4f}"),
            ("throughput/tokens_per_s", "tok/s", "{:.0f}"),
            ("time/step_s", "step s", "{:.1f}"),
            ("time/pause_s", "pause s", "{:.2f}"),
            ("staleness/max", "stale", "{:.0f}"),
        ):
            if metrics.get(key) is not None:
                parts.append(f"{label} {fmt.format(metrics[key])}")
        self._console.print("  ".join(parts))

    def message(self, text: str) -> None:
        if self._console is not None:
            self._console.print(text)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
