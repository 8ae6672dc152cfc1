"""The harness's own logs of a rollout: its ``stdout.log`` and ``stderr.log``, one pair per attempt.

The controller writes them to ``RUN_DIR/rollouts/ROLLOUT_ID/attempt-N/`` (``Controller._attempt_dir``).
The dashboard serves them read-only, and never builds a path from what a request says: the rollout
is looked up in the store (an unknown id is a 404), the attempt must be one it had, the stream one
of ``STREAMS``, and the file found must be a regular file (not a link) inside ``RUN_DIR/rollouts``.
A harness can write anything to its logs, so they are answered as ``text/plain`` that browsers may
not sniff as HTML, and only their last ``MAX_LOG_BYTES`` (where a failure's reason usually is).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from harnessrl.errors import NotFound
from harnessrl.schemas import Rollout

STREAMS = ("stdout", "stderr")
#: An attempt's folder as the controller names it (``attempt-N``, N written without leading zeros).
_ATTEMPT_DIR = re.compile(r"attempt-(0|[1-9][0-9]*)")
MAX_LOG_BYTES = 1 << 20  # 1 MiB: the tail of a longer log, said so on its first line


@dataclass(frozen=True, slots=True)
class LogFile:
    attempt: int
    stream: str  # one of STREAMS
    size: int  # bytes


def log_path(run_dir: Path, rollout: Rollout, attempt: int, stream: str) -> Path:
    """The log file of a stored rollout's attempt; ``NotFound`` unless it is a regular file where the
    controller writes logs (an id or a link leading out of ``RUN_DIR/rollouts`` is refused)."""
    if stream not in STREAMS or not 0 <= attempt <= rollout.attempt:
        raise NotFound(f"rollout {rollout.rollout_id!r} has no {stream!r} log of attempt {attempt}")
    root = (run_dir / "rollouts").resolve()
    path = root / rollout.rollout_id / f"attempt-{attempt}" / f"{stream}.log"
    if path.is_symlink() or not path.resolve().is_relative_to(root) or not path.is_file():
        raise NotFound(f"rollout {rollout.rollout_id!r} has no {stream} log of attempt {attempt}")
    return path


def attempt_logs(run_dir: Path | None, rollout: Rollout) -> list[LogFile]:
    """The logs there are of each of a rollout's attempts (none where the run folder is unknown).

    The attempts are those with a folder the controller made (``attempt-N``, N up to the rollout's
    attempt), never ``range(rollout.attempt + 1)``: a stored attempt is only a number (a damaged row
    holding 10**9 hung the trace page, and each refresh took another server thread)."""
    if run_dir is None:
        return []
    try:
        names = os.listdir(run_dir / "rollouts" / rollout.rollout_id)
    except (OSError, ValueError):  # no logs, or an id no path can hold (a NUL): none to link
        return []
    numbers = (int(name.removeprefix("attempt-")) for name in names if _ATTEMPT_DIR.fullmatch(name))
    attempts = sorted(n for n in numbers if n <= rollout.attempt)
    found = []
    for attempt in attempts:
        for stream in STREAMS:
            try:
                size = log_path(run_dir, rollout, attempt, stream).stat().st_size
            except (NotFound, OSError):
                continue
            found.append(LogFile(attempt, stream, size))
    return found


def read_log_tail(path: Path, limit: int = MAX_LOG_BYTES) -> str:
    """A log's text, or its last ``limit`` bytes after a line saying how much was left out. The file
    is opened without following links, so one swapped in after ``log_path`` checked is refused too."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size > limit:
            file.seek(size - limit)
        data = file.read(limit)
    head = f"[first {size - limit} of {size} bytes not shown]\n" if size > limit else ""
    return head + data.decode("utf-8", errors="replace")
