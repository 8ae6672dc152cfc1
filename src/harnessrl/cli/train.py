"""``harnessrl train``: parse and validate the run's config before importing torch, prepare the run
folder (``trainer.run_setup.open_run``: refusing to overwrite one without ``--resume``, and holding
it, so a second process on the same folder is refused), then hand over to the trainer. A start-up
that fails before the first step removes the folder it created for a new run.

SIGINT (Ctrl-C) and SIGTERM (``kill``, a Kubernetes pod being deleted, systemd) stop a run the same
clean way: the trainer's task is cancelled, so its harness processes are killed, the gateway closes,
a checkpoint being written is finished, rollouts left in flight are requeued for ``--resume``, and
the command exits 128 + the signal's number. A second signal of either kind acts at once. A SIGINT
the process was started ignoring (a job of a non-interactive shell: ``cmd &``) stays ignored. A
signal that stops a new run before its first step (importing torch, loading the model) removes its
folder as a failed start-up does: there is nothing to resume, the same command starts it again.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from harnessrl.stop_signals import Signalled, until_signalled
from harnessrl.trainer.checkpoint import repair_numbered
from harnessrl.trainer.failures import StepFailed
from harnessrl.trainer.interrupted import RunInterrupted, start_up_terminated
from harnessrl.trainer.loop import finished_at, restore_final
from harnessrl.trainer.run_setup import open_run


def run_train(config_path: str | None, resume: str | None, overrides: list[str]) -> dict[str, Any]:
    run = open_run(config_path, resume, overrides)
    config, run_dir = run.config, run.run_dir
    trainer = None
    # SIGTERM during the start-up before the event loop's handlers (importing torch, building the
    # trainer) stops it as SIGINT does there, instead of killing the process with its folder left.
    previous_sigterm = signal.signal(signal.SIGTERM, start_up_terminated(run_dir))
    with run.folder:  # held until the run ends: a second process on this folder is refused
        try:
            # Finished: its last checkpoint at trainer.steps and no evaluation pending there (a final
            # held-out evaluation cut short by a stop still runs).
            done = finished_at(run_dir, config, heldout=bool(run.heldout)) if resume else None
            if done is not None:
                # A kill after the last step's checkpoint but before checkpoints/final was written
                # (the run's end): the final weights are that checkpoint's, copied now.
                repair_numbered(run_dir, config.trainer.save_every)  # a kill mid-copy at the last step
                if restore_final(run_dir, done):
                    print(
                        f"harnessrl: {run_dir / 'checkpoints' / 'final'} written (step {done})",
                        file=sys.stderr,
                    )
                # Nothing to train: say so (and how to go on) instead of starting and stopping silently.
                print(
                    f"harnessrl: {run_dir} already finished its {config.trainer.steps} steps (checkpoint at "
                    f"step {done}); to train further: harnessrl train --resume {run_dir} "
                    f"--set trainer.steps={done + 10}",
                    file=sys.stderr,
                )
                return {"run_dir": str(run_dir), "steps": done, "already_finished": True}
            print(
                f"harnessrl: {'resuming' if resume else 'training'} in {run_dir} (loading the model...)",
                file=sys.stderr,
            )
            quiet_third_party_bars()
            from harnessrl.trainer import allocator

            allocator.tune()  # before the model's tensors: big blocks mmapped, at most 2 arenas
            from harnessrl.trainer.run import Trainer

            trainer = Trainer(
                config,
                run_dir,
                resume=bool(resume),
                base_dir=run.base_dir,
                tasks=run.tasks,
                heldout=run.heldout,
            )
            summary = asyncio.run(_until_signalled(trainer.run(), run_dir))
        except RunInterrupted as exc:
            if resume or (trainer is not None and trainer.started):
                raise  # stopped on purpose: the folder is what the printed --resume continues
            # A new run stopped before its first step: nothing to continue, removed as a failed
            # start-up is, so the same command starts it again (not "already exists").
            run.folder.discard()
            raise RunInterrupted(exc.signum, run_dir, discarded=True) from None
        except StepFailed as exc:
            raise StepFailed(
                f"{exc}\n  the run stopped: fix the cause, then continue it (the failed groups are left out) "
                f"with: harnessrl train --resume {run_dir} --set section.key=value"
            ) from None
        except BaseException:
            if trainer is None or not trainer.started:
                # A start-up that failed before the first step leaves nothing behind (a resumed folder
                # is never removed): the fixed command starts the run afresh, not "already exists".
                run.folder.discard()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous_sigterm)
    print(next_commands(run_dir, tensorboard=config.metrics.tensorboard), file=sys.stderr)
    return summary


def quiet_third_party_bars() -> None:
    """transformers draws a "Loading weights" / "Writing model shards" bar on every checkpoint load
    and save; with stderr not a terminal (a log file, CI) each one is a screenful of carriage
    returns per step. Off there, kept in a terminal."""
    if not sys.stderr.isatty():
        import os

        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        try:
            from transformers.utils import logging as hf_logging
        except ImportError:
            return
        hf_logging.disable_progress_bar()


def next_commands(run_dir: Path, *, tensorboard: bool) -> str:
    """The closing lines of a run: where its results are and the commands that show them."""
    lines = [
        f"harnessrl: done; metrics {run_dir / 'metrics.jsonl'}, checkpoints {run_dir / 'checkpoints'}",
        f"  dashboard:   harnessrl dashboard --run-dir {run_dir}",
    ]
    if tensorboard:
        lines.append(f"  tensorboard: tensorboard --logdir {run_dir / 'tensorboard'}")
    lines.append(f"  train on:    harnessrl train --resume {run_dir} --set trainer.steps=N")
    return "\n".join(lines)


async def _until_signalled(work: Any, run_dir: Path) -> Any:
    """Await ``work``; on SIGINT or SIGTERM cancel it (its ``finally`` blocks do the clean shutdown)
    and raise ``RunInterrupted``. A second signal gets the default action: a shutdown that hangs can
    still be ended from the keyboard."""
    try:
        return await until_signalled(work)
    except Signalled as exc:
        raise RunInterrupted(exc.signum, run_dir) from None
