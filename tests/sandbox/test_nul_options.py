"""A NUL byte in anything that becomes a bubblewrap option adds options of its own: bubblewrap reads
them NUL-separated (``--args``), so an environment value ``a\\0--bind\\0/\\0/hostroot`` (filled from a
task field by a harness's or a scorer's ``env``) mounted the host's ``/`` writable inside. The host
refuses such a launch for every caller; the control lets it through and sees the host's files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.sandbox.sandboxed import run_sandboxed

import harnessrl.sandbox.host as host_module
from harnessrl.errors import ConfigError
from harnessrl.sandbox.bwrap import sandbox_problem

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
)

INJECTED = {"X": "a\0--bind\0/\0/rollout/hostroot"}
PROBE = "import os; print('host visible' if os.path.isdir('/rollout/hostroot/etc') else 'host hidden')"


def launch(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    return run_sandboxed(tmp_path, [sys.executable, "-c", PROBE], env, workspace)


def test_a_nul_byte_in_the_environment_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="environment variable 'X' holds a NUL byte"):
        launch(tmp_path, INJECTED)
    assert not (tmp_path / "spec.json").exists()
    assert launch(tmp_path, {"X": "a"}).stdout.strip() == "host hidden"  # control: a plain value runs


def test_control_without_the_check_the_nul_byte_binds_the_hosts_root(tmp_path, monkeypatch):
    monkeypatch.setattr(host_module, "_refuse_nul", lambda *args: None)
    done = launch(tmp_path, INJECTED)
    assert done.stdout.strip() == "host visible", done.stderr[-2000:]
