"""Copying a folder the agent wrote (its workspace) for a scorer: the copy never blocks, never grows.

The workspace is hostile input. ``shutil.copytree`` opens a FIFO for reading and waits forever for a
writer that is dead (the rollout then stays ``running``), fails on a Unix socket, and writes a
sparse file's holes out as zeros (a 1 TB sparse file is 1 TB of the host's disk). So
``copy_untrusted_tree``:

- copies regular files, folders and symlinks only, never following a link; FIFOs, sockets and device
  nodes are skipped and listed (``CopyReport.skipped``);
- skips and lists (``CopyReport.unreadable``, and ``skipped`` too, so the evaluator flags it) every
  entry it cannot read or recreate, and copies on: the agent made the tree, so an entry nested past the
  host's ``PATH_MAX`` (``ENAMETOOLONG``: the sandbox's workspace path is shorter than the host's), a
  folder it made unreadable (``EACCES``) or a file that fails to read is the policy's doing. Raising
  instead turned the policy's own failed rollout into an infrastructure failure, retried and then
  left out of the baseline;
- opens each file ``O_NOFOLLOW | O_NONBLOCK`` and checks what it opened is still a regular file;
- copies only a file's data extents (``SEEK_DATA``/``SEEK_HOLE``), so holes stay holes;
- copies a hard-linked file once and links the rest (a file linked 1,000 times is not copied 1,000
  times);
- stops at ``max_bytes`` of copied data or ``max_files`` entries (``CopyReport.over_limit`` says
  which), so the caller can end the rollout instead of filling the disk;
- drops the setuid/setgid/sticky bits, keeps the rest of each mode and the modification times;
- finally removes symlinks that lead outside the copy (``drop_escaping_links``): a scorer that
  follows ``answer.txt -> /hidden/gold.txt`` would otherwise read the gold answer as the agent's
  (without recursion, however deep the tree or long a chain of links; a link that needs more than
  40 links to resolve, which the kernel would refuse anyway, is dropped too);
- leaves out Python bytecode (``__pycache__`` folders, ``.pyc``/``.pyo`` files) when asked
  (``drop_bytecode``): a crafted ``__pycache__/solution.cpython-311.pyc`` whose header matches
  ``solution.py`` would run code nobody audited in place of the source the audit read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.sandbox.disk import walk_tree

_CHUNK = 1 << 20


@dataclass
class CopyReport:
    files: int = 0  # entries created (files, folders, links)
    bytes: int = 0  # data bytes copied (holes not counted)
    skipped: list[str] = field(default_factory=list)  # entries left out (special or unreadable), relative
    unreadable: list[str] = field(default_factory=list)  # "path: error" of entries that could not be copied
    dropped_links: list[str] = field(default_factory=list)  # links out of the tree, relative paths
    dropped_bytecode: int = 0  # __pycache__ folders and .pyc/.pyo files left out
    over_limit: str | None = None  # why the copy stopped early, if it did


class _TooBig(Exception):
    pass


_BYTECODE_SUFFIXES = (".pyc", ".pyo")


def copy_untrusted_tree(
    src: Path, dst: Path, *, max_bytes: int, max_files: int, drop_bytecode: bool = False
) -> CopyReport:
    """Copy the tree ``src`` to a new folder ``dst`` (see the module docstring for what is refused)."""
    report = CopyReport()
    dst.mkdir(mode=0o755)
    if not src.is_dir() or src.is_symlink():
        return report
    linked: dict[tuple[int, int], Path] = {}  # (device, inode) of a hard-linked file -> its copy
    stack: list[tuple[Path, Path]] = [(src, dst)]
    try:
        while stack:
            folder, target = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError as exc:  # a folder the agent made unreadable (or too deep to open)
                if folder != src:
                    _unreadable(report, _shown(folder, src), exc)
                continue
            for entry in entries:
                _count(report, max_files)
                source, copy = Path(entry.path), target / entry.name
                try:
                    _copy_entry(entry, source, copy, src, stack, linked, report, max_bytes, drop_bytecode)
                except OSError as exc:  # the agent's tree, the agent's problem: leave it out, say so
                    _unreadable(report, _shown(source, src), exc)
                    with contextlib.suppress(OSError):  # a half-written file: never score a truncated one
                        os.unlink(copy)  # (a folder stays: EISDIR)
    except _TooBig as exc:
        report.over_limit = str(exc)
        return report
    report.dropped_links = [str(p.relative_to(dst)) for p in drop_escaping_links(dst)]
    return report


def _copy_entry(
    entry: os.DirEntry,
    source: Path,
    copy: Path,
    src: Path,
    stack: list[tuple[Path, Path]],
    linked: dict[tuple[int, int], Path],
    report: CopyReport,
    max_bytes: int,
    drop_bytecode: bool,
) -> None:
    """Copy one entry of a folder (a folder is created and queued on ``stack``, not descended)."""
    info = entry.stat(follow_symlinks=False)
    mode = info.st_mode
    if drop_bytecode and (
        (stat.S_ISDIR(mode) and entry.name == "__pycache__")
        or (not stat.S_ISDIR(mode) and entry.name.endswith(_BYTECODE_SUFFIXES))
    ):
        report.dropped_bytecode += 1
        return
    if stat.S_ISLNK(mode):
        os.symlink(os.readlink(source), copy)
    elif stat.S_ISDIR(mode):
        copy.mkdir(mode=0o700)
        stack.append((source, copy))
        _finish(copy, info)  # mode and times (the times of a folder change as it fills:
        # good enough for scorers, which never compare folder times)
    elif stat.S_ISREG(mode):
        key = (info.st_dev, info.st_ino)
        if info.st_nlink > 1 and key in linked:
            os.link(linked[key], copy)
            return
        _copy_file(source, copy, report, max_bytes, _shown(source, src))
        _finish(copy, info)
        if info.st_nlink > 1:
            linked[key] = copy
    else:  # FIFO, socket, character or block device
        report.skipped.append(_shown(source, src))


#: How much of a path a report keeps: a path nested past PATH_MAX is thousands of characters, and the
#: evaluator stores what the report lists with the rollout.
_SHOWN_CHARS = 240


def _shown(path: Path, src: Path) -> str:
    relative = str(path.relative_to(src))
    if len(relative) <= _SHOWN_CHARS:
        return relative
    half = _SHOWN_CHARS // 2
    return f"{relative[:half]}…{relative[-half:]}"


def _unreadable(report: CopyReport, shown: str, exc: OSError) -> None:
    report.skipped.append(shown)
    report.unreadable.append(f"{shown}: {exc.strerror or exc}")


def _count(report: CopyReport, max_files: int) -> None:
    report.files += 1
    if report.files > max_files:
        raise _TooBig(f"more than {max_files} files")


def _finish(path: Path, info: os.stat_result) -> None:
    os.chmod(path, stat.S_IMODE(info.st_mode) & 0o777 | (0o700 if stat.S_ISDIR(info.st_mode) else 0))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)


def _copy_file(source: Path, copy: Path, report: CopyReport, max_bytes: int, relative: str) -> None:
    fd_in = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # OSError: skipped
    try:
        if not stat.S_ISREG(os.fstat(fd_in).st_mode):
            report.skipped.append(relative)
            return
        fd_out = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd_in).st_size
            offset = 0
            while offset < size:
                try:
                    start = os.lseek(fd_in, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # only a hole is left
                        break
                    raise
                end = os.lseek(fd_in, start, os.SEEK_HOLE)
                report.bytes += end - start
                if report.bytes > max_bytes:
                    raise _TooBig(f"more than {max_bytes} bytes of data")
                os.lseek(fd_in, start, os.SEEK_SET)
                os.lseek(fd_out, start, os.SEEK_SET)
                remaining = end - start
                while remaining:
                    chunk = os.read(fd_in, min(_CHUNK, remaining))
                    if not chunk:
                        break
                    os.write(fd_out, chunk)
                    remaining -= len(chunk)
                offset = end
            os.ftruncate(fd_out, size)  # a trailing hole
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


#: How many links one link's resolution may go through (Linux's own limit: ``ELOOP`` past it), and how
#: many path components it may take in all: past either, the link counts as leading out (dropped).
_MAX_LINK_HOPS = 40
_MAX_LINK_STEPS = 4096


def drop_escaping_links(root: Path) -> list[Path]:
    """Remove every symlink under ``root`` that points outside it (returned). The scorer binds hidden
    data read-only into its sandbox; a link the agent planted (``answer.txt -> /hidden/gold.txt``)
    would otherwise let the scorer read the gold answer as if the agent had written it.

    The tree is walked through folder descriptors (``disk.walk_tree``) and each link resolved by
    ``_inside``, both without recursion: ``os.walk`` and ``os.path.realpath`` recurse in Python 3.11,
    and a workspace nested 3,000 folders deep, or a chain of 3,000 links, raised ``RecursionError``
    here, which the controller counted as an infrastructure failure instead of the policy's 0."""
    real_root = os.path.realpath(root)  # the copy's own folder: the controller's path, no link of the agent
    escaping: set[tuple[int, int]] = set()  # the links out, by inode: all judged before any goes

    def judge(fd: int, path: list[str]) -> list[str]:
        folder = os.path.join(real_root, *path)  # walked without following a link: a real path
        listed = _listed(fd)
        for name, info in listed:
            if stat.S_ISLNK(info.st_mode):
                try:
                    target = os.readlink(name, dir_fd=fd)
                except OSError:
                    continue  # gone
                if not _inside(real_root, folder, target):
                    escaping.add((info.st_dev, info.st_ino))
        return _folders(listed)

    dropped: list[Path] = []

    def drop(fd: int, path: list[str]) -> list[str]:
        listed = _listed(fd)
        for name, info in listed:
            if stat.S_ISLNK(info.st_mode) and (info.st_dev, info.st_ino) in escaping:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=fd)
                dropped.append(root.joinpath(*path, name))
        return _folders(listed)

    walk_tree(root, judge, strict=False)
    if escaping:  # dropped only once all are judged: a link to a dropped link would look in
        walk_tree(root, drop, strict=False)
    return dropped


