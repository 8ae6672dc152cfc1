"""The sandbox's private tmpfs mounts are bounded by ``limits.memory_mb``, tried for real in bubblewrap.

Without a memory cgroup, ``memory_mb`` is ``RLIMIT_AS``, which does not see a tmpfs's pages: each
unsized tmpfs (the sandbox's root, where ``/x`` and ``/etc/x`` land, ``/run``, ``/dev`` with its
``/dev/shm``, ``/tmp``) held up to half the host's memory. Each is now sized to ``memory_mb`` (``/dev``
itself read-only), so writing past it fails with ``ENOSPC`` inside; the control, without
``memory_mb``, writes the same bytes. bubblewrap sizes a tmpfs from 0.7 on (``--size``): an older
one is refused when the sandbox is checked at startup, not at every launch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.errors import ConfigError
from harnessrl.sandbox.bwrap import python_install_paths, require_sandbox, sandbox_problem
from harnessrl.sandbox.host import LAUNCHER_ENV, SandboxHost

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the launcher's PID namespace needs root here"),
    pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"),
]

CAP_MB = 32
ATTEMPT_MB = 2 * CAP_MB
PLACES = ["/tmp/fill", "/dev/shm/fill", "/run/fill", "/fill", "/etc/fill"]

# Writes ATTEMPT_MB MiB to each place, 1 MiB at a time; reports what each took, and removes it.
FILL = f"""
import errno, json, os
chunk = b"z" * (1 << 20)
took = {{}}
for path in {PLACES!r}:
    written, error = 0, ""
    try:
        with open(path, "wb") as f:
            for _ in range({ATTEMPT_MB}):
                f.write(chunk)
                f.flush()
                written += 1
    except OSError as exc:
        error = errno.errorcode.get(exc.errno, str(exc.errno))
    took[path] = [written, error]
    try:
        os.unlink(path)
    except OSError:
        pass
for path in ("/dev/fill", "/dev/null"):
    try:
        with open(path, "wb") as f:
            f.write(b"x")
        took[path] = "written"
    except OSError as exc:
        took[path] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(took))
"""


def fill(tmp_path: Path, limits: dict) -> dict:
    workspace = tmp_path / "ws"
    workspace.mkdir(parents=True)
    host = SandboxHost(parent=tmp_path)
    try:
        argv = host.launch_argv(
            tmp_path / "spec.json",
            sandbox="bwrap",
            command=[sys.executable, "-c", FILL],
            cwd=workspace,
            env={},
            writable=(workspace,),
            read_only=python_install_paths(),
            network="none",
            limits=limits,  # no cgroup: memory_mb is RLIMIT_AS, and the tmpfs sizes
        )
        done = subprocess.run(argv, env=LAUNCHER_ENV, capture_output=True, text=True, timeout=300)
    finally:
        host.close()
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_writing_past_memory_mb_to_a_private_tmpfs_fails_with_enospc(tmp_path):
    took = fill(tmp_path, {"memory_mb": CAP_MB})
    for path in PLACES:
        written, error = took[path]
        assert written <= CAP_MB and error == "ENOSPC", (path, took)
    assert took["/dev/fill"] == "EROFS"  # /dev itself: read-only
    assert took["/dev/null"] == "written"  # its device nodes still work


def test_control_without_memory_mb_the_same_writes_go_through(tmp_path):
    took = fill(tmp_path, {})
    for path in PLACES:
        assert took[path] == [ATTEMPT_MB, ""], (path, took)
    assert took["/dev/null"] == "written"


def _bwrap_shim(tmp_path: Path, name: str, refuse_size: bool) -> Path:
    """A ``bwrap`` that runs the real one, or (``refuse_size``) answers ``--size`` as bubblewrap 0.6 does."""
    real = shutil.which("bwrap")
    assert real is not None
    refuse = (
        'for a in "$@"; do [ "$a" = --size ] && { echo "bwrap: Unknown option --size" >&2; exit 1; }; done\n'
    )
    shim = tmp_path / name
    shim.write_text(f'#!/bin/sh\n{refuse if refuse_size else ""}exec {real} "$@"\n')
    shim.chmod(0o755)
    return shim


def test_a_bubblewrap_without_size_is_refused_at_startup_naming_what_is_needed(tmp_path, monkeypatch):
    # Every launch sizes its tmpfs mounts: with a bwrap that cannot, every attempt would fail to start.
    monkeypatch.setenv("HARNESSRL_BWRAP", str(_bwrap_shim(tmp_path, "bwrap-0.6", refuse_size=True)))
    problem = sandbox_problem()
    assert problem is not None and "--size" in problem and "0.7" in problem
    with pytest.raises(ConfigError, match=r"harness\.sandbox: .*0\.7"):
        require_sandbox("bwrap")


def test_control_the_same_shim_over_a_bubblewrap_with_size_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESSRL_BWRAP", str(_bwrap_shim(tmp_path, "bwrap-same", refuse_size=False)))
    assert sandbox_problem() is None
