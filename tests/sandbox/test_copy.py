"""Copying a workspace the agent wrote: special files never block the copy, holes stay holes, hard links
are not multiplied, the caps stop it, links out of the tree are dropped. Each with its control (what
``shutil.copytree``, which the evaluator used before, does with the same tree)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
from pathlib import Path

import pytest

from harnessrl.sandbox.copy import copy_untrusted_tree

BIG = 1 << 40  # caps no test reaches


def copy_in_thread(src: Path, dst: Path, **caps) -> tuple[threading.Thread, dict]:
    """Copy in a thread, so a copy that blocks shows up as a thread still alive, not a hung suite."""
    box: dict = {}

    def run() -> None:
        try:
            box["report"] = copy_untrusted_tree(src, dst, **{"max_bytes": BIG, "max_files": 10**6, **caps})
        except BaseException as exc:  # the test reports it
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=30)
    return thread, box


def test_fifos_and_sockets_are_skipped_and_listed(tmp_path):
    src = tmp_path / "ws"
    (src / "sub").mkdir(parents=True)
    (src / "keep.py").write_text("x = 1\n")
    os.mkfifo(src / "sub" / "pipe")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(src / "sock"))
    thread, box = copy_in_thread(src, tmp_path / "copy")
    server.close()
    assert not thread.is_alive(), "the copy blocked on a FIFO"
    report = box["report"]
    assert sorted(report.skipped) == ["sock", "sub/pipe"]
    assert (tmp_path / "copy" / "keep.py").read_text() == "x = 1\n"
    assert not (tmp_path / "copy" / "sub" / "pipe").exists()
    # Control: what the evaluator did before fails on the same tree (the socket).
    with pytest.raises(shutil.Error):
        shutil.copytree(src, tmp_path / "old", symlinks=True, ignore=shutil.ignore_patterns("pipe"))


def test_a_sparse_file_stays_sparse(tmp_path):
    src = tmp_path / "ws"
    src.mkdir()
    with (src / "sparse").open("wb") as f:
        f.write(b"head")
        f.seek(2 << 30)  # 2 GiB
        f.write(b"tail")
    assert (src / "sparse").stat().st_blocks * 512 < 1 << 20  # the filesystem keeps holes here
    report = copy_untrusted_tree(src, tmp_path / "copy", max_bytes=BIG, max_files=100)
    copied = tmp_path / "copy" / "sparse"
    assert copied.stat().st_size == (2 << 30) + 4
    assert copied.stat().st_blocks * 512 < 1 << 20 and report.bytes < 1 << 20
    with copied.open("rb") as f:
        assert f.read(4) == b"head"
        f.seek(2 << 30)
        assert f.read() == b"tail"


def test_hard_links_are_copied_once(tmp_path):
    src = tmp_path / "ws"
    src.mkdir()
    (src / "data").write_bytes(b"x" * 100_000)
    for i in range(50):
        os.link(src / "data", src / f"link{i}")
    report = copy_untrusted_tree(src, tmp_path / "copy", max_bytes=BIG, max_files=100)
    assert report.bytes == 100_000  # not 51 times that
    assert (tmp_path / "copy" / "link7").stat().st_ino == (tmp_path / "copy" / "data").stat().st_ino


@pytest.mark.parametrize(("caps", "why"), [({"max_bytes": 50_000}, "bytes"), ({"max_files": 5}, "files")])
def test_the_caps_stop_the_copy(tmp_path, caps, why):
    src = tmp_path / "ws"
    src.mkdir()
    for i in range(10):
        (src / f"f{i}").write_bytes(b"y" * 10_000)
    report = copy_untrusted_tree(src, tmp_path / "copy", **{"max_bytes": BIG, "max_files": 100, **caps})
    assert report.over_limit is not None and why in report.over_limit


def test_links_stay_links_and_links_out_of_the_tree_are_dropped(tmp_path):
    outside = tmp_path / "gold.txt"
    outside.write_text("GOLD")
    src = tmp_path / "ws"
    src.mkdir()
    (src / "real.txt").write_text("mine")
    (src / "inside").symlink_to("real.txt")
    (src / "answer.txt").symlink_to(outside)
    (src / "dotdot").symlink_to("../gold.txt")
    report = copy_untrusted_tree(src, tmp_path / "copy", max_bytes=BIG, max_files=100)
    copy = tmp_path / "copy"
    assert (copy / "inside").is_symlink() and (copy / "inside").read_text() == "mine"
    assert not (copy / "answer.txt").exists() and not (copy / "dotdot").is_symlink()
    assert sorted(report.dropped_links) == ["answer.txt", "dotdot"]


def test_setuid_bits_are_dropped_and_modes_kept(tmp_path):
    src = tmp_path / "ws"
    src.mkdir()
    (src / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "run.sh", 0o4755)
    copy_untrusted_tree(src, tmp_path / "copy", max_bytes=BIG, max_files=100)
    assert (tmp_path / "copy" / "run.sh").stat().st_mode & 0o7777 == 0o755


def test_bytecode_is_left_out_when_asked(tmp_path):
    # A crafted __pycache__ entry whose header matches solution.py would run instead of the source.
    src = tmp_path / "ws"
    (src / "__pycache__").mkdir(parents=True)
    (src / "solution.py").write_text("x = 1\n")
    (src / "__pycache__" / "solution.cpython-311.pyc").write_bytes(b"crafted")
    (src / "helper.pyc").write_bytes(b"sourceless")
    report = copy_untrusted_tree(src, tmp_path / "copy", max_bytes=BIG, max_files=100, drop_bytecode=True)
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["solution.py"]
    assert report.dropped_bytecode == 2
    kept = copy_untrusted_tree(src, tmp_path / "control", max_bytes=BIG, max_files=100)
    assert (
        tmp_path / "control" / "__pycache__" / "solution.cpython-311.pyc"
    ).exists() and kept.dropped_bytecode == 0
