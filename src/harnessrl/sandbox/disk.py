"""What a sandbox's writable folders take on the host's disk: the disk watchdogs of harness attempts
(``controller.local``) and of scorers (``controller.evaluators.command``) sum it against
``limits.disk_mb`` and kill what goes past.

Allocated blocks, not sizes (a sparse file costs what it holds, an ``fallocate``d one what it
reserved), and every entry at least ``ENTRY_BYTES``: an empty file holds no block but an inode, and
the code in the sandbox could make millions. Hard links count once; links are not followed.

The tree is the sandbox's, changed while it is walked, so the walk goes through folder descriptors
(``openat`` with ``O_NOFOLLOW``), never through paths: a folder swapped for a link to a host folder
between its listing and its walk is not entered (a path walk counted the host's ``/usr/lib`` as the
attempt's, and its ``chmod`` of an unlistable folder went through the link), and a tree nested past
``PATH_MAX`` is counted to its bottom (a path walk skipped it: files there were free). It holds
four descriptors at most, however deep the tree.

Files the sandbox's processes hold open (or mapped) after unlinking them take the disk without a
name: ``holders`` (the attempt's processes) has each one's descriptors and mappings looked at, and
an unlinked file on the folders' filesystems counts too (a mapping only under a controller with
``CAP_SYS_ADMIN``, root: ``/proc/PID/map_files``). Not seen: a descriptor in flight in a Unix socket
message (``SCM_RIGHTS``) that no process holds.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

#: What each file or link counts at least: its inode.
ENTRY_BYTES = 4096
_UNCOUNTABLE = 1 << 62  # what a folder that cannot be listed counts as
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class _Stop(Exception):
    """Counting is over: past ``stop_above``."""


class _Uncountable(Exception):
    """A folder that cannot be listed, even opened up: it counts as over any cap."""


class _Tally:
    def __init__(self, stop_above: int | None) -> None:
        self.total = 0
        self.seen: set[tuple[int, int]] = set()  # hard-linked (or held) files already counted
        self.stop_above = stop_above

    def add(self, info: os.stat_result) -> None:
        if info.st_nlink != 1 and not stat.S_ISDIR(info.st_mode):  # linked twice, or held unlinked
            if (info.st_dev, info.st_ino) in self.seen:
                return
            self.seen.add((info.st_dev, info.st_ino))
        self.total += max(info.st_blocks * 512, ENTRY_BYTES)
        if self.stop_above is not None and self.total > self.stop_above:
            raise _Stop


def disk_used(
    folders: tuple[Path, ...], stop_above: int | None = None, *, holders: Iterable[int] = ()
) -> int:
    """What the files and folders under ``folders`` take: their allocated blocks (a sparse file costs
    what it holds, an ``fallocate``d one what it reserved), at least ``ENTRY_BYTES`` each; hard links
    count once, symlinks are not followed; plus the unlinked files on the folders' filesystems that the
    processes ``holders`` hold open or mapped. Stops counting once past ``stop_above``. A folder the
    scored code made unlistable (mode 000, under a controller that is not root) is opened up (the
    controller owns it); one that still cannot be listed counts as over any cap."""
    tally = _Tally(stop_above)
    try:
        devices = set()
        for folder in folders:
            with contextlib.suppress(OSError):
                devices.add(os.stat(folder).st_dev)
            _walk(folder, tally)
        _held(holders, devices, tally)
    except _Stop:
        pass
    except _Uncountable:
        return _UNCOUNTABLE
    return tally.total


def _open_folder(name: str | Path, parent: int | None, *, follow: bool = False) -> int | None:
    """A descriptor of the folder ``name`` (in ``parent``, or a path), never through a link unless
    ``follow`` (the root, the controller's own path); None when it is gone or no folder now. An
    unlistable one is opened up first (``_Uncountable`` when that fails)."""
    nofollow = 0 if follow else os.O_NOFOLLOW
    try:
        return os.open(name, _DIR_FLAGS & ~os.O_NOFOLLOW | nofollow, dir_fd=parent)
    except PermissionError:
        pass
    except OSError:
        return None  # removed meanwhile, a link (ELOOP) or a file (ENOTDIR) by now
    try:
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | nofollow | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None
    try:
        # chmod through the descriptor's /proc link: the folder itself, whatever its name leads to now.
        os.chmod(f"/proc/self/fd/{handle}", os.fstat(handle).st_mode & 0o7777 | 0o700)
        return os.open(".", _DIR_FLAGS, dir_fd=handle)
    except FileNotFoundError:
        return None
    except OSError:
        raise _Uncountable from None
    finally:
        os.close(handle)


def _list(fd: int, tally: _Tally) -> list[str]:
    """Count the entries of the folder ``fd``; the names of its subfolders."""
    folders: list[str] = []
    try:
        entries = os.scandir(fd)  # a duplicate of ``fd``, closed with the iterator
    except OSError:
        return folders
    with entries:
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)  # fstatat in ``fd``: never through a link
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                folders.append(entry.name)
            tally.add(info)
    return folders


def _walk(root: Path, tally: _Tally) -> None:
    """Count the tree under ``root`` depth first, one folder descriptor open below the root's. Each
    level of the path walked keeps the names of the subfolders it has left to walk."""
    root_fd = _open_folder(root, None, follow=True)
    if root_fd is None:
        return
    fd = os.dup(root_fd)
    pending: list[list[str]] = []  # per folder on the path from the root: its subfolders left
    try:
        pending.append(_list(fd, tally))
        while pending:
            if pending[-1]:
                child = _open_folder(pending[-1].pop(), fd)
                if child is not None:
                    os.close(fd)
                    fd = child
                    pending.append(_list(fd, tally))
                continue
            pending.pop()  # this folder is done: back to its parent
            if not pending:
                break
            # ".." of a folder inside the tree is in the tree (the sandbox cannot move a folder out of
            # its bind mount); a folder moved meanwhile makes the walk miss or recount a part, no more.
            parent = os.dup(root_fd) if len(pending) == 1 else _open_folder("..", fd)
            os.close(fd)
            if parent is None:  # removed meanwhile: what is left of this path is gone too
                fd = os.dup(root_fd)
                del pending[1:]
                continue
            fd = parent
    finally:
        os.close(fd)
        os.close(root_fd)


def _held(holders: Iterable[int], devices: set[int], tally: _Tally) -> None:
    """Count the unlinked regular files on ``devices`` that the processes ``holders`` hold open or
    mapped (each once): written, then unlinked, they take the disk until the last holder lets go."""
    if not devices:
        return
    for pid in holders:
        try:
            names = [f"fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")] + _deleted_mappings(pid)
        except OSError:
            continue  # gone
        for name in names:
            try:
                info = os.stat(f"/proc/{pid}/{name}")  # the open (or mapped) file, not a path lookup
            except OSError:
                continue  # closed meanwhile, or map_files without CAP_SYS_ADMIN
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 0 and info.st_dev in devices:
                tally.add(info)


def _deleted_mappings(pid: int) -> list[str]:
    """``map_files/<range>`` of each file ``pid`` maps that is unlinked, one mapping per file: read from
    its ``maps`` (names end ``" (deleted)"``), so a process of 65,000 mappings costs no 65,000 stats."""
    found, files = [], set()
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", "rb") as maps:
        for line in maps:
            if not line.endswith(b" (deleted)\n"):
                continue
            fields = line.split(maxsplit=5)  # range perms offset dev inode path (newlines escaped)
            if len(fields) < 6 or (fields[3], fields[4]) in files or fields[4] == b"0":
                continue
            files.add((fields[3], fields[4]))
            start, _, end = fields[0].partition(b"-")
            found.append(f"map_files/{int(start, 16):x}-{int(end, 16):x}")
    return found
