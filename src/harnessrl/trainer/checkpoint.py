"""Crash-safe checkpoints of a training run: weights, optimizer and trainer state in one folder.

After a step, ``checkpoints/latest`` holds the weights, the optimizer state and ``TrainState`` (the
step and the groups it consumed), swapped in atomically (written to ``latest.new``, synced to disk,
then renamed), so ``--resume`` never sees half of one, even after a power loss. ``save_every`` also
keeps numbered copies without optimizer (``checkpoints/step-NNNNN``), written the same way: copied to
a hidden ``.step-NNNNN.partial`` beside it, synced, then renamed. A kill during that copy left a
half-written ``step-NNNNN`` that a resume (which goes on from ``latest``, the copy's source, at the
next step) never rewrote and ``harnessrl export`` took for a whole one; the next checkpoint write
(and a resume of a finished run) now removes such leftovers and copies again a numbered checkpoint
of ``latest`` that is missing or not whole (``repair_numbered``).
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

from harnessrl.errors import HarnessRLError

STATE_FILE = "harnessrl_state.json"
#: The optimizer, LR schedule and generator state of ``latest`` (``Policy.save_checkpoint``).
TRAINER_STATE_FILE = "trainer_state.pt"
#: What a numbered copy leaves out of ``latest``: the optimizer state (it is a weights snapshot).
NUMBERED_SKIPS = ("trainer_state.pt",)
PARTIAL_SUFFIX = ".partial"


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


class CheckpointUnreadable(HarnessRLError):
    """A checkpoint file that cannot be loaded (damaged, or not what this run writes)."""


def read_trainer_state(folder: Path) -> dict[str, Any]:
    """``folder``'s trainer state, loaded: a dict with the ``optimizer`` and ``scheduler`` state.
    ``CheckpointUnreadable`` names the file when it is damaged (a copy cut short, a bad disk) or
    holds something else, instead of a pickle or zip traceback from deep inside torch."""
    import torch  # only a resume needs it: everything else here is files only

    path = folder / TRAINER_STATE_FILE
    remedy = "delete it to resume with the optimizer and LR schedule started afresh"
    try:
        state = torch.load(path, weights_only=False)
    except Exception as exc:  # torch.load's ways to fail on a bad file: pickle, zip, EOF, RuntimeError
        raise CheckpointUnreadable(
            f"{path} cannot be loaded ({type(exc).__name__}: {exc}); {remedy}"
        ) from exc
    if not (isinstance(state, dict) and isinstance(state.get("optimizer"), dict) and "scheduler" in state):
        raise CheckpointUnreadable(f"{path} is not a trainer state (no optimizer and scheduler); {remedy}")
    return state


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
    repair_numbered(run_dir, save_every)  # before ``latest``, its source, is replaced
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
        write_numbered(root, latest, state.step)


def numbered_name(step: int) -> str:
    return f"step-{step:05d}"


def write_numbered(root: Path, latest: Path, step: int) -> Path:
    """``latest`` copied to ``root/step-NNNNN`` without its optimizer state: into a hidden partial
    folder beside it, synced, then renamed, so a ``step-NNNNN`` folder is always a whole one."""
    numbered = root / numbered_name(step)
    partial = root / f".{numbered.name}{PARTIAL_SUFFIX}"
    if partial.exists():
        shutil.rmtree(partial)
    shutil.copytree(latest, partial, ignore=shutil.ignore_patterns(*NUMBERED_SKIPS))
    sync_tree(partial)
    if numbered.exists():
        shutil.rmtree(numbered)
    partial.rename(numbered)
    sync_path(root)
    return numbered


def repair_numbered(run_dir: Path, save_every: int) -> None:
    """Undo what a kill during a numbered copy left: remove partial copies, and copy ``latest`` again
    where its step is due a numbered copy that is missing or not whole (files or sizes differ from
    ``latest``'s: a half-copied folder the previous, non-atomic copy left). ``latest`` is that copy's
    source until the next checkpoint replaces it, so this runs before one is written and on a resume
    of a finished run. Files only (no torch)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return
    for leftover in root.glob(f".step-*{PARTIAL_SUFFIX}"):
        shutil.rmtree(leftover)
    latest = root / "latest"
    if not save_every or not (latest / STATE_FILE).is_file():
        return
    try:
        step = TrainState.from_json((latest / STATE_FILE).read_text()).step
    except (OSError, ValueError, TypeError):
        return  # not a checkpoint this code wrote: leave it to the reader that loads it
    due = isinstance(step, int) and step > 0 and step % save_every == 0
    if due and _file_sizes(root / numbered_name(step)) != _file_sizes(latest, skip=NUMBERED_SKIPS):
        write_numbered(root, latest, step)


def _file_sizes(folder: Path, *, skip: tuple[str, ...] = ()) -> dict[str, int] | None:
    """Every file under ``folder`` (relative path -> size); None when it is not a folder."""
    if not folder.is_dir():
        return None
    return {
        str(path.relative_to(folder)): path.stat().st_size
        for path in folder.rglob("*")
        if path.is_file() and path.name not in skip
    }


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
