"""Finding the processes a test started, and waiting for a state, without fixed sleeps.

``processes_running`` finds live processes by a marker in their command line (a random token the
test put there, or a fake tool's path): never by a program's name, which other work on the machine
shares. ``wait_for`` polls a condition until it holds; its limit only ends a hung test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

#: How long ``wait_for`` waits by default: long enough for a loaded machine, ending only a hung test.
WAIT_S = 120.0


def processes_running(*markers: str) -> list[int]:
    """PIDs of live processes (not zombies) whose command line holds any of ``markers``."""
    needles = [m.encode() for m in markers]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(n in cmdline for n in needles):
            found.append(int(entry.name))
    return found


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Return once ``ready()`` holds; ``AssertionError`` naming ``what`` after ``timeout_s``."""
    pause = threading.Event()
    for _ in range(int(timeout_s * 10)):
        if ready():
            return
        pause.wait(0.1)
    raise AssertionError(f"gave up waiting for {what}")
