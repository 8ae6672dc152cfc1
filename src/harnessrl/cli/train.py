"""``harnessrl train``: parse and validate the run's config before importing torch, prepare the run
folder (``trainer.run_setup.prepare_run``: refusing to overwrite one without ``--resume``), then
hand over to the trainer.

SIGINT (Ctrl-C) and SIGTERM (``kill``, a Kubernetes pod being deleted, systemd) stop a run the same
clean way: the trainer's task is cancelled, so its harness processes are killed, the gateway closes,
a checkpoint being written is finished, rollouts left in flight are requeued for ``--resume``, and
the command exits 128 + the signal's number. A second signal of either kind acts at once. A SIGINT
the process was started ignoring (a job of a non-interactive shell: ``cmd &``) stays ignored.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from harnessrl.errors import HarnessRLError
from harnessrl.trainer.run_setup import prepare_run


def run_train(config_path: str | None, resume: str | None, overrides: list[str]) -> dict[str, Any]:
    config, run_dir, base_dir = prepare_run(config_path, resume, overrides)
    from harnessrl.trainer.run import Trainer

    trainer = Trainer(config, run_dir, resume=bool(resume), base_dir=base_dir)
    return asyncio.run(_until_signalled(trainer.run(), run_dir))


class RunInterrupted(HarnessRLError):
    """A signal stopped the run after a clean shutdown; ``exit_code`` is the shell's 128 + signal."""

    def __init__(self, signum: int, run_dir: Path):
        name = signal.Signals(signum).name
        super().__init__(f"{name}: run stopped; continue it with: harnessrl train --resume {run_dir}")
        self.exit_code = 128 + signum


async def _until_signalled(work: Any, run_dir: Path) -> Any:
    """Await ``work``; on SIGINT or SIGTERM cancel it (its ``finally`` blocks do the clean shutdown)
    and raise ``RunInterrupted``. The handlers are removed on the first signal, so a second one gets
    the default action: a shutdown that hangs can still be ended from the keyboard."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []
    # Respect an inherited "ignore SIGINT" as Python itself does; SIGTERM is always handled.
    handled = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]

    def on_signal(signum: int) -> None:
        received.append(signum)
        for each in handled:
            loop.remove_signal_handler(each)
        task.cancel()

    for signum in handled:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await work
    except asyncio.CancelledError:
        if not received:
            raise
        task.uncancel()
        raise RunInterrupted(received[0], run_dir) from None
    finally:
        if not received:
            for signum in handled:
                loop.remove_signal_handler(signum)
