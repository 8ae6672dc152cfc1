"""What the controller does to a tree the policy made, after the harness ended, never recurses: Python
3.11's ``os.walk``, ``os.path.realpath`` and ``shutil.rmtree`` do, and a workspace nested 3,000
folders deep (or a chain of 3,000 links) raised ``RecursionError`` in the workspace copy's link check
and in every removal of scratch: the policy's 0 became an infrastructure failure. And a hard link
costs an entry against ``limits.disk_mb``: counted once, ~500 million of them fit a 10 GiB cap, and
removing them kept the rollout from finishing. Real trees on disk; each attack beside its control."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harnessrl.controller.attempt_files import discard_attempt_scratch
from harnessrl.sandbox import disk
from harnessrl.sandbox.copy import copy_untrusted_tree, drop_escaping_links
from harnessrl.sandbox.disk import ENTRY_BYTES, disk_used

DEEP = 3000  # past Python's recursion limit (1000)
SHALLOW = 100  # the control: a tree every walk handled


def nest(root: Path, depth: int) -> list[str]:
    """Nest ``depth`` folders ``d`` under ``root`` the way a harness can (``openat`` down, so no path
    is ever longer than a name); returns the names from ``root`` to the bottom."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        os.symlink("/etc/passwd", "gold", dir_fd=fd)  # a link out, at the bottom
        os.close(os.open("answer.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    return ["d"] * depth


def names_left(root: Path) -> int:
    """How many entries are under ``root``, as deep as it goes (``find`` walks without recursing)."""
    found = subprocess.run(["find", str(root), "-mindepth", "1"], capture_output=True, check=True)
    return len(found.stdout.splitlines())


@pytest.fixture(autouse=True)
def _remove_deep_trees(tmp_path):
    """pytest removes old ``tmp_path`` folders with ``shutil.rmtree``, which recurses: a tree left
    3,000 deep breaks the next session's start (``rm`` does not recurse)."""
    yield
    subprocess.run(["rm", "-rf", "--", str(tmp_path)], check=False)


@pytest.mark.parametrize("depth", [DEEP, SHALLOW])
def test_links_out_of_a_deep_tree_are_dropped(tmp_path, depth):
    root = tmp_path / "copy"
    nest(root, depth)
    (root / "inside").symlink_to("d")
    dropped = drop_escaping_links(root)
    assert [p.name for p in dropped] == ["gold"]  # the one at the bottom, found
    assert (root / "inside").is_symlink()  # a link within stays


@pytest.mark.parametrize("depth", [DEEP, SHALLOW])
def test_a_deep_workspace_is_copied_and_its_links_out_dropped(tmp_path, depth):
    nest(tmp_path / "workspace", depth)
    report = copy_untrusted_tree(
        tmp_path / "workspace", tmp_path / "copy", max_bytes=1 << 30, max_files=200_000
    )
    assert report.over_limit is None
    if depth == SHALLOW:  # all of it copied, the link out dropped
        assert report.files == SHALLOW + 2 and report.unreadable == []
        assert report.dropped_links == ["/".join(["d"] * SHALLOW + ["gold"])]
    else:  # copied down to the host's PATH_MAX, what is past it listed as the policy's
        assert report.files > 1000 and "too long" in report.unreadable[0]


def test_a_chain_of_links_is_resolved_without_recursion(tmp_path):
    """``a0 -> a1 -> ... -> a3000``: ``realpath`` recursed once per link. A link that needs more
    links than the kernel follows (40) leads nowhere the scorer could read: dropped; the last 40 stay."""
    root = tmp_path / "copy"
    root.mkdir()
    (root / f"a{DEEP}").write_text("x")
    for i in reversed(range(DEEP)):  # each link made once its target exists: a0 last
        (root / f"a{i}").symlink_to(f"a{i + 1}")
    dropped = {p.name for p in drop_escaping_links(root)}
    assert dropped == {f"a{i}" for i in range(DEEP - 40)}
    assert all((root / f"a{i}").is_symlink() for i in range(DEEP - 40, DEEP))


def test_a_short_chain_within_is_kept(tmp_path):
    """Control: a chain the kernel follows (30 links) that ends inside stays, every link of it."""
    root = tmp_path / "copy"
    root.mkdir()
    (root / "in30").write_text("x")
    for i in reversed(range(30)):
        (root / f"in{i}").symlink_to(f"in{i + 1}")
    assert drop_escaping_links(root) == []
    assert all((root / f"in{i}").is_symlink() for i in range(30))


def test_every_link_of_a_chain_out_is_dropped(tmp_path):
    """All links are judged before any is dropped: a chain is judged by where it ends, not by which
    of its links went first (dropping ``out30 -> /etc`` first left ``out29`` dangling inside: kept)."""
    root = tmp_path / "copy"
    root.mkdir()
    (root / "out30").symlink_to("/etc")
    for i in reversed(range(30)):
        (root / f"out{i}").symlink_to(f"out{i + 1}")
    assert {p.name for p in drop_escaping_links(root)} == {f"out{i}" for i in range(31)}


@pytest.mark.parametrize("depth", [DEEP, SHALLOW])
def test_discarding_a_deep_workspace_and_home_removes_them(tmp_path, depth):
    attempt = tmp_path / "attempt-0"
    nest(attempt / "workspace", depth)
    nest(attempt / "home", depth)
    (attempt / "stdout.log").write_text("kept")
    assert names_left(attempt / "workspace") == depth + 2
    discard_attempt_scratch(attempt)
    assert sorted(os.listdir(attempt)) == ["stdout.log"]


def test_remove_tree_opens_up_what_the_policy_locked(tmp_path):
    """A read-only folder and an unlistable one go too (``rmtree`` left them, silently, to a
    controller that is not root); a link is removed, never followed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    tree = tmp_path / "tree"
    nest(tree / "locked", 50)
    (tree / "locked" / "out").symlink_to(outside)
    (tree / "shut").mkdir()
    (tree / "shut" / "f").write_text("x")
    os.chmod(tree / "locked", 0o500)
    os.chmod(tree / "shut", 0)
    disk.remove_tree(tree)
    assert not tree.exists() and (outside / "keep").read_text() == "x"


def test_hard_links_cost_an_entry_each(tmp_path):
    """Each further name of a file counts ``ENTRY_BYTES``: 2,000 links to one empty file used to count
    as one file; its blocks still count once (the control: a 1 MiB file and one more link)."""
    links = tmp_path / "links"
    links.mkdir()
    (links / "f").touch()
    for i in range(2000):
        os.link(links / "f", links / f"l{i}")
    assert disk_used((links,)) == 2001 * ENTRY_BYTES
    big = tmp_path / "big-tree"
    big.mkdir()
    (big / "big").write_bytes(os.urandom(1 << 20))
    os.link(big / "big", big / "again")
    assert (1 << 20) + ENTRY_BYTES <= disk_used((big,)) < (1 << 20) + 2 * ENTRY_BYTES + 65536
