"""Run one command in a real bubblewrap sandbox of its own (``SandboxHost`` in the test's temp folder),
the way the host launches harnesses and scorers: the workspace writable, Python read-only, no network."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harnessrl.sandbox.bwrap import python_install_paths
from harnessrl.sandbox.host import LAUNCHER_ENV, SandboxHost


def run_sandboxed(
    tmp_path: Path, command: list[str], env: dict[str, str], workspace: Path
) -> subprocess.CompletedProcess[str]:
    host = SandboxHost(parent=tmp_path)
    try:
        argv = host.launch_argv(
            tmp_path / "spec.json",
            sandbox="bwrap",
            command=command,
            cwd=workspace,
            env=env,
            writable=(workspace,),
            read_only=python_install_paths(),
            network="none",
        )
        return subprocess.run(argv, env=LAUNCHER_ENV, capture_output=True, text=True, timeout=120)
    finally:
        host.close()
