"""What a sandbox's writable folders take on the host's disk: the disk watchdogs of harness attempts
(``controller.local``) and of scorers (``controller.evaluators.command``) sum it against
``limits.disk_mb`` and kill what goes past.

Allocated blocks, not sizes (a sparse file costs what it holds, an ``fallocate``d one what it
reserved), and every entry at least ``ENTRY_BYTES``: an empty file holds no block but an inode, and
the code in the sandbox could make millions. Hard links count once; links are not followed.
"""

from __future__ import annotations

import os
from pathlib import Path

#: What each file or link counts at least: its inode.
ENTRY_BYTES = 4096
_UNCOUNTABLE = 1 << 62  # what a folder that cannot be listed counts as


def disk_used(folders: tuple[Path, ...], stop_above: int | None = None) -> int:
    """What the files and folders under ``folders`` take: their allocated blocks (a sparse file costs
    what it holds, an ``fallocate``d one what it reserved), at least ``ENTRY_BYTES`` each; hard links
    count once, symlinks are not followed. Stops counting once past ``stop_above``. A folder the
    scored code made unlistable (mode 000, under a controller that is not root) is opened up (the
    controller owns it); one that still cannot be listed counts as over any cap."""
    total, seen, stack = 0, set(), [str(f) for f in folders]
    while stack:
        folder = stack.pop()
        try:
            entries = os.scandir(folder)
        except PermissionError:
            try:
                os.chmod(folder, os.stat(folder, follow_symlinks=False).st_mode & 0o7777 | 0o700)
                entries = os.scandir(folder)
            except FileNotFoundError:
                continue
            except OSError:
                return _UNCOUNTABLE
        except OSError:
            continue  # removed meanwhile, or not a folder
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif st.st_nlink > 1:
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += max(st.st_blocks * 512, ENTRY_BYTES)
                if stop_above is not None and total > stop_above:
                    return total
    return total