def _listed(fd: int) -> list[tuple[str, os.stat_result]]:
    """The entries of the folder ``fd``, each with its ``lstat``."""
    listed = []
    with contextlib.suppress(OSError), os.scandir(fd) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                listed.append((entry.name, entry.stat(follow_symlinks=False)))
    return listed


def _folders(listed: list[tuple[str, os.stat_result]]) -> list[str]:
    return [name for name, info in listed if stat.S_ISDIR(info.st_mode)]


def _inside(real_root: str, folder: str, target: str) -> bool:
    """Whether the link ``target``, read in the real (link-free) folder ``folder``, resolves within
    ``real_root``, as ``os.path.realpath`` resolves it (a component that does not exist is taken as it
    is), but iteratively and bounded: a link that needs more than ``_MAX_LINK_HOPS`` links or
    ``_MAX_LINK_STEPS`` components, or a component that cannot be looked at (past ``PATH_MAX``), counts
    as leading out."""
    path = "/" if target.startswith("/") else folder
    rest = target.split("/")[::-1]  # the components left, the next one last
    hops, steps = 1, 0  # the link itself is the first the kernel follows
    while rest:
        name = rest.pop()
        steps += 1
        if steps > _MAX_LINK_STEPS:
            return False
        if name in ("", "."):
            continue
        if name == "..":
            path = os.path.dirname(path)  # ``path`` has no link in it: ".." is its parent
            continue
        candidate = os.path.join(path, name)
        try:
            info = os.lstat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            path = candidate  # as realpath: missing, so taken as it is
            continue
        except OSError:
            return False
        if not stat.S_ISLNK(info.st_mode):
            path = candidate
            continue
        hops += 1
        if hops > _MAX_LINK_HOPS:
            return False
        try:
            link = os.readlink(candidate)
        except OSError:
            return False
        if link.startswith("/"):
            path = "/"
        rest.extend(link.split("/")[::-1])
    return path == real_root or path.startswith(real_root + os.sep)
