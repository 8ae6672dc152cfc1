"""The launcher (``sandbox.enter``) dies with its controller: when the parent that started it is gone
already by the time it asks the kernel for that (``PR_SET_PDEATHSIG`` never fires then), it starts
nothing and exits 125 instead of running a harness nobody waits for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harnessrl.sandbox.enter import PARENT_ENV, SETUP_FAILED
from harnessrl.sandbox.host import LAUNCHER_ENV


def launch(tmp_path: Path, parent: int) -> tuple[int, Path]:
    """Run the launcher (``sandbox = "none"``: no bwrap needed) on a command that leaves a file."""
    marker = tmp_path / "ran"
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps({"argv": ["touch", str(marker)], "cwd": str(tmp_path), "env": {}, "bwrap_argv": None})
    )
    env = {**LAUNCHER_ENV, PARENT_ENV: str(parent)}
    proc = subprocess.run([sys.executable, "-m", "harnessrl.sandbox.enter", str(spec)], env=env, timeout=60)
    return proc.returncode, marker


def test_a_launcher_whose_controller_is_gone_starts_nothing(tmp_path):
    """Its parent is not the process named as its controller (which died, and the launcher was
    reparented): it refuses."""
    code, marker = launch(tmp_path, parent=1)
    assert code == SETUP_FAILED
    assert not marker.exists()


def test_a_launcher_whose_controller_lives_runs_the_command(tmp_path):
    """Control: the named controller is its parent (this test), so the command runs."""
    code, marker = launch(tmp_path, parent=os.getpid())
    assert code == 0
    assert marker.exists()
