"""What the image store holds and how it gives disk back: harnessrl's images listed (by their
labels, ``naming``), the bytes a folder uses, and prune's removals.

Prune never removes an image a process has mounted (a run using it) unless told to remove every
image: it decides and removes holding the store-wide mount lock (``locks.mounts_lock``), so a run
cannot mount an image between prune's look at the mounts and its removal. Build logs of images no
longer here go too, but not the log a running build writes (``locks.unless_building``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from harnessrl.environments.locks import mounts_lock, unless_building
from harnessrl.environments.mounts import MountRecords
from harnessrl.environments.naming import LABEL_NAME, LABEL_RECIPE, build_log_name
from harnessrl.environments.podman import Podman


def list_images(podman: Podman) -> list[dict[str, Any]]:
    """harnessrl's images in ``podman``'s store: name, reference(s), id, recipe digest, size,
    created (none when the folder holds no store: reading never creates one)."""
    if not podman.graphroot.is_dir():
        return []
    rows = []
    seen: set[str] = set()
    for image in podman.images(label=LABEL_NAME):
        if not image.get("Names") or image.get("Id") in seen:
            continue  # a dangling layer (prune removes those), or an image listed once per tag
        seen.add(image.get("Id", ""))
        labels = image.get("Labels") or {}
        rows.append(
            {
                "name": labels.get(LABEL_NAME, ""),
                "references": sorted(image.get("Names") or []),
                "id": image.get("Id", ""),
                "recipe": labels.get(LABEL_RECIPE, ""),
                "size_bytes": int(image.get("Size") or 0),
                "created": image.get("CreatedAt") or image.get("Created"),
            }
        )
    return sorted(rows, key=lambda r: (r["name"], r["id"]))


def remove_images(
    podman: Podman, mounts: MountRecords, keep: set[str] | None
) -> tuple[list[dict[str, str]], list[dict[str, str]], set[str]]:
    """Remove harnessrl's images whose id is not in ``keep`` and that no process has mounted;
    ``keep`` None removes every image, mounted or not. Returns ``(removed, in use, mounted ids)``."""
    # No run mounts an image from the look at the mounts to the last removal (``mounts_lock``).
    with mounts_lock(podman.store, pruning=True):
        mounts.give_back_stale()  # an image mounted only by a run that was killed is not in use
        mounted = podman.mounted_images() if keep is not None else set()
        removed, in_use = [], []
        for row in list_images(podman):
            if keep is not None and row["id"] in keep:
                continue
            if row["id"] in mounted:
                in_use.append({"name": row["name"], "id": row["id"][:12]})
                continue
            if podman.remove(row["id"]):
                removed.append({"name": row["name"], "id": row["id"][:12]})
    return removed, in_use, mounted


def prune_logs(podman: Podman) -> int:
    """Remove the build logs (``logs/<name>-<digest[:16]>.log``) of images no longer here, but
    not one a build is writing (its digest's lock held): one log per build stayed for good, the
    store's one growth that prune never gave back. Returns the bytes freed."""
    logs = podman.store / "logs"
    if not logs.is_dir():
        return 0
    here = {build_log_name(row["name"], row["recipe"]) for row in list_images(podman)}
    freed = 0
    for log in logs.glob("*.log"):
        if log.name in here:
            continue
        digest16 = log.name.removesuffix(".log").rpartition("-")[2]
        with unless_building(podman.store, digest16) as idle:
            if idle:  # removed holding the lock: a build starting now writes a log of its own
                with contextlib.suppress(OSError):
                    size = log.stat().st_size
                    log.unlink()
                    freed += size
    return freed


def folder_bytes(folder: Path) -> int:
    """Disk blocks used under ``folder`` (hard links counted once; mount points not crossed)."""
    total, seen = 0, set()
    if not folder.exists():
        return 0
    device = folder.stat().st_dev
    for dirpath, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(dirpath, d)).st_dev == device]
        for name in files + dirs:
            try:
                info = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += info.st_blocks * 512
    return total
