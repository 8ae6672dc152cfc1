"""``sandbox.disk.disk_used``, what the disk watchdogs of harness attempts and scorers sum: empty
files count (an inode each: millions of them filled the host's inodes while costing 0 bytes), hard
links once, links are not followed, and counting stops past the cap."""

from __future__ import annotations

import os

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
