"""What a sandbox's writable folders take on the host's disk: the disk watchdogs of harness attempts
(``controller.local``) and of scorers (``controller.evaluators.command``) sum it against
``limits.disk_mb`` and kill what goes past.

Allocated blocks, not sizes (a sparse file costs what it holds, an ``fallocate``d one what it
reserved), and every entry at least ``ENTRY_BYTES``: an empty file holds no block but an inode, and
the code in the sandbox could make millions. A hard-linked file's blocks count once, and each further
link to it ``ENTRY_BYTES`` (a name costs the host a directory entry, and each is one more for every
later walk and removal to visit: counted once, a 10 GiB ``disk_mb`` let a harness make ~500 million
links to one empty file, and removing them kept its rollout from finishing). Links are not followed.

The tree is the sandbox's, changed while it is walked, so the walk goes through folder descriptors
(``openat`` with ``O_NOFOLLOW``), never through paths: a folder swapped for a link to a host folder
between its listing and its walk is not entered (a path walk counted the host's ``/usr/lib`` as the
attempt's, and its ``chmod`` of an unlistable folder went through the link), and a tree nested past
``PATH_MAX`` is counted to its bottom (a path walk skipped it: files there were free). It holds
four descriptors at most, however deep the tree, and never recurses. The walk is shared
(``walk_tree``): ``remove_tree`` removes an attempt's or an evaluation's scratch with it,
``count_entries`` counts the names the launcher bounds by ``limits.max_entries`` (``enter.py``) and
``sandbox.copy.drop_escaping_links`` looks for links out of a workspace copy with it (Python 3.11's
``shutil.rmtree`` and ``os.walk`` recurse: a workspace nested 3,000 folders deep raised
``RecursionError`` in the controller, which turned the policy's 0 into an infrastructure failure).

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
from collections.abc import Callable, Iterable
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

    def add(self, info: os.stat_result, *, entry: bool = True) -> None:
        """Count a file (``entry``: through a name in a folder; False: held by a process, nameless)."""
        cost = max(info.st_blocks * 512, ENTRY_BYTES)
        if info.st_nlink != 1 and not stat.S_ISDIR(info.st_mode):  # linked twice, or held unlinked
            if (info.st_dev, info.st_ino) in self.seen:
                if not entry:
                    return  # a held file seen again: no name, nothing more on the disk
                cost = ENTRY_BYTES  # one more name of a file counted already
            else:
                self.seen.add((info.st_dev, info.st_ino))
        self.total += cost
        if self.stop_above is not None and self.total > self.stop_above:
            raise _Stop


def disk_used(
    folders: tuple[Path, ...], stop_above: int | None = None, *, holders: Iterable[int] = ()
) -> int:
    """What the files and folders under ``folders`` take: their allocated blocks (a sparse file costs
    what it holds, an ``fallocate``d one what it reserved), at least ``ENTRY_BYTES`` each; a
    hard-linked file's blocks count once and each further link ``ENTRY_BYTES``; symlinks are not
    followed; plus the unlinked files on the folders' filesystems that the processes ``holders``
    hold open or mapped. Stops counting once past ``stop_above``. A folder the
    scored code made unlistable (mode 000, under a controller that is not root) is opened up (the
    controller owns it); one that still cannot be listed counts as over any cap."""
    tally = _Tally(stop_above)
    try:
        devices = set()
        for folder in folders:
            with contextlib.suppress(OSError):
                devices.add(os.stat(folder).st_dev)
            walk_tree(folder, lambda fd, _path: _list(fd, tally))
        _held(holders, devices, tally)
    except _Stop:
        pass
    except _Uncountable:
        return _UNCOUNTABLE
    return tally.total


def count_entries(folders: tuple[Path, ...], stop_above: int | None = None) -> int:
    """The entries (files, links, folders, every name of a hard-linked file) under ``folders``, not
    the folders themselves; what every walk or removal of them must visit. Read from the folders'
    listings (no ``stat``), through ``walk_tree``; stops counting once past ``stop_above``. A folder
    that cannot be listed, even opened up, counts as over any cap."""
    total = 0

    def visit(fd: int, _path: list[str]) -> list[str]:
        nonlocal total
        subfolders: list[str] = []
        try:
            entries = os.scandir(fd)
        except OSError:
            return subfolders
        with entries:
            for entry in entries:
                total += 1
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        subfolders.append(entry.name)
                if stop_above is not None and total > stop_above:
                    raise _Stop
        return subfolders

    try:
        for folder in folders:
            walk_tree(folder, visit)
    except _Stop:
        pass
    except _Uncountable:
        return _UNCOUNTABLE
    return total


def _open_folder(
    name: str | Path, parent: int | None, *, follow: bool = False, strict: bool = True
) -> int | None:
    """A descriptor of the folder ``name`` (in ``parent``, or a path), never through a link unless
    ``follow`` (the root, the controller's own path); None when it is gone or no folder now. An
    unlistable one is opened up first (when that fails: ``_Uncountable`` if ``strict``, else None)."""
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
        if not strict:
            return None
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


#: ``walk_tree``'s look at one folder: given its descriptor and its path from the root (names), it
#: returns the names of the subfolders to walk into.
Visit = Callable[[int, list[str]], list[str]]
#: ``walk_tree``'s farewell to a folder whose tree is walked: the descriptor of its parent, its name.
Leave = Callable[[int, str], None]


def walk_tree(root: Path, visit: Visit, *, leave: Leave | None = None, strict: bool = True) -> None:
    """Walk the tree under ``root`` depth first, through folder descriptors (never a path, never
    through a link), one descriptor open below the root's, without recursion: ``visit`` each folder
    (the root first), and ``leave`` each one below the root once its whole tree is walked. Each level
    of the path walked keeps the names of the subfolders it has left to walk. A folder that cannot be
    listed is opened up; one that still cannot be raises ``_Uncountable`` if ``strict``, else is left
    out (with its tree)."""
    root_fd = _open_folder(root, None, follow=True, strict=strict)
    if root_fd is None:
        return
    fd = os.dup(root_fd)
    pending: list[list[str]] = []  # per folder on the path from the root: its subfolders left
    path: list[str] = []  # the names of the folders walked into, from the root's child down
    try:
        pending.append(visit(fd, path))
        while pending:
            if pending[-1]:
                name = pending[-1].pop()
                child = _open_folder(name, fd, strict=strict)
                if child is not None:
                    os.close(fd)
                    fd = child
                    path.append(name)
                    pending.append(visit(fd, path))
                continue
            pending.pop()  # this folder is done: back to its parent
            if not pending:
                break
            # ".." of a folder inside the tree is in the tree (the sandbox cannot move a folder out of
            # its bind mount); a folder moved meanwhile makes the walk miss or recount a part, no more.
            parent = os.dup(root_fd) if len(pending) == 1 else _open_folder("..", fd, strict=strict)
            os.close(fd)
            if parent is None:  # removed meanwhile: what is left of this path is gone too
                fd = os.dup(root_fd)
                del pending[1:]
                path.clear()
                continue
            fd = parent
            name = path.pop()
            if leave is not None:
                leave(fd, name)
    finally:
        os.close(fd)
        os.close(root_fd)


def remove_tree(path: Path) -> None:
    """Remove ``path`` and all under it, as ``shutil.rmtree(path, ignore_errors=True)`` does, but
    through ``walk_tree``: no recursion however deep the tree (3.11's ``rmtree`` recurses), a tree
    nested past ``PATH_MAX`` goes too, and a folder the tree's owner made unlistable or read-only is
    opened up first. A link is removed, never followed. What cannot be removed stays; never raises
    ``OSError``."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISDIR(info.st_mode):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return

    def empty(fd: int, _path: list[str]) -> list[str]:
        with contextlib.suppress(OSError):  # a folder made read-only: its names cannot go otherwise
            if os.fstat(fd).st_mode & 0o700 != 0o700:
                os.fchmod(fd, os.fstat(fd).st_mode & 0o7777 | 0o700)
        folders: list[str] = []
        try:
            with os.scandir(fd) as entries:
                listed = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
        except OSError:
            return folders
        for name, is_dir in listed:
            if is_dir:
                folders.append(name)
                continue
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)
        return folders

    def rmdir(parent: int, name: str) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=parent)

    with contextlib.suppress(OSError):
        walk_tree(path, empty, leave=rmdir, strict=False)
    with contextlib.suppress(OSError):
        os.rmdir(path)


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
                tally.add(info, entry=False)


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
