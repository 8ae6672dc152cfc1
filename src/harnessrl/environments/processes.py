"""Killing a command with everything it started, for the container tool's timeouts.

``podman build`` runs each ``RUN`` step under runc, which makes the step's process a session leader
of its own: killing podman's process group leaves it running (re-parented to init, spinning
forever). ``kill_tree`` walks ``/proc`` for every descendant instead, stops them all first (so none
forks a child between the listing and the kill), kills them, and says which overlay layers they
ran on (a build's working containers, which the caller then removes).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path


def _parents() -> dict[int, int]:
    """pid -> parent pid, for every process here."""
    table: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            table[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return table


def _root_layer(pid: int) -> str:
    """The overlay layer a process runs on (``upperdir=<graphroot>/overlay/<layer>/diff`` of its
    ``/``), or ""."""
    try:
        for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[4] == "/" and "upperdir=" in line:
                match = re.search(r"upperdir=([^,\s]+)/diff", line)
                return Path(match.group(1)).name if match else ""
    except OSError:
        pass
    return ""


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        for child in children.get(current, []):
            out.append(child)
            todo.append(child)
    return out


def _signal(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def kill_tree(process: subprocess.Popen[str]) -> frozenset[str]:
    """Kill ``process`` (a session leader) and every process it started, also those that left its
    session (a build's ``RUN`` step: runc makes it a session leader, so killing the process group is
    not enough). Returns the overlay layers the killed processes ran on."""
    # Stopped first, so that nothing forks a child between the listing and the kill.
    seen = [process.pid, *_descendants(process.pid)]
    _signal(seen, signal.SIGSTOP)
    seen += [pid for pid in _descendants(process.pid) if pid not in seen]
    layers = frozenset(layer for layer in map(_root_layer, seen) if layer)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    _signal(seen, signal.SIGKILL)
    process.wait()
    return layers
