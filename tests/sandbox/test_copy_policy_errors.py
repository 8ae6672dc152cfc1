"""Copying a workspace whose entries cannot be read: the agent made them, so the copy leaves them out
and lists them instead of raising (a raise made the policy's rollout an infrastructure failure)."""

from __future__ import annotations

import os
from pathlib import Path

from harnessrl.sandbox.copy import copy_untrusted_tree

BIG = 1 << 40  # caps no test reaches
LONG = "a" * 200


def nest(root: Path, depth: int) -> None:
    """``root/LONG/LONG/.../f`` ``depth`` folders deep, built relative to each folder (as an agent in a
    sandbox, whose workspace path is short, can), so the host path may pass ``PATH_MAX``."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(LONG, dir_fd=fd)
            inner = os.open(LONG, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        leaf = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"deep\n")
        os.close(leaf)
    finally:
        os.close(fd)


def test_entries_nested_past_path_max_are_skipped_and_listed(tmp_path):
    src = tmp_path / "ws"
    src.mkdir()
    (src / "keep.py").write_text("x = 1\n")
    nest(src, 25)  # 25 x 201 characters: past PATH_MAX (4096) whatever tmp_path is
    report = copy_untrusted_tree(src, tmp_path / "copy", max_bytes=BIG, max_files=10**6)
    assert (tmp_path / "copy" / "keep.py").read_text() == "x = 1\n"
    assert report.unreadable and "File name too long" in report.unreadable[0]
    assert report.skipped  # what the evaluator flags (special_files_skipped)
    assert all(len(shown) < 300 for shown in report.skipped)  # a 5,000-character path is not stored whole


def test_a_tree_within_path_max_is_copied_whole(tmp_path):
    """Control: the same tree five folders deep is copied, nothing listed."""
    src = tmp_path / "ws"
    src.mkdir()
    nest(src, 5)
    report = copy_untrusted_tree(src, tmp_path / "copy", max_bytes=BIG, max_files=10**6)
    assert report.skipped == []
    assert (tmp_path / "copy" / "/".join([LONG] * 5) / "f").read_text() == "deep\n"
