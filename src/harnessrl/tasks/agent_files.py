"""Reading a file the agent left in its workspace, which is hostile: never through a link (to a host
file, to ``/dev/zero``), only from a regular file (a FIFO opened ``O_NONBLOCK`` is refused before any
read could block; a directory, socket or device too), and never more than asked for.

Scorers that read such a file must turn every failure into the policy's 0, never an exception: an
exception is the scorer's failure, which the controller retries and leaves out of the baseline, so
the agent could make its 0 "not counted" by what it leaves in its workspace (docs/evaluators.md).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class NotARegularFile(OSError):
    """The path is a directory, FIFO, socket or device."""


def read_agent_file(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of ``path``. ``FileNotFoundError`` when there is nothing there,
    ``NotARegularFile`` for anything but a regular file, another ``OSError`` for a link (``ELOOP``)
    or a failed read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # before any read: a directory or FIFO opens fine
            raise NotARegularFile(errno.EINVAL, "not a regular file", str(path))
        parts, remaining = [], limit
        while remaining > 0 and (chunk := os.read(fd, remaining)):
            parts.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)
    return b"".join(parts)
