"""The image store's lock files (``<store>/locks/``): what keeps processes sharing one store apart.

- ``build_lock``: one builder per recipe digest (or pulled reference), across processes; a process
  that finds it held waits, then finds the image built. Work under a ``processes.BuildStop`` waits
  stoppably and ends with ``processes.Stopped``, leaving the holder and its build alone.
- ``mounts_lock``: the store-wide mount lock, shared while a run mounts an image, exclusive while
  prune decides what is in use and removes the rest.
- ``unless_building``: prune's look at the build locks, so it never removes the log a running build
  writes.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harnessrl.environments.processes import Stopped, current_stop

#: How often a stoppable wait for another process's build lock tries again.
LOCK_POLL_S = 0.2


def locks_folder(store: Path) -> Path:
    """``<store>/locks``, made if it is not there yet."""
    locks = store / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    return locks


@contextlib.contextmanager
def build_lock(store: Path, digest: str) -> Iterator[None]:
    """Hold the build lock of ``digest`` (one builder per digest, across processes). Work under a
    ``BuildStop`` (``processes.stoppable``) waits for it polling, and a stop ends the wait with
    ``Stopped``: a blocking ``flock`` waited for the other process's whole build."""
    with (locks_folder(store) / f"{digest[:32]}.lock").open("w") as fh:
        stop = current_stop()
        if stop is None:
            fcntl.flock(fh, fcntl.LOCK_EX)
        else:
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if stop.wait(LOCK_POLL_S):
                        raise Stopped("stopped while waiting for another build of the image") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def mounts_lock(store: Path, *, pruning: bool) -> Iterator[None]:
    """The store's mount lock, across processes: shared while a run mounts an image, exclusive while
    prune decides what is in use and removes the rest. Without it a run that mounted an image
    between prune's look at the mounts and its removal had its root unmounted and removed under its
    sandbox (podman's ``rmi`` removes a mounted image)."""
    with (locks_folder(store) / "mounts.lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if pruning else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def unless_building(store: Path, digest16: str) -> Iterator[bool]:
    """Hold the build locks of the digests starting ``digest16`` if none is held (yields True), else
    yield False at once: a build of one goes on."""
    held: list[Any] = []
    try:
        for lock in sorted((store / "locks").glob(f"{digest16}*.lock")):
            fh = lock.open("a")
            held.append(fh)
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
        yield True
    finally:
        for fh in held:
            fh.close()  # closing gives the lock back
