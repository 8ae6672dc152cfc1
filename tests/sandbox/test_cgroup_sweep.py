"""Cgroups outlive no owner: a controller killed with ``SIGKILL`` never destroys its groups, so the next
``ResourceGroup.create`` removes the empty groups of owners that are gone, and never a group of a
living owner or one that still holds a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harnessrl.sandbox.cgroups import ResourceGroup

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root here")

# An owner: make a group, optionally start a process in it, say where both are, wait on stdin.
OWNER = (
    "import json, subprocess, sys\n"
    "from harnessrl.sandbox.cgroups import ResourceGroup\n"
    "group = ResourceGroup.create(sys.argv[1], memory_mb=64, max_processes=8)\n"
    "child = None\n"
    "if group is not None and sys.argv[2] == 'with-process':\n"
    "    child = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
    "    group.join(child.pid)\n"
    "dirs = [str(d) for d in group.dirs] if group is not None else []\n"
    "print(json.dumps({'dirs': dirs, 'child': child.pid if child else None}), flush=True)\n"
    "sys.stdin.read()\n"
    "if group is not None: group.destroy()\n"
)


def start_owner(process: str = "no-process") -> tuple[subprocess.Popen, list[Path], int | None]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, f"sweep-test-{uuid.uuid4().hex[:8]}", process],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    said = json.loads(proc.stdout.readline())
    if not said["dirs"]:
        proc.kill()
        proc.wait(timeout=60)
        pytest.skip("no writable cgroups here")
    dirs = [Path(d) for d in said["dirs"]]
    assert all(d.is_dir() for d in dirs)
    return proc, dirs, said["child"]


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)  # no destroy(): its groups stay behind
    proc.wait(timeout=60)


def create_another() -> ResourceGroup:
    group = ResourceGroup.create(f"sweep-test-{uuid.uuid4().hex[:8]}", memory_mb=64, max_processes=8)
    assert group is not None
    return group


def test_the_empty_groups_of_a_killed_owner_are_removed_by_the_next_create():
    owner, dirs, _ = start_owner()
    kill(owner)
    assert all(d.is_dir() for d in dirs)
    group = create_another()
    try:
        assert not any(d.exists() for d in dirs)
        assert all(g.is_dir() for g in group.dirs)
    finally:
        group.destroy()


def test_control_the_groups_of_a_living_owner_are_kept():
    owner, dirs, _ = start_owner()
    group = create_another()
    try:
        assert all(d.is_dir() for d in dirs)
    finally:
        group.destroy()
        owner.stdin.close()  # it destroys its own
        assert owner.wait(timeout=60) == 0
    assert not any(d.exists() for d in dirs)


def test_a_group_that_still_holds_a_process_is_never_touched():
    owner, dirs, child = start_owner("with-process")
    kill(owner)
    group = create_another()
    try:
        assert all(d.is_dir() for d in dirs)
        assert all(str(child) in (d / "cgroup.procs").read_text().split() for d in dirs)
    finally:
        group.destroy()
        os.kill(child, signal.SIGKILL)
        leftover = ResourceGroup(dirs, 1, frozenset())
        leftover.destroy()  # waits for the killed child to leave, then removes the folders
    assert not any(d.exists() for d in dirs)
