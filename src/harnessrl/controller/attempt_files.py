"""What an attempt leaves in its folder: the scratch removed when ``keep_workspaces`` is off, and the
log tails the controller reads back (the evaluator's view of stdout, the stderr kept with a rollout).

The folder is ``RUN_DIR/rollouts/ROLLOUT_ID/attempt-N/`` (``Controller._attempt_dir``).
"""

from __future__ import annotations

import os
from pathlib import Path

from harnessrl.sandbox.disk import remove_tree

#: What of an attempt's folder is scratch, removed when ``keep_workspaces`` is off: the workspace and
#: the harness's ``$HOME`` (either can hold whatever the harness wrote: 50 MB in ``$HOME/blob`` stayed
#: behind when only the workspace was removed). The logs, the task file and the sandbox spec stay:
#: ``metadata.log_dir`` names them for whoever looks into a rollout.
ATTEMPT_SCRATCH = ("workspace", "home")


def discard_attempt_scratch(attempt_dir: Path) -> None:
    """Remove an attempt's scratch folders (``ATTEMPT_SCRATCH``) with ``sandbox.disk.remove_tree``:
    through folder descriptors, so a tree nested past ``PATH_MAX`` goes too, and without recursion
    (Python 3.11's ``shutil.rmtree`` recurses: a workspace 3,000 folders deep raised ``RecursionError``
    here, and the rollout became a controller error). Never raises ``OSError``; what cannot be
    removed stays."""
    for name in ATTEMPT_SCRATCH:
        remove_tree(attempt_dir / name)


#: The end of the harness's stdout an evaluator gets (``EvaluationInput.stdout``): a harness may print
#: without bound (its memory cap does not bound a file), and all of it was read into the controller,
#: which every rollout shares, on its event loop.
STDOUT_FOR_EVALUATOR_BYTES = 1 << 20


def file_tail(path: Path, max_bytes: int) -> str:
    """The last ``max_bytes`` of ``path`` as text (undecodable bytes replaced); "" if there is none."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def log_tail(attempt_dir: Path, *, max_chars: int = 600) -> str:
    """The last lines of the harness's stderr (Kubernetes: the merged pod log): what a harness that
    failed before the policy had a say printed, kept with the rollout so a run can tell that every
    rollout of a step failed the same way (``trainer.failures.common_failure``)."""
    for name in ("stderr.log", "stdout.log"):
        tail = file_tail(attempt_dir / name, max_chars)
        if tail:
            return tail.strip()[-max_chars:]
    return ""
