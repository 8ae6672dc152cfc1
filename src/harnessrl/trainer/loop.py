"""The training loop of ``harnessrl train``: plan, wait for completed groups, prepare, train, publish,
checkpoint (docs/architecture.md draws it).

Rollouts are created in *groups* (``group_size`` rollouts of one task) and consumed by optimizer
steps, ``tasks_per_step`` complete groups per step, oldest first. Sync and async are one loop with
a staleness bound (``step.staleness_bound``):

- ``sync`` (bound 0): the next step's groups are created only after the previous step trained, so
  every step waits for its slowest rollout and no rollout ever sees two policy versions.
- ``async`` (collocated, bound ``max_staleness``): up to ``max_in_flight`` rollouts stay queued or
  running while the trainer works; a step starts as soon as enough groups are complete. During the
  step generation is paused (new model calls wait, in-flight ones finish, harnesses see no error);
  the trainer steps, publishes the weights and generation resumes (an engine in this process frees
  its copy of the weights for the step: ``Fleet.release_engine_weights``). A rollout that straddles an
  update carries per-call policy versions; rollouts more than the bound behind are dropped (or
  down-weighted).

Everything that produces rollouts sits behind a ``Fleet`` (``fleet.py``), the policy behind a
``Policy`` (``base.py``); the loop touches neither the store nor a gateway itself. ``run.py`` sets
the run up around this loop (store, fleet, policy, resume). Crash safety: after a step the weights,
optimizer state and consumed groups are written together (``checkpoint.py``); a resumed run
reopens the groups it created but did not train, so none is trained twice and none is lost. The
checkpoint is written in the background, so a kill can leave metrics rows of steps after it (dropped
on resume: those steps are trained again) and an evaluation cut short (run again on resume, also
the last step's: ``evaluation_pending``). The checkpoint keeps its step's training metrics
(``TrainState.row``): a kill after it was whole but before the row was written (during the step's
evaluation) loses none of them; the resumed run writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.schemas import Task
from harnessrl.trainer import allocator
from harnessrl.trainer.base import Policy
from harnessrl.trainer.checkpoint import STATE_FILE, Checkpointer, TrainState, latest_checkpoint
from harnessrl.trainer.config import TrainConfig, TrainerSection
from harnessrl.trainer.failures import StepFailed, common_failure
from harnessrl.trainer.fleet import Fleet, Group
from harnessrl.trainer.metrics import METRICS_FILE, MetricsWriter, clean_row, row_steps
from harnessrl.trainer.schedule import GroupPlan, TaskSchedule, eval_sampling
from harnessrl.trainer.step import heldout_metrics, prepare_step, staleness_bound


def evaluation_due(trainer: TrainerSection, step: int, *, heldout: bool) -> bool:
    """Whether a held-out evaluation runs at ``step``: every ``eval_every`` steps and after the last."""
    every = trainer.eval_every
    return heldout and bool(every) and (step % every == 0 or step == trainer.steps)


def evaluation_pending(trainer: TrainerSection, state: TrainState, *, heldout: bool, has_row: bool) -> bool:
    """An evaluation due at ``state.step``, where the run starts or resumes, that did not finish: a
    new run's at step 0, or one a crash or a stop cut short (the last step's included). The
    checkpoint's ``evaluated_steps`` never holds its own step (it is saved before that evaluation
    runs), but the step's metrics row is written after it: ``has_row`` (the metrics file has a row
    for ``state.step``) means it finished. An evaluation run again reads back its rollouts that ended."""
    done = state.step in state.evaluated_steps or has_row
    return evaluation_due(trainer, state.step, heldout=heldout) and not done


def finished_at(run_dir: Path, config: TrainConfig, *, heldout: bool) -> int | None:
    """The step of a run folder with nothing left to do: its last whole checkpoint is at
    ``trainer.steps`` or past it, and no evaluation is pending there (the final one may have been
    cut short: ``evaluation_pending``). None when there is work left or no checkpoint. For
    ``harnessrl train --resume``, which says "already finished" only then (and rewrites
    ``checkpoints/final`` if a kill left it behind: ``restore_final``); ``heldout``: whether the
    run has held-out tasks. Reads files only (no torch)."""
    folder = latest_checkpoint(run_dir)
    if folder is None:
        return None
    state = TrainState.from_json((folder / STATE_FILE).read_text())
    if state.step < config.trainer.steps:
        return None
    has_row = state.step in row_steps(run_dir / METRICS_FILE)
    if not has_row and state.row is not None:  # its row is left to write (``TrainingLoop.run``)
        return None
    return None if evaluation_pending(config.trainer, state, heldout=heldout, has_row=has_row) else state.step


#: Written last into ``checkpoints/final`` (``trainer.run``): the step its weights are from.
FINAL_MARKER = "harnessrl_final.json"


def final_step(run_dir: Path) -> int | None:
    """The step ``checkpoints/final`` was written at; None if it is missing or was cut short (its
    marker is written after the weights)."""
    try:
        step = json.loads((run_dir / "checkpoints" / "final" / FINAL_MARKER).read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def restore_final(run_dir: Path, step: int) -> bool:
    """Make ``checkpoints/final`` the weights of ``step``, the last checkpoint of a finished run
    (``finished_at``), if a kill after that checkpoint left it missing, cut short or an earlier run's
    (it is written after the last step). Copied from the checkpoint without its optimizer state, as
    ``trainer.run`` writes it from the same weights; written beside, then renamed. Whether it was
    rewritten. Files only (no torch)."""
    if final_step(run_dir) == step:
        return False
    source = latest_checkpoint(run_dir)
    assert source is not None  # finished_at found it
    final = run_dir / "checkpoints" / "final"
    partial = final.with_name("final.restoring")
    if partial.exists():
        shutil.rmtree(partial)
    shutil.copytree(source, partial, ignore=shutil.ignore_patterns("trainer_state.pt", STATE_FILE))
    (partial / FINAL_MARKER).write_text(json.dumps({"step": step}) + "\n")
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    return True


@dataclass
class TrainingLoop:
    config: TrainConfig
    fleet: Fleet
    policy: Policy  # TrainablePolicy, or rank 0's handle on a sharded one (torchrun)
    schedule: TaskSchedule
    state: TrainState
    checkpointer: Checkpointer
    metrics: MetricsWriter
    heldout: list[Task] = field(default_factory=list)
    heldout_overlap: int = 0
    groups_created: int = 0  # the schedule's next group index

    def __post_init__(self) -> None:
        # Admission: how much generation may run ahead of training (see the module docstring).
        t = self.config.trainer
        self.max_open_groups = t.tasks_per_step * (1 + staleness_bound(t))
        self.in_flight_limit = (
            (t.max_in_flight or 2 * t.tasks_per_step * t.group_size)
            if t.mode == "async"
            else t.tasks_per_step * t.group_size
        )

    async def run(self) -> None:
        cfg = self.config.trainer
        # Rows after the checkpoint's step were written by a process killed before their checkpoint
        # was whole: those steps are trained again, and write their rows again.
        self.metrics.drop_after(self.state.step)
        start = self.state.step
        # The checkpoint's step without its row: a kill came after the checkpoint was whole (during
        # the step's evaluation, say): its training metrics, kept in the checkpoint, are written now.
        unwritten = self.state.row if start > 0 and not self.metrics.has_row(start) else None
        if self._evaluation_pending(start):
            before = {**(unwritten or {}), **await self._evaluate(start)}
            self.metrics.write(start, before)
            self.metrics.progress(start, before)
        elif unwritten is not None:
            self.metrics.write(start, unwritten)
            self.metrics.progress(start, unwritten)
        last = time.monotonic()
        while self.state.step < cfg.steps:
            self.metrics.phase(f"rollouts for step {self.state.step + 1}")
            groups = await self.fleet.completed(cfg.tasks_per_step, top_up=self._top_up)
            await self._stop_if_broken(groups)
            self.metrics.phase(f"training step {self.state.step + 1}")
            metrics = await self._step(groups, since=last)
            last = time.monotonic()
            step = self.state.step
            if self._evaluation_due(step):
                metrics = {**metrics, **await self._evaluate(step)}
            self.metrics.write(step, metrics)
            self.metrics.progress(step, metrics)

    async def _stop_if_broken(self, groups: list[Group]) -> None:
        """Raise ``StepFailed`` if every rollout of the step failed alike before the policy was
        sampled (``failures``). Its rollouts are marked, so a resumed run (the cause fixed, e.g.
        ``--set harness.command=...``) leaves those groups out instead of stopping on them again."""
        reason = common_failure(groups)
        if reason is None:
            return
        await self.fleet.mark_failed_step(groups, reason)
        raise StepFailed(f"step {self.state.step + 1}: {reason}")

    def _top_up(self) -> list[GroupPlan]:
        """The next groups to create: bounded by rollouts in flight and by how far generation may
        run ahead of training (open groups)."""
        fleet, group_size = self.fleet, self.config.trainer.group_size
        plans: list[GroupPlan] = []
        while (
            fleet.in_flight + (len(plans) + 1) * group_size <= self.in_flight_limit
            and fleet.open_groups + len(plans) < self.max_open_groups
        ):
            plans.append(self.schedule.group(self.groups_created, step=self.state.step))
            self.groups_created += 1
        return plans

    # -- one step ------------------------------------------------------------------------------------
    async def _step(self, groups: list[Group], *, since: float) -> dict[str, Any]:
        cfg = self.config
        t0 = time.monotonic()
        # The previous checkpoint must be whole before this step changes the weights it holds.
        checkpoint_wait_s = await self.checkpointer.written()
        version = self.state.step
        batch = prepare_step(groups, version, cfg.trainer, cfg.algorithm)
        async_mode = cfg.trainer.mode == "async"
        # Async: generation waits while the trainer computes (the engine shares the machine).
        # Sync: nothing is in flight now; publish pauses for the swap itself.
        paused_at = time.monotonic()
        async with self.fleet.paused() if async_mode else contextlib.nullcontext():
            drain_s = time.monotonic() - paused_at
            # Nothing generates until the publish below, which sends every weight (not so with LoRA:
            # only the adapted layers): an in-process engine's copy is freed for the step's peak.
            released = async_mode and cfg.trainer.lora is None and await self.fleet.release_engine_weights()
            if released:
                allocator.release()
            longest = max((len(s) for s in batch.samples), default=0)
            trained_at = time.monotonic()
            try:
                train_metrics = await asyncio.to_thread(
                    self.policy.train_step,
                    batch.samples,
                    cfg.algorithm,
                    temperature=cfg.trainer.temperature,
                    micro_batch_tokens=max(cfg.trainer.micro_batch_tokens, longest),
                )
            except Exception:
                if released:  # the engine gets back the weights it had (the step did not change them)
                    await self.fleet.publish(version, self.policy)
                raise
            train_step_s = time.monotonic() - trained_at
            await self.fleet.publish(version + 1, self.policy)
            allocator.release()  # the step's activations and the weights' copy, back to the system
        pause_s = time.monotonic() - paused_at

        self.state.step = version + 1
        self.state.consumed_groups.extend(g.group_id for g in groups)
        # Each consumed rollout learns the step that trained it and the advantage its samples got (0
        # in a zero-variance group; None when no token of it was trained: dropped as stale, an
        # infrastructure failure, no recorded call).
        advantages = {s.rollout_id: s.advantage for s in batch.samples if s.advantage is not None}
        await self.fleet.record_trained(version + 1, groups, advantages)
        wall = max(1e-9, time.monotonic() - since)
        metrics: dict[str, Any] = {
            **batch.metrics,
            "throughput/tokens_per_s": batch.generated_tokens / wall,
            "time/step_s": wall,
            "time/train_s": time.monotonic() - t0,
            "time/train_step_s": train_step_s,  # forward, backward and optimizer step only
            "time/pause_s": pause_s if async_mode else 0.0,
            "time/drain_s": drain_s if async_mode else 0.0,
            "time/checkpoint_wait_s": checkpoint_wait_s,
            "policy_version": version + 1,
            **train_metrics,
        }
        # The row goes into the checkpoint too: a kill before the row is written loses nothing.
        self.state.row = clean_row(metrics)
        await self.checkpointer.save(self.state)
        return metrics

    # -- evaluation ----------------------------------------------------------------------------------
    def _evaluation_due(self, step: int) -> bool:
        return evaluation_due(self.config.trainer, step, heldout=bool(self.heldout))

    def _evaluation_pending(self, step: int) -> bool:
        return evaluation_pending(
            self.config.trainer, self.state, heldout=bool(self.heldout), has_row=self.metrics.has_row(step)
        )

    async def _evaluate(self, step: int) -> dict[str, Any]:
        self.metrics.phase(f"held-out evaluation at step {step} ({len(self.heldout)} tasks)", announce=True)
        plan = self.schedule.evaluation(step, self.heldout, eval_sampling(self.config.trainer))
        await self.fleet.submit([plan])
        # Training rollouts keep being admitted while it runs (not after the last step: nothing would
        # train them): otherwise all in flight end during the evaluation and the next step's whole
        # admission starts at once, its agents' start-up competing with that step's training.
        top_up = self._top_up if step < self.config.trainer.steps else None
        group = await self.fleet.finished(plan, top_up=top_up)
        self.state.evaluated_steps.append(step)
        return heldout_metrics(group, self.heldout_overlap)
