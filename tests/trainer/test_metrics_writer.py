"""``MetricsWriter`` on resume: the steps after the checkpoint are trained again, so the points a
killed process wrote for them leave TensorBoard as their rows leave ``metrics.jsonl``."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harnessrl.trainer.metrics import MetricsWriter, read_metrics


def _writer(run_dir: Path, start_step: int) -> MetricsWriter:
    return MetricsWriter(
        run_dir, tensorboard=True, wandb_project=None, run_name="r", progress=False, start_step=start_step
    )


def _tensorboard_points(run_dir: Path) -> list[tuple[int, float]]:
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("reward/mean")]


def test_a_resumed_run_hides_the_points_of_the_steps_it_trains_again(tmp_path):
    killed = _writer(tmp_path, start_step=0)
    for step in (1, 2, 3):  # the process was killed after step 3's row; its checkpoint is step 1's
        killed.write(step, {"reward/mean": float(step)})
    killed.close()
    assert [p[0] for p in _tensorboard_points(tmp_path)] == [1, 2, 3]  # control: all three were written

    resumed = _writer(tmp_path, start_step=1)
    resumed.drop_after(1)
    for step in (2, 3):
        resumed.write(step, {"reward/mean": 10.0 * step})
    resumed.close()

    assert [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 20.0), (3, 30.0)]
    assert _tensorboard_points(tmp_path) == [(1, 1.0), (2, 20.0), (3, 30.0)]
