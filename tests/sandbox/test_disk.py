"""``sandbox.disk.disk_used``, what the disk watchdogs of harness attempts and scorers sum: empty
files count (an inode each: millions of them filled the host's inodes while costing 0 bytes), hard
links once, links are not followed, and counting stops past the cap. The tree is the sandbox's, changed
while it is walked: a folder swapped for a link is not entered, a tree nested past PATH_MAX is counted,
and files the attempt's processes hold after unlinking them count as long as they are held."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys

import pytest

from harnessrl.sandbox.disk import ENTRY_BYTES, disk_used


def test_empty_files_count_an_inode_each(tmp_path):
    for i in range(1000):
        (tmp_path / f"f{i}").touch()
    assert sum(os.stat(tmp_path / f"f{i}").st_blocks for i in range(1000)) == 0  # control: no blocks
    assert disk_used((tmp_path,)) == 1000 * ENTRY_BYTES


def test_hard_links_count_once_and_links_are_not_followed(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(os.urandom(1 << 20))
    os.link(big, tmp_path / "again")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "data").write_bytes(os.urandom(1 << 20))
    (tmp_path / "link").symlink_to(outside)
    used = disk_used((tmp_path,))
    assert (1 << 20) <= used < (1 << 20) + 4 * ENTRY_BYTES + 65536  # one copy, the link an entry


def test_counting_stops_once_past_the_cap(tmp_path):
    for i in range(100):
        (tmp_path / f"f{i}").touch()
    assert ENTRY_BYTES < disk_used((tmp_path,), stop_above=ENTRY_BYTES) < 100 * ENTRY_BYTES


# -- the tree is the sandbox's, changed while it is walked ---------------------------------------------


def test_a_tree_nested_past_path_max_is_counted_to_its_bottom(tmp_path):
    # 25 folders of 200 characters: the bottom lies past PATH_MAX (4096), where no path reaches.
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(25):
        os.mkdir("d" * 200, dir_fd=fd)
        deeper = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    big = os.open("big", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
    os.write(big, os.urandom(4 << 20))
    os.close(big)
    os.close(fd)
    bottom = tmp_path.joinpath(*["d" * 200] * 25, "big")
    with pytest.raises(OSError) as too_long:  # control: the file is out of any path's reach
        os.stat(bottom)
    assert too_long.value.errno == errno.ENAMETOOLONG
    assert disk_used((tmp_path,)) >= 4 << 20


FLIP = """
import os, sys, time
folder, outside = sys.argv[1], sys.argv[2]
print("flipping", flush=True)
while True:
    os.mkdir(folder)
    time.sleep(0.0005)
    os.rmdir(folder)
    os.symlink(outside, folder)
    time.sleep(0.0005)
    os.unlink(folder)
"""


def test_a_folder_swapped_for_a_link_is_not_entered(tmp_path):
    # The sandbox swaps a folder for a link to a host folder between the walk's listing of it and its
    # walk into it: the host's files must never count as the attempt's (or be chmod'ed through it).
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    tree.mkdir()
    outside.mkdir()
    (outside / "host-file").write_bytes(os.urandom(16 << 20))
    for i in range(2000):  # listed before the walk goes down: the window in which the swap lands
        (tree / f"f{i}").touch()
    baseline = disk_used((tree,))
    flipper = subprocess.Popen(
        [sys.executable, "-c", FLIP, str(tree / "d"), str(outside)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert flipper.stdout is not None and flipper.stdout.readline() == "flipping\n"
        seen = {"dir": 0, "link": 0}
        most = 0
        for _ in range(400):
            with contextlib.suppress(FileNotFoundError):  # control: it really is both by turns
                seen["link" if (tree / "d").is_symlink() else "dir"] += 1
            most = max(most, disk_used((tree,)) - baseline)
        assert seen["dir"] and seen["link"], seen
        assert most < 1 << 20, f"{most} bytes of the host folder counted"
    finally:
        flipper.kill()
        flipper.wait()


HOLD = """
import mmap, os, sys
path, how = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
os.posix_fallocate(fd, 0, 8 << 20)
os.unlink(path)
if how == "mapped":  # no descriptor left: only the mapping holds it
    kept = mmap.mmap(fd, 8 << 20)
    os.close(fd)
print("holding", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("how", ["open", "mapped"])
def test_unlinked_files_count_while_a_holder_keeps_them(tmp_path, how):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "big"), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        assert not (tmp_path / "big").exists()
        assert disk_used((tmp_path,)) < 1 << 20  # control: no name left to walk to
        assert disk_used((tmp_path,), holders=[holder.pid]) >= 8 << 20
        # The same file held by two processes (or twice by one) counts once.
        assert disk_used((tmp_path,), holders=[holder.pid, holder.pid]) < 9 << 20
    finally:
        holder.communicate("")
    assert disk_used((tmp_path,), holders=[holder.pid]) < 1 << 20  # let go: freed
