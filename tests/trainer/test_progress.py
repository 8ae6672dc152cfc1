"""``trainer.progress``: step lines with elapsed and ETA that never wrap in a log, a line for a long
phase there, and a live bar with the phase in a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from harnessrl.trainer.progress import RunProgress, clock


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_log_gets_whole_step_lines_with_elapsed_and_an_eta_from_this_processs_steps():
    fake = Clock()
    out = io.StringIO()
    shown = RunProgress(Console(file=out, width=80), total_steps=10, start_step=2, now=fake)  # resumed at 2
    fake.now += 30  # loading, before the first rollout
    shown.phase("held-out evaluation at step 2 (60 tasks)", announce=True)
    shown.phase("rollouts for step 3")
    fake.now += 60
    metrics = {
        "reward/mean": 0.25,
        "policy/loss": 0.1234,
        "throughput/tokens_per_s": 812.0,
        "time/step_s": 60.0,
    }
    metrics |= {"response/length_mean": 31.0}
    shown.step_done(3, metrics)
    lines = out.getvalue().splitlines()
    assert lines[0] == "held-out evaluation at step 2 (60 tasks)...  elapsed 0:30"
    # One step trained here in 60 s, 7 to go: 7:00; the two steps before --resume are not counted.
    assert lines[1] == (
        "step 3/10  reward 0.250  loss 0.1234  resp len 31  tok/s 812  step s 60.0  elapsed 1:30  eta 7:00"
    )
    assert len(lines[1]) > 80 and len(lines) == 2  # not wrapped at the console's 80 columns


def test_a_terminal_gets_a_bar_with_the_phase():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    shown = RunProgress(console, total_steps=4)
    shown.phase("training step 1")
    shown._bar.refresh()  # type: ignore[union-attr]
    shown.step_done(1, {"reward/mean": 0.5})
    shown.close()
    text = out.getvalue()
    assert "training step 1" in text and "1/4" in text and "elapsed" in text
    assert "step 1/4  reward 0.500" in text


def test_clock():
    assert (clock(5), clock(125), clock(3723)) == ("0:05", "2:05", "1:02:03")
