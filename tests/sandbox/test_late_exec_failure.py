"""A command whose exec fails after the sandbox said it started (a script whose interpreter is
missing: the script itself exists and is executable) exits with the launcher's "cannot start" status
and says why on stderr. It died of SIGPIPE (141, stderr empty) writing to the status pipe the
launcher had closed after reading "ok"."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harnessrl.sandbox.bwrap import python_install_paths, sandbox_problem
from harnessrl.sandbox.host import LAUNCHER_ENV, SandboxHost
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
    host = SandboxHost(parent=tmp_path)
    try:
        argv = host.launch_argv(
            tmp_path / "spec.json",
            sandbox="bwrap",
            command=[str(script)],
            cwd=workspace,
            env={},
            writable=(workspace,),
            read_only=python_install_paths(),
            network="none",
        )
        return subprocess.run(argv, env=LAUNCHER_ENV, capture_output=True, text=True, timeout=120)
    finally:
        host.close()


def test_a_script_whose_interpreter_is_missing_says_so(tmp_path):
    done = run_script(tmp_path, "#!/no/such/interpreter")
    assert done.returncode == CANNOT_START, (done.returncode, done.stderr[-2000:])
    assert "cannot start" in done.stderr and "agent" in done.stderr


def test_control_a_script_with_its_interpreter_runs(tmp_path):
    done = run_script(tmp_path, "#!/bin/sh")
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr[-2000:]
