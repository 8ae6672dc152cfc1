"""A command whose exec fails after the sandbox said it started (a script whose interpreter is
missing: the script itself exists and is executable) exits with the launcher's "cannot start" status
and says why on stderr. It died of SIGPIPE (141, stderr empty) writing to the status pipe the
launcher had closed after reading "ok"."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from tests.sandbox.sandboxed import run_sandboxed

from harnessrl.sandbox.bwrap import sandbox_problem
from harnessrl.sandbox.init import CANNOT_START

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
)


def run_script(tmp_path: Path, shebang: str) -> subprocess.CompletedProcess[str]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    script = workspace / "agent"
    script.write_text(f"{shebang}\necho ran\n")
    script.chmod(0o755)
    return run_sandboxed(tmp_path, [str(script)], {}, workspace)


def test_a_script_whose_interpreter_is_missing_says_so(tmp_path):
    done = run_script(tmp_path, "#!/no/such/interpreter")
    assert done.returncode == CANNOT_START, (done.returncode, done.stderr[-2000:])
    assert "cannot start" in done.stderr and "agent" in done.stderr


def test_control_a_script_with_its_interpreter_runs(tmp_path):
    done = run_script(tmp_path, "#!/bin/sh")
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr[-2000:]
