"""A host path that is not UTF-8 (a run folder whose name holds byte 0xff, which Python reads as a
lone surrogate) reaches bubblewrap as the same bytes: the launcher encoded its options with
``str.encode``, which refused it, so every attempt in such a folder failed with "launcher wrote no
status". The plain folder is the control."""

from __future__ import annotations

import os
import sys

import pytest
from tests.sandbox.sandboxed import run_sandboxed

from harnessrl.sandbox.bwrap import sandbox_problem

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
)


@pytest.mark.parametrize("name", [os.fsdecode(b"run\xff"), "run"])
def test_a_workspace_whose_path_is_not_utf8_launches(tmp_path, name):
    workspace = tmp_path / name / "ws"
    workspace.mkdir(parents=True)
    done = run_sandboxed(tmp_path, [sys.executable, "-c", "open('out.txt', 'w').write('ran')"], {}, workspace)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (workspace / "out.txt").read_text() == "ran"
