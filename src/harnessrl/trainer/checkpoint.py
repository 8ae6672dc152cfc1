"""Crash-safe checkpoints of a training run: weights, optimizer and trainer state in one folder.

After a step, ``checkpoints/latest`` holds the weights, the optimizer state and ``TrainState`` (the
step and the groups it consumed), swapped in atomically (written to ``latest.new``, synced to disk,
then renamed), so ``--resume`` never sees half of one, even after a power loss. ``save_every`` also
keeps numbered copies without optimizer.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "harnessrl_state.json"


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done == policy version
    consumed_groups: list[str] = field(default_factory=list)
    evaluated_steps: list[int] = field(default_factory=list)
    #: The training metrics of ``step`` (its metrics row without a held-out evaluation's): a kill
    #: after the checkpoint was whole but before the row was written (during the step's evaluation,
    #: which the row waits for) lost them; a resumed run writes them in that row (``TrainingLoop.run``).
    row: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> TrainState:
        return cls(**json.loads(text))


def latest_checkpoint(run_dir: Path) -> Path | None:
    for name in ("latest", "latest.old"):
        folder = run_dir / "checkpoints" / name
        if (folder / STATE_FILE).exists():
            return folder
    return None


def write_checkpoint(policy: Any, state: TrainState, run_dir: Path, *, save_every: int) -> None:
    """Weights + optimizer + trainer state in one folder, swapped in atomically."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    latest, old = root / "latest", root / "latest.old"
    staging = root / "latest.new"
    policy.save_checkpoint(staging)
    (staging / STATE_FILE).write_text(state.to_json())
    # On disk before the renames: after a power loss ``latest`` must name a whole folder, not one
    # whose files were still in the page cache.
    sync_tree(staging)
    if latest.exists():
        if old.exists():
            shutil.rmtree(old)
        latest.rename(old)
    staging.rename(latest)
    sync_path(root)  # the renames themselves
    if old.exists():
        shutil.rmtree(old)
    if save_every and state.step % save_every == 0:
        numbered = root / f"step-{state.step:05d}"
        if numbered.exists():
            shutil.rmtree(numbered)
        shutil.copytree(latest, numbered, ignore=shutil.ignore_patterns("trainer_state.pt"))


def sync_path(path: Path) -> None:
    """``fsync`` a file or a folder (a folder's: its entries, e.g. a rename in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(folder: Path) -> None:
    """``fsync`` every file under ``folder``, then every folder in it and itself."""
    paths = sorted(folder.rglob("*"))
    for path in paths:
        if path.is_file():
            sync_path(path)
    for path in [*(p for p in paths if p.is_dir()), folder]:
        sync_path(path)


class Checkpointer:
    """Writes each step's checkpoint, in a thread while the next rollouts generate when it may.

    Writing ~12 bytes per parameter takes seconds. One process writes it in the background; the
    next step waits for it (``written``) before it changes the weights, so they cannot change under
    it. A kill before it is whole resumes from the step before and trains this step again from the
    same stored rollouts. The ranks of a distributed run write it together (collectives), in step,
    so there it is written in the foreground.
    """

    def __init__(self, policy: Any, run_dir: Path, *, save_every: int, background: bool) -> None:
        self.policy = policy
        self.run_dir = run_dir
        self.save_every = save_every
        self.background = background
        self._task: asyncio.Task[None] | None = None

    async def save(self, state: TrainState) -> None:
        snapshot = TrainState.from_json(state.to_json())  # the state as of this step
        task = asyncio.create_task(
            asyncio.to_thread(
                write_checkpoint, self.policy, snapshot, self.run_dir, save_every=self.save_every
            )
        )
        if self.background:
            self._task = task
        else:
            await task

    async def written(self) -> float:
        """Wait for the checkpoint being written; returns the seconds waited.

        The write is shielded from a cancelled wait (Ctrl-C / SIGTERM while a step waits for it) and
        stays pending until it ended, so the run's way out waits for it again instead of finding
        nothing to wait for while the thread still writes."""
        task = self._task
        if task is None:
            return 0.0
        started = time.monotonic()
        try:
            await asyncio.shield(task)
        finally:
            if task.done() and self._task is task:
                self._task = None  # its error, if any, is raised once (here)
        return time.monotonic() - started
