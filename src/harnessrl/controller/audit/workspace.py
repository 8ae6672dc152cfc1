"""The workspace diff the audit reads: what the policy left in its workspace, not only what it typed.

A policy can write code without typing it (``echo <base64> | base64 -d | gunzip >> solution.py``, a
script that generates another file); the commands then show nothing, but the file the scorer runs
holds the code. ``snapshot_workspace`` records the workspace right after the controller prepared it
(before the harness starts); ``diff_workspace`` walks it again after the harness exits and returns
the files added, modified and deleted, with, for each changed text file, the lines that changed
(``Hunk``s). ``audit.audit_files`` applies the rules to them; this module only reads the disk.

The workspace is hostile, so the walk is bounded and touches nothing it should not:
- symlinks are never followed (their target text is the content compared and audited);
- FIFOs, sockets and devices are never opened (opening a FIFO blocks forever); regular files are
  opened ``O_NOFOLLOW | O_NONBLOCK`` and checked to still be regular files after opening;
- entries per walk, bytes hashed per file and per walk, bytes of text per file and changed text
  handed to the rules are capped (``SnapshotLimits``); a file over a cap is compared by its size,
  mtime and ctime instead of its hash (ctime cannot be set back from user space), and every cap that
  was hit is named in ``WorkspaceDiff.bounds``.

A modified text file's changed lines come from a line diff against the line hashes the snapshot kept
(Python's ``hash`` of each line: the snapshot and the diff live in one controller process), so code
the task shipped in that file is not audited, only what the policy wrote. Each changed text file also
carries its first line (``FileChange.first_line``): lines appended to a shipped ``#!/usr/bin/env
python`` script are Python although no hunk starts at line 1 (``audit.languages``). See docs/audit.md.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import os
import posixpath
import re
import stat
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.controller.audit.languages import first_line_of, is_code_path

# Re-exported: code and docs import ``script_language`` from here.
from harnessrl.controller.audit.languages import script_language as script_language

MiB = 1024 * 1024
_CHUNK = 1 * MiB
_BINARY_SNIFF = 8192  # a NUL byte in the first 8 KiB makes a file binary (git's heuristic)


class SnapshotLimits(BaseModel):
    """Bounds on the work one walk of a workspace may do (each cap hit is reported, never silent)."""

    model_config = ConfigDict(extra="forbid")

    max_entries: int = Field(default=200_000, ge=1, description="files, folders and links per walk")
    max_file_bytes: int = Field(default=64 * MiB, ge=0, description="larger files: size/mtime/ctime, no hash")
    max_total_bytes: int = Field(default=1024 * MiB, ge=0, description="bytes hashed per walk")
    max_text_bytes: int = Field(
        default=1 * MiB, ge=0, description="a text file's lines are diffed up to this"
    )
    max_changed_bytes: int = Field(default=8 * MiB, ge=0, description="changed text handed to the rules")


EntryKind = Literal["file", "symlink", "special"]


@dataclass(frozen=True, slots=True)
class _Entry:
    kind: EntryKind
    digest: str  # sha256 of a file, "stat:..." for a file over a cap, a link's target, a special's type
    size: int = 0
    # line hashes of a text file (before snapshots only); not part of what is compared
    lines: array | None = field(default=None, compare=False)


@dataclass
class WorkspaceSnapshot:
    """The workspace as the harness found it (or left it): relative path -> entry."""

    root: str
    entries: dict[str, _Entry] = field(default_factory=dict)
    bounds: list[str] = field(default_factory=list)  # caps hit while walking
    complete: bool = True  # False when the walk stopped early (too many entries)
    unreadable: list[str] = field(default_factory=list)  # folders and files the walk could not read


class Hunk(BaseModel):
    """Consecutive changed lines of a text file: ``start`` is the 1-based line number of the first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: int
    text: str
    # When the lines start inside the body of an unchanged ``def __eq__``/``__ne__`` (``return True``
    # put in a shipped method), the lines from that ``def`` to the first of them: the comparison the
    # policy made always true is not in its changed lines alone (``audit.changes.always_equal_hints``).
    header: str | None = None


