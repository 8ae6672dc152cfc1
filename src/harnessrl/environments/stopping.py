"""Stopping image builds when the work that waits on them stops.

A build runs in a worker thread (``asyncio.to_thread``) that waits on ``podman build`` or
``mmdebstrap``. Cancelling the awaiting task (Ctrl-C, SIGTERM, a controller shutting down) leaves
that thread building, and ``asyncio.run``'s shutdown waits for it — for the build, up to
``build_timeout_s`` (30 min), with the run folder, the build's scratch and its processes still there.

``in_thread_stoppably`` runs a function in a worker thread under a ``processes.BuildStop`` of its
own: once its task is cancelled, that thread's build, pull, import or ``mmdebstrap`` is killed with
all it started (and its wait for another process's build lock ends), and the thread is awaited.
Only that work's commands go: another task's build in this process (another rollout's image built
on demand) goes on. ``kill_builds_until_threads_end`` stops a command as a whole: it kills every
long container-tool command this process runs (``kill_own_builds``, found by the mark
``processes.tool_env`` gives each: ``HARNESSRL_TOOL_OWNER`` naming this process) until its default
executor's threads have ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from harnessrl.environments.podman import Podman
from harnessrl.environments.processes import (
    OWNER_ENV,
    STORE_ENV,
    BuildStop,
    is_long_command,
    kill_tree,
    marks,
    owner,
    session,
    stoppable,
)

T = TypeVar("T")

#: A stopped thread may start another command after a kill (between two): kill again this often.
KILL_AGAIN_S = 2.0


async def in_thread_stoppably(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a worker thread that stops with its task: once cancelled, the builds this
    call started are killed with all they started (a ``BuildStop`` of its own: ``processes.stoppable``),
    and so are those it starts later, and the thread is awaited (its build failed, its scratch
    removed) before the ``CancelledError`` goes on. Other work's builds in this process go on."""
    stop = BuildStop()

    def run() -> T:
        with stoppable(stop):
            return fn(*args)

    work = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        stop.stop()
        await asyncio.wait([work])
        if not work.cancelled():
            work.exception()  # retrieved: the stopped build's error is no news after a stop
        raise


async def kill_builds_until_threads_end() -> None:
    """Shut asyncio's default executor down (wait for its worker threads, as ``asyncio.run`` does on
    its way out) while killing this process's builds: a command that stopped calls this, so a thread
    still waiting on an image build (a rollout's image built on demand) ends now, not after it."""
    loop = asyncio.get_running_loop()
    threads = asyncio.ensure_future(loop.shutdown_default_executor())
    while not threads.done():
        kill_own_builds()
        await asyncio.wait([threads], timeout=KILL_AGAIN_S)
    await threads


def kill_own_builds() -> None:
    """Kill every build, pull, import or ``mmdebstrap`` this process started with everything it
    started (``processes.kill_tree``: ``RUN`` steps in sessions of their own too), and remove the
    working containers the killed steps ran on. The worker thread that waits on the command sees it
    fail."""
    me, mine = owner(), os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == mine:
            continue
        pid = int(entry)
        found = marks(pid)
        # Each command leads a session of its own; a child that only inherited the marks goes with it.
        if found.get(OWNER_ENV) != me or session(pid) != pid or not _is_long_command(pid):
            continue
        layers = kill_tree(_OwnCommand(pid))
        if layers and found.get(STORE_ENV):
            with contextlib.suppress(Exception):  # best effort: the store's next prune removes them
                Podman(Path(found[STORE_ENV])).remove_containers_on(layers)


class _OwnCommand:
    """``kill_tree``'s view of a command another thread of this process started (and reaps: its
    ``Popen`` there waits on it, so it is not waited for here)."""

    def __init__(self, pid: int):
        self.pid = pid

    def wait(self) -> None:
        return None


def _is_long_command(pid: int) -> bool:
    """Whether a process is a long container-tool command (``processes.is_long_command``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return is_long_command(argv)
