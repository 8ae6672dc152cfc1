"""``limits.max_entries`` bounds the entries (files, links, folders) a sandbox may make in the folders it
writes, ``disk_mb`` or not, tried for real through the launcher and the local runner.

Millions of empty files or hard links take no disk worth counting, but every later walk of the tree
(the evaluator's copy, the removal) must visit each: with ``disk_mb`` unset nothing bounded them. The
launcher counts the writable folders' entries while the command runs and once more when it ends, and
past the cap kills the sandbox (exit ``ENTRIES_EXCEEDED``, the status file and stderr say why). The
controls make fewer entries than the cap and end as they chose."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.controller.base import ExitKind, Launch, ResourceLimits
from harnessrl.controller.local import LocalRunner
from harnessrl.sandbox.bwrap import python_install_paths, sandbox_problem
from harnessrl.sandbox.enter import ENTRIES_EXCEEDED, read_status
from harnessrl.sandbox.host import LAUNCHER_ENV, SandboxHost

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the launcher's PID namespace needs root here")

BWRAP = pytest.param(
    "bwrap",
    marks=pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox: {sandbox_problem()}"),
)
CAP = 3000

# Makes N entries in the workspace (an empty file, hard links to it, empty folders) and N / 4 in the
# home, then sleeps SLEEP seconds (a harness that would run on) and exits 0.
MAKE = """
import os, sys, time
n, home, sleep = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
open("f0", "w").close()
for i in range(1, n):
    os.link("f0", f"l{i}") if i % 2 else os.mkdir(f"d{i}")
for i in range(n // 4):
    open(os.path.join(home, f"h{i}"), "w").close()
time.sleep(sleep)
"""


def launch(
    tmp_path: Path, sandbox: str, entries: int, sleep: float
) -> tuple[subprocess.CompletedProcess, dict]:
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    host = SandboxHost(parent=tmp_path)
    spec = tmp_path / "spec.json"
    try:
        argv = host.launch_argv(
            spec,
            sandbox=sandbox,
            command=[sys.executable, "-c", MAKE, str(entries), str(home), str(sleep)],
            cwd=workspace,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            writable=(workspace, home),
            read_only=python_install_paths(),
            network="none",
            limits={"max_entries": CAP},
        )
        # The timeout only ends a hung test: the attack sleeps far longer, and is killed well before.
        done = subprocess.run(argv, env=LAUNCHER_ENV, capture_output=True, text=True, timeout=300)
    finally:
        host.close()
    return done, read_status(str(spec))


@pytest.mark.parametrize("sandbox", [BWRAP, "none"])
def test_a_sandbox_making_more_entries_than_max_entries_is_killed(tmp_path, sandbox):
    done, status = launch(tmp_path, sandbox, 2 * CAP, sleep=3600)
    assert done.returncode == ENTRIES_EXCEEDED, done.stderr[-2000:]
    assert f"limits.max_entries = {CAP}" in done.stderr
    assert status["started"] is True and status["limit"] == "max_entries"
    assert status["exit_code"] == 128 + 9  # killed (making entries, or in its hour of sleep), not ended


@pytest.mark.parametrize("sandbox", [BWRAP, "none"])
def test_entries_made_right_before_the_command_exits_count_too(tmp_path, sandbox):
    # The workspace's entries alone stay under the cap; with the home's they are past it.
    done, status = launch(tmp_path, sandbox, CAP - 100, sleep=0)
    assert done.returncode == ENTRIES_EXCEEDED, done.stderr[-2000:]
    assert status["limit"] == "max_entries"
    # Past the cap only in the last few milliseconds: counted at the end (0), or, rarely, by a look
    # that fell in them (killed).
    assert status["exit_code"] in (0, 128 + 9)


@pytest.mark.parametrize("sandbox", [BWRAP, "none"])
def test_control_under_max_entries_the_command_ends_as_it_chose(tmp_path, sandbox):
    done, status = launch(tmp_path, sandbox, CAP // 2, sleep=2.5)  # a look of the watch while it sleeps
    assert done.returncode == 0, done.stderr[-2000:]
    assert "max_entries" not in done.stderr
    assert status == {"started": True, "detail": "", "exit_code": 0}


def test_max_entries_has_a_default_that_holds_with_disk_mb_unset():
    limits = ResourceLimits(disk_mb=None)
    assert limits.max_entries == 1_000_000
    with pytest.raises(ValueError, match="max_entries"):
        ResourceLimits(max_entries=0)


@pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox: {sandbox_problem()}")
def test_the_local_runner_passes_max_entries_and_the_attempt_is_a_resource_limit(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()

    async def go(max_entries: int):
        runner = LocalRunner(bridge_path=None)
        handle = await runner.launch(
            Launch(
                rollout_id=f"r{max_entries}",
                attempt=0,
                argv=[sys.executable, "-c", MAKE, str(CAP), str(tmp_path / "home"), "3600"],
                env={"PATH": os.environ["PATH"]},
                task={},
                files={},
                workspace=workspace,
                cwd=workspace,
                log_dir=tmp_path / f"logs-{max_entries}",
                timeout_s=300,  # only ends a hung test
                network="none",
                limits=ResourceLimits(disk_mb=None, max_entries=max_entries),
            )
        )
        try:
            return await handle.wait()
        finally:
            await runner.aclose()

    exit_ = asyncio.run(go(CAP // 2))
    assert exit_.kind is ExitKind.RESOURCE_LIMIT, exit_
    assert "limits.max_entries" in exit_.detail, exit_  # not "file size limit exceeded"
    spec = json.loads((tmp_path / f"logs-{CAP // 2}" / "sandbox-0.json").read_text())
    assert spec["limits"]["max_entries"] == CAP // 2
    assert sorted(spec["writable"]) == sorted([str(workspace), str(tmp_path / "home")])
    assert "limits.max_entries" in (tmp_path / f"logs-{CAP // 2}" / "stderr.log").read_text()