class FileChange(BaseModel):
    """One path that differs between the two walks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str  # relative to the workspace, "/"-separated
    status: Literal["added", "modified", "deleted"]
    kind: EntryKind | Literal["binary"]  # what the path is now (before, for a deleted one)
    size: int = 0
    sha256: str | None = None  # None for links, special files and files over a cap
    target: str | None = None  # a symlink's target
    hunks: tuple[Hunk, ...] | None = None  # changed lines of a text file; None: not read (see ``note``)
    shadows: str | None = None  # the Python source a binary module would replace at import
    note: str | None = None  # why the content was not read, when it was not
    # The file's first line now (text files): its shebang says what runs it even when the policy only
    # appended lines, so no hunk starts at line 1 (``audit.languages.script_language``).
    first_line: str | None = None


class WorkspaceDiff(BaseModel):
    """What changed in the workspace while the harness ran; ``bounds`` names every cap that was hit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    changes: tuple[FileChange, ...] = ()
    bounds: tuple[str, ...] = ()
    complete: bool = True  # both walks saw every entry
    grew_past_bounds: bool = False  # the before walk was complete and the after walk was not
    # Folders and files the after walk could not read that the before walk could (nested past
    # PATH_MAX, made unreadable: the policy's doing), at most ``_MAX_NOTES``: what they hold is unread.
    unreadable: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------------
# Walking
# ---------------------------------------------------------------------------------------------------


def snapshot_workspace(workspace: Path, limits: SnapshotLimits | None = None) -> WorkspaceSnapshot:
    """Record every entry of ``workspace`` with its content hash and, for text files, line hashes."""
    return _walk(Path(workspace), limits or SnapshotLimits(), index_lines=True)


def _walk(root: Path, limits: SnapshotLimits, *, index_lines: bool) -> WorkspaceSnapshot:
    snap = WorkspaceSnapshot(root=str(root))
    budget = [limits.max_total_bytes]  # bytes still to hash in this walk
    stack = [""]
    seen = 0
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(root / rel_dir if rel_dir else root) as it:
                # Never list more than the cap allows (a folder of millions of files), then sort.
                listing = sorted(itertools.islice(it, limits.max_entries - seen + 1), key=lambda e: e.name)
        except OSError as exc:
            snap.bounds.append(f"unreadable folder {_show(rel_dir or '.')}: {exc.strerror or exc}")
            snap.unreadable.append(rel_dir)
            continue
        subdirs = []
        for entry in listing:
            seen += 1
            if seen > limits.max_entries:
                snap.complete = False
                snap.bounds.append(f"walk stopped after {limits.max_entries} entries")
                return snap
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                if entry.is_symlink():
                    snap.entries[rel] = _Entry("symlink", os.readlink(entry.path))
                elif entry.is_dir(follow_symlinks=False):
                    subdirs.append(rel)
                elif entry.is_file(follow_symlinks=False):
                    snap.entries[rel] = _read_file(entry.path, rel, limits, budget, snap.bounds, index_lines)
                else:  # FIFO, socket, device: never opened
                    mode = entry.stat(follow_symlinks=False).st_mode
                    snap.entries[rel] = _Entry("special", _special_kind(mode))
            except OSError as exc:
                snap.bounds.append(f"unreadable {_show(rel)}: {exc.strerror or exc}")
                snap.unreadable.append(rel)
        stack.extend(reversed(subdirs))  # depth first, in name order
    return snap


def _read_file(
    path: str, rel: str, limits: SnapshotLimits, budget: list[int], bounds: list[str], index_lines: bool
) -> _Entry:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced by something else since the listing
            return _Entry("special", _special_kind(st.st_mode))
        signature = f"stat:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
        if st.st_size > limits.max_file_bytes:
            bounds.append(f"not hashed (over {limits.max_file_bytes} bytes): {_show(rel)}")
            return _Entry("file", signature, st.st_size)
        if st.st_size > budget[0]:
            bounds.append(f"not hashed (walk's {limits.max_total_bytes} bytes spent): {_show(rel)}")
            return _Entry("file", signature, st.st_size)
        digest = hashlib.sha256()
        head = b""
        keep = index_lines and st.st_size <= limits.max_text_bytes
        kept: list[bytes] = []
        remaining = st.st_size  # never read past the size seen: a growing file cannot stall the walk
        while remaining > 0:
            chunk = os.read(fd, min(_CHUNK, remaining))
            if not chunk:
                break
            remaining -= len(chunk)
            digest.update(chunk)
            if len(head) < _BINARY_SNIFF:
                head += chunk[: _BINARY_SNIFF - len(head)]
            if keep:
                kept.append(chunk)
        budget[0] -= st.st_size
        lines = None
        if keep and b"\0" not in head:
            lines = array("q", map(hash, b"".join(kept).split(b"\n")))
        return _Entry("file", digest.hexdigest(), st.st_size, lines)
    finally:
        os.close(fd)


