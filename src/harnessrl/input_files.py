"""Files a config names (tasks, a corpus) opened only if they are regular files.

A FIFO given as a task file or a corpus held the start forever, waiting for a writer, and a device
(``/dev/zero``) was read without end. ``open_regular`` opens without blocking first, then checks
what it opened: anything but a regular file is ``OSError`` (``EINVAL``), which each reader names as
its own config error. A link to a regular file is followed: these paths come from the user's config,
not from the policy's workspace (files the policy wrote are opened ``O_NOFOLLOW``: ``sandbox.copy``,
``tasks.agent_files``).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for reading in binary if it is a regular file, else ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path) -> bytes:
    """The bytes of ``path`` if it is a regular file, else ``OSError``."""
    with open_regular(path) as f:
        return f.read()
