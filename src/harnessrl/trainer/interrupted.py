"""How a training run stopped by a signal ends, shared by ``harnessrl train`` (``cli.train``) and
torchrun's rank 0 (``trainer.torchrun``): ``RunInterrupted`` says how to go on, and
``start_up_terminated`` stops a start-up that has no event loop yet (importing torch, loading the
model) the same way."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

from harnessrl.errors import HarnessRLError

#: The command that continues a run, per entry point (``{run_dir}`` filled in).
RESUME_COMMANDS = {
    "train": "harnessrl train --resume {run_dir}",
    "torchrun": "torchrun --nproc_per_node N -m harnessrl.trainer.torchrun --resume {run_dir}",
}


class RunInterrupted(HarnessRLError):
    """A signal stopped the run after a clean shutdown; ``exit_code`` is the shell's 128 + signal.
    ``discarded``: it stopped a new run before its first step, whose folder was removed (there is
    nothing to resume: the same command starts it again). ``entry``: ``RESUME_COMMANDS``' key."""

    def __init__(self, signum: int, run_dir: Path, *, discarded: bool = False, entry: str = "train"):
        self.signum = signum
        self.entry = entry
        name = signal.Signals(signum).name
        if discarded:
            message = (
                f"{name}: run stopped while starting; nothing was kept in {run_dir} (run the command again)"
            )
        else:
            resume = RESUME_COMMANDS[entry].format(run_dir=run_dir)
            message = f"{name}: run stopped; continue it with: {resume}"
        super().__init__(message)
        self.exit_code = 128 + signum


def start_up_terminated(run_dir: Path, *, entry: str = "train") -> Callable[[int, object], None]:
    """The SIGTERM handler of the start-up: raises ``RunInterrupted``; a second SIGTERM acts at once."""

    def handler(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise RunInterrupted(signum, run_dir, entry=entry)

    return handler
