"""``harnessrl sft``: validate the config before importing torch, then fine-tune (``sft.run``) or,
with ``--export-jsonl``, write the selected conversations and stop (no model is loaded).

SIGINT (Ctrl-C) and SIGTERM stop a run as ``train`` stops: the step in progress is abandoned (its
checkpoint swap is atomic, so ``checkpoints/latest`` is the last whole step), metrics are closed,
the run's status is "stopped", and the command exits 128 + the signal's number, naming the
``--resume`` that continues it. A new run stopped before its first step is removed instead, as a
failed start-up is (its ``config.json`` is written once the model loaded: there is nothing to
resume), and the message says to run the command again. A second signal acts at once (the handlers
are removed by the first).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

from harnessrl.errors import HarnessRLError
from harnessrl.sft.run import SftRun, prepare_sft_run
from harnessrl.trainer.run_setup import RunFolder


class SftInterrupted(HarnessRLError):
    """A signal stopped the run; ``exit_code`` is the shell's 128 + signal. ``discarded``: it stopped
    a new run's start-up, whose folder was removed (there is nothing to resume: the same command
    starts it again)."""

    def __init__(self, signum: int, run_dir: Path, *, discarded: bool = False) -> None:
        self.signum = signum
        name = signal.Signals(signum).name
        if discarded:
            message = (
                f"{name}: sft run stopped while starting; nothing was kept in {run_dir} "
                "(run the command again)"
            )
        else:
            message = f"{name}: sft run stopped; continue it with: harnessrl sft --resume {run_dir}"
        super().__init__(message)
        self.exit_code = 128 + signum


def run_sft(
    config_path: str | None, resume: str | None, overrides: list[str], export_jsonl: str | None = None
) -> dict[str, Any]:
    config, run_dir = prepare_sft_run(config_path, resume, overrides, export=export_jsonl is not None)
    if export_jsonl is not None:
        from harnessrl.sft.data import export_conversations

        return export_conversations(config, Path(export_jsonl))  # refuses the source store's own file
    print(
        f"harnessrl: sft {'resuming' if resume else 'training'} in {run_dir} (loading the model...)",
        file=sys.stderr,
    )
    from harnessrl.cli.train import quiet_third_party_bars

    quiet_third_party_bars()
    # Respect an inherited "ignore SIGINT" (a job of a non-interactive shell), as Python does.
    handled = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]
    previous = {s: signal.getsignal(s) for s in handled}

    def on_signal(signum: int, _frame: object) -> None:
        for each, handler in previous.items():
            signal.signal(each, handler)
        raise SftInterrupted(signum, run_dir)

    sft_run = SftRun(config, run_dir, resume=bool(resume))
    folder: RunFolder | None = None
    # Handled from before the folder exists: a signal between its creation and the loop is a stopped
    # start-up too, never a bare KeyboardInterrupt that leaves the folder behind.
    for signum in handled:
        signal.signal(signum, on_signal)
    try:
        # Held until the run ends: a second process on this folder is refused (trainer/run_setup.py).
        folder = RunFolder.hold(run_dir) if resume else RunFolder.create(run_dir)
        summary = sft_run.run()
    except SftInterrupted as exc:
        if sft_run.started or resume:
            raise  # stopped on purpose: the folder is what the printed --resume continues
        # A new run stopped before its first step has no config.json yet (it is written once the
        # model loaded), so there is nothing to resume: remove it as a failed start-up is removed
        # (as `harnessrl train` does), so the same command starts it again.
        if folder is not None:
            folder.discard()
        raise SftInterrupted(exc.signum, run_dir, discarded=True) from None
    except BaseException:
        if folder is not None and not sft_run.started:
            # A start-up that failed before the first step leaves nothing behind (a resumed folder
            # is never removed): the fixed command starts the run afresh, not "already exists".
            folder.discard()
        raise
    finally:
        if folder is not None:
            folder.release()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if summary.get("already_finished"):
        # Nothing to train: say so (and how to go on), as `harnessrl train --resume` does.
        print(
            f"harnessrl: {run_dir} already finished its {summary['steps']} steps ({config.sft.epochs} "
            f"epochs); to train further: harnessrl sft --resume {run_dir} --set sft.epochs={config.sft.epochs + 1}",
            file=sys.stderr,
        )
        return summary
    print(
        f"harnessrl: done; metrics {run_dir / 'metrics.jsonl'}, data report {run_dir / 'sft_data.json'}\n"
        f'  RL from it: set engine.model = "{run_dir / "checkpoints" / "final"}" in a train config',
        file=sys.stderr,
    )
    return summary
