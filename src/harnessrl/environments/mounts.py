"""Records of the image mounts a process holds, so the mounts of a killed process are given back.

podman counts an image's mounts in its run state, so a process that dies without unmounting
(SIGKILL, OOM) would keep its mount counted for good: no later unmount brings the count to zero,
and prune reports the image ``in_use`` until a reboot. Each mount is therefore recorded beside
podman's run state (``<runroot>/harnessrl-mounts/<image id>.<pid>.<start time>.<pid namespace>.<token>``,
a tmpfs that a reboot empties together with podman's counts), and ``give_back_stale`` unmounts once
for every record whose process is gone. Only records of the reader's own PID namespace are judged: a
pid of another (a controller in a container that shares the store and ``/run``) names another
process here, or none, and reading it so unmounted images from under running sandboxes.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from harnessrl.environments.podman import Podman
from harnessrl.environments.processes import pid_namespace, started


class MountRecords:
    """The mount records of one image store (``podman``'s run state), as this process writes them."""

    def __init__(self, podman: Podman) -> None:
        self.podman = podman
        self.folder = podman.runroot / "harnessrl-mounts"
        self._token = secrets.token_hex(4)  # this object's records, apart from another store's

    def path(self, image_id: str) -> Path:
        """This process's record of its mount of ``image_id``."""
        pid = os.getpid()
        return self.folder / f"{image_id}.{pid}.{started(pid)}.{pid_namespace()}.{self._token}"

    def add(self, image_id: str) -> None:
        """Record a mount, after it was made: a process killed in between leaves one mount counted,
        never a record that would give back someone else's."""
        record = self.path(image_id)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.touch()

    def remove(self, image_id: str) -> None:
        """Forget a mount, before it is given back: a process killed in between leaves one mount
        counted, never a record that would make another process unmount again."""
        self.path(image_id).unlink(missing_ok=True)

    def give_back_stale(self) -> None:
        """Unmount once for every mount recorded by a process that is gone (killed before it gave its
        mounts back). A record is claimed by removing it, so two processes never give the same mount
        back twice."""
        try:
            records = list(self.folder.iterdir())
        except OSError:
            return
        own = pid_namespace()
        for record in records:
            parts = record.name.split(".")
            if len(parts) != 5 or parts[3] != own or not parts[1].isdigit():
                # Another PID namespace's (a controller in a container sharing the store and /run):
                # its pids mean other processes here, so whether it lives cannot be told. Kept.
                continue
            image_id, pid, start = parts[0], int(parts[1]), parts[2]
            if started(pid) == start:
                continue  # its process is alive: its mount is in use
            try:
                record.unlink()
            except FileNotFoundError:
                continue  # another process gave it back meanwhile
            self.podman.unmount(image_id, force=False)
