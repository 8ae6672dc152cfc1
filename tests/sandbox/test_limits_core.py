"""No core files from a sandboxed process: the launcher sets ``RLIMIT_CORE`` to 0 (hard), tried for real.

A process that crashed with the host's core limit wrote a core as large as its memory into the
workspace (``kernel/core_pattern`` ``core``), and a host whose ``core_pattern`` pipes to a helper would
hand that helper, outside the sandbox, every core. Inside (bubblewrap, and ``sandbox = "none"``) the
limit reads ``(0, 0)``, cannot be raised, and an ``abort()`` leaves no core; the control, the same
command started the same way without the launcher, has the host's limit and leaves its core."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.sandbox.bwrap import python_install_paths, sandbox_problem
from harnessrl.sandbox.host import LAUNCHER_ENV, SandboxHost

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the launcher's PID namespace needs root here")

# Reports its core limit and whether it can raise it, then aborts (SIGABRT: a core, if allowed).
CRASH = """
import json, os, resource
soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
try:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    raised = True
except (OSError, ValueError):
    raised = False
print(json.dumps({"soft": soft, "hard": hard, "raised": raised}), flush=True)
os.abort()
"""


def _host_core_limit() -> None:
    """The host's core limit, as a shell with ``ulimit -c unlimited`` would hand it down."""
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _cores(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("core"))


def _core_pattern() -> str:
    try:
        return Path("/proc/sys/kernel/core_pattern").read_text().strip()
    except OSError:
        return ""


def crash(tmp_path: Path, sandbox: str) -> tuple[dict, list[str]]:
    workspace = tmp_path / sandbox
    workspace.mkdir()
    host = SandboxHost(parent=tmp_path)
    try:
        argv = host.launch_argv(
            tmp_path / f"{sandbox}.json",
            sandbox=sandbox,
            command=[sys.executable, "-c", CRASH],
            cwd=workspace,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            writable=(workspace,),
            read_only=python_install_paths(),
            network="none",
            limits={"file_mb": 1024},
        )
        done = subprocess.run(
            argv, env=LAUNCHER_ENV, capture_output=True, text=True, timeout=120, preexec_fn=_host_core_limit
        )
    finally:
        host.close()
    assert done.returncode == 128 + 6, done.stderr[-2000:]  # SIGABRT
    return json.loads(done.stdout), _cores(workspace)


@pytest.mark.parametrize(
    "sandbox",
    [
        pytest.param(
            "bwrap",
            marks=pytest.mark.skipif(
                sandbox_problem() is not None, reason=f"no sandbox: {sandbox_problem()}"
            ),
        ),
        "none",
    ],
)
def test_a_sandboxed_process_has_no_core_limit_to_raise_and_leaves_no_core(tmp_path, sandbox):
    seen, cores = crash(tmp_path, sandbox)
    assert (seen["soft"], seen["hard"], seen["raised"]) == (0, 0, False)
    assert cores == []


def test_control_outside_the_launcher_the_limit_is_the_hosts_and_a_core_is_written(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", CRASH],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_host_core_limit,
    )
    seen = json.loads(done.stdout)
    assert (seen["soft"], seen["hard"], seen["raised"]) == (resource.RLIM_INFINITY,) * 2 + (True,)
    if _core_pattern().startswith(("|", "/")):
        pytest.skip(f"core_pattern {_core_pattern()!r} writes no core beside the process: not checkable here")
    assert _cores(tmp_path) != []