def _special_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "char device")):
        if test(mode):
            return name
    return "block device" if stat.S_ISBLK(mode) else "special"


def _read_text(root: Path, rel: str, limit: int) -> bytes | None:
    """The bytes of a regular file up to ``limit`` + 1 (None if it is not a regular file now)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(root / rel, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        parts, remaining = [], limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(_CHUNK, remaining))
            if not chunk:
                break
            parts.append(chunk)
            remaining -= len(chunk)
        return b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------
# Diffing
# ---------------------------------------------------------------------------------------------------

_MAX_NOTES = 50  # bound notes kept in a diff (one per unreadable or unhashed file otherwise)
_SHOWN_PATH = 300  # characters of an unreadable path kept (one nested past PATH_MAX is longer)


def diff_workspace(
    before: WorkspaceSnapshot, workspace: Path | None = None, limits: SnapshotLimits | None = None
) -> WorkspaceDiff:
    """Walk ``workspace`` (default: the snapshot's root) again and compare it with ``before``."""
    limits = limits or SnapshotLimits()
    root = Path(workspace) if workspace is not None else Path(before.root)
    after = _walk(root, limits, index_lines=False)
    bounds = [*(f"before: {b}" for b in before.bounds), *(f"after: {b}" for b in after.bounds)]
    paths = sorted(set(before.entries) | set(after.entries))
    changed = [p for p in paths if before.entries.get(p) != after.entries.get(p)]
    if not after.complete:  # unseen entries are not deleted; they were just not reached
        changed = [p for p in changed if p in after.entries]
    # Code first, so a flood of other changed text cannot spend the budget before solution.py is read.
    changed.sort(key=lambda p: (not is_code_path(p), p))
    budget = limits.max_changed_bytes
    changes = []
    for rel in changed:
        old, new = before.entries.get(rel), after.entries.get(rel)
        change, spent = _change(root, rel, old, new, (before, after), limits, budget)
        budget -= spent
        changes.append(change)
    changes.sort(key=lambda c: c.path)
    if len(bounds) > _MAX_NOTES:
        bounds = [*bounds[:_MAX_NOTES], f"... and {len(bounds) - _MAX_NOTES} more"]
    shipped = set(before.unreadable)
    unreadable = [_show(rel or ".")[:_SHOWN_PATH] for rel in after.unreadable if rel not in shipped]
    return WorkspaceDiff(
        changes=tuple(changes),
        bounds=tuple(bounds),
        complete=before.complete and after.complete,
        grew_past_bounds=before.complete and not after.complete,
        unreadable=tuple(unreadable[:_MAX_NOTES]),
    )


def _change(
    root: Path,
    rel: str,
    old: _Entry | None,
    new: _Entry | None,
    walks: tuple[WorkspaceSnapshot, WorkspaceSnapshot],
    limits: SnapshotLimits,
    budget: int,
) -> tuple[FileChange, int]:
    path = _show(rel)
    if new is None:
        assert old is not None
        return FileChange(path=path, status="deleted", kind=old.kind, size=old.size), 0
    status: Literal["added", "modified"] = "added" if old is None else "modified"
    if new.kind == "symlink":
        return FileChange(path=path, status=status, kind="symlink", target=_show(new.digest)), 0
    if new.kind == "special":
        return FileChange(path=path, status=status, kind="special", note=f"{new.digest}, never opened"), 0
    sha = None if new.digest.startswith("stat:") else new.digest
    base = {"path": path, "status": status, "size": new.size, "sha256": sha}
    if new.size > limits.max_text_bytes:
        note = f"not read: over {limits.max_text_bytes} bytes"
        return FileChange(**base, kind="file", shadows=_shadowed(rel, b"", walks), note=note), 0
    if new.size > budget:
        note = f"not read: the diff's {limits.max_changed_bytes} bytes of changed text were spent"
        return FileChange(**base, kind="file", note=note), 0
    data = _read_text(root, rel, limits.max_text_bytes)
    if data is None:
        return FileChange(**base, kind="file", note="not read: no longer a regular file"), 0
    if b"\0" in data[:_BINARY_SNIFF]:
        return FileChange(**base, kind="binary", shadows=_shadowed(rel, data, walks)), 0
    old_lines = old.lines if old is not None and old.kind == "file" else None
    if old is not None and old_lines is None:
        base["note"] = "whole file read: no line index of the original"
    hunks = _hunks(data, old_lines)
    first = first_line_of(data)
    return FileChange(**base, kind="file", hunks=hunks, first_line=first), sum(len(h.text) for h in hunks)


def _hunks(data: bytes, old_lines: array | None) -> tuple[Hunk, ...]:
    """The changed lines of ``data`` against the original's line hashes (all lines if none)."""
    raw = data.split(b"\n")
    if old_lines is None:
        spans = [(0, len(raw))]
    else:
        matcher = difflib.SequenceMatcher(None, old_lines.tolist(), [hash(line) for line in raw])
        spans = [(j1, j2) for tag, _, _, j1, j2 in matcher.get_opcodes() if tag in ("replace", "insert")]
    hunks = []
    for j1, j2 in spans:
        text = b"\n".join(raw[j1:j2]).decode("utf-8", errors="replace")
        if text.strip():
            header = _comparison_header(raw, j1) if old_lines is not None else None
            hunks.append(Hunk(start=j1 + 1, text=text, header=header))
    return tuple(hunks)


_COMPARISON_DEF = re.compile(rb"^[ \t]*(?:async[ \t]+)?def[ \t]+__(?:eq|ne)__\b")
_HEADER_LINES = 12  # how far above changed lines their ``def __eq__`` is looked for


def _comparison_header(raw: list[bytes], start: int) -> str | None:
    """The lines from the nearest ``def __eq__``/``def __ne__`` above line index ``start`` (within
    ``_HEADER_LINES``) down to it, or None; whether the changed lines are its first statement is for
    the rule to read."""
    for k in range(start - 1, max(-1, start - 1 - _HEADER_LINES), -1):
        if _COMPARISON_DEF.match(raw[k]):
            return b"\n".join(raw[k:start]).decode("utf-8", errors="replace")
    return None


_EXTENSION_SUFFIXES = (".so", ".pyd")
_PYC_UNCHECKED_HASH = 0b01  # PEP 552 flags: hash-based, source never checked


def _shadowed(rel: str, data: bytes, walks: tuple[WorkspaceSnapshot, WorkspaceSnapshot]) -> str | None:
    """The Python module a binary file would provide at import instead of source the audit reads
    (``walks``: the snapshot before the harness ran, and the walk after).

    An extension module beside ``name.py`` wins over it (the import system tries extensions first),
    and one in place of a ``name.py`` the task shipped and the policy deleted is imported instead;
    a ``.pyc`` outside ``__pycache__`` is imported when no source exists; a ``__pycache__`` entry whose
    header says "hash-based, unchecked" is used whatever the source says (the import system never
    writes such files; only ``py_compile --invalidation-mode unchecked-hash`` does)."""
    folder, name = posixpath.split(rel)
    prefix = f"{folder}/" if folder else ""
    if name.endswith(_EXTENSION_SUFFIXES):
        module = name.split(".", 1)[0]
        source = f"{prefix}{module}.py"
        return _show(source) if any(source in walk.entries for walk in walks) else None
    if not name.endswith(".pyc"):
        return None
    if posixpath.basename(folder) != "__pycache__":
        return _show(f"{prefix}{name[:-1]}")  # a sourceless module
    if len(data) >= 8 and int.from_bytes(data[4:8], "little") == _PYC_UNCHECKED_HASH:
        parent = posixpath.dirname(folder)
        return _show(f"{parent + '/' if parent else ''}{name.split('.', 1)[0]}.py")
    return None


def _show(path: str) -> str:
    """A path as text that JSON can hold (undecodable bytes of a file name become U+FFFD)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
