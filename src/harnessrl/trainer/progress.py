"""What a person watching ``harnessrl train`` sees on stderr: the phase the run is in, the step,
the time it has run and an estimate of what is left.

In a terminal a rich.progress bar stays at the bottom (phase, bar, step N/M, elapsed, ETA) with one
line per finished step printed above it. Anywhere else (a log file, CI) there is no bar: the step
lines alone, each carrying elapsed and ETA, never wrapped mid-metric, and one line per phase that
takes long (the held-out evaluation), so a log never goes silent for minutes.

The ETA is the mean wall time of the steps this process trained, times the steps left: steps done
before a ``--resume`` took an unknown time in another process and are not counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

# (metric, label, format) shown on each step's line, when the step has it.
STEP_LINE_FIELDS = (
    ("reward/mean", "reward", "{:.3f}"),
    ("heldout/reward", "held-out", "{:.3f}"),
    ("policy/loss", "loss", "{:.4f}"),
    ("response/length_mean", "resp len", "{:.0f}"),
    ("throughput/tokens_per_s", "tok/s", "{:.0f}"),
    ("time/step_s", "step s", "{:.1f}"),
    ("staleness/max", "stale", "{:.0f}"),
)


def clock(seconds: float) -> str:
    """``1:02:03`` / ``2:03``: hours only when there are any."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class RunProgress:
    """The run's display on ``console``; ``start_step`` is where a resumed run picked up; ``now``
    is the clock elapsed time and the ETA are read from (monotonic seconds)."""

    def __init__(
        self,
        console: Console,
        *,
        total_steps: int,
        start_step: int = 0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.total = total_steps
        self.start_step = start_step
        self.now = now
        self.started = now()
        self._first_step_at: float | None = None  # when this process began its first step's work
        self._done = start_step
        self._phase = ""
        self._bar: Progress | None = None
        if console.is_terminal:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("elapsed {task.fields[elapsed]}  eta {task.fields[eta]}"),
                console=console,
                transient=True,
            )
            self._task = self._bar.add_task(
                "starting", total=total_steps, completed=start_step, elapsed="0:00", eta="?"
            )
            self._bar.start()

    # -- what the training loop reports ----------------------------------------------------------------
    def phase(self, text: str, *, announce: bool = False) -> None:
        """The run is now doing ``text`` ("rollouts for step 3", "training step 3"). ``announce``:
        also a line in a log (for phases long enough to look like a hang there)."""
        if text == self._phase:
            return
        self._phase = text
        if self._first_step_at is None and text.startswith("rollouts"):
            self._first_step_at = self.now()
        if self._bar is not None:
            self._bar.update(self._task, description=text, **self._times())
        elif announce:
            self.print(f"{text}...  elapsed {clock(self.now() - self.started)}")

    def step_done(self, step: int, metrics: dict[str, Any]) -> None:
        self._done = max(self._done, step)
        parts = [f"step {step}/{self.total}"]
        parts += [
            f"{label} {fmt.format(metrics[key])}"
            for key, label, fmt in STEP_LINE_FIELDS
            if metrics.get(key) is not None
        ]
        times = self._times()
        parts.append(f"elapsed {times['elapsed']}  eta {times['eta']}")
        self.print("  ".join(parts))
        if self._bar is not None:
            self._bar.update(self._task, completed=self._done, **times)

    def print(self, text: str) -> None:
        # soft_wrap: a log is read with grep and tail; a line broken at 80 columns splits a metric.
        self.console.print(text, soft_wrap=True, markup=False, highlight=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    # -- estimates --------------------------------------------------------------------------------------
    def eta_s(self) -> float | None:
        """Seconds left: the mean of this process's steps so far times the steps still to do."""
        trained = self._done - self.start_step
        if trained <= 0 or self._first_step_at is None:
            return None
        per_step = (self.now() - self._first_step_at) / trained
        return per_step * max(0, self.total - self._done)

    def _times(self) -> dict[str, str]:
        eta = self.eta_s()
        return {"elapsed": clock(self.now() - self.started), "eta": "?" if eta is None else clock(eta)}
