"""A root controller without a writable ``pids`` cgroup says, once, that ``limits.max_processes``
bounds nothing: the kernel never applies ``RLIMIT_NPROC`` to root's processes, and the sandbox user
is the controller's root, mapped (docs/sandbox.md). The machine without cgroups is made by
``ResourceGroup.create`` answering None, as it does where cgroups are not writable; the control is
this machine's own cgroups."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import pytest

from harnessrl.controller import local
from harnessrl.controller.base import ExitKind, Launch, ResourceLimits
from harnessrl.controller.local import LocalRunner
from harnessrl.sandbox.bwrap import sandbox_problem
from harnessrl.sandbox.cgroups import ResourceGroup

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the warning is a root controller's"),
    pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox: {sandbox_problem()}"),
]

WARNING = "max_processes bounds nothing"


def run_twice(tmp_path: Path) -> None:
    async def go() -> None:
        runner = LocalRunner(bridge_path=None)
        try:
            for attempt in range(2):
                workspace = tmp_path / f"ws-{attempt}"
                workspace.mkdir()
                handle = await runner.launch(
                    Launch(
                        rollout_id="r",
                        attempt=attempt,
                        argv=[sys.executable, "-c", "print('hi')"],
                        env={"PATH": os.environ["PATH"]},
                        task={},
                        files={},
                        workspace=workspace,
                        cwd=workspace,
                        log_dir=tmp_path / f"logs-{attempt}",
                        timeout_s=300,  # only ends a hung test
                        network="none",
                        limits=ResourceLimits(max_processes=64),
                    )
                )
                assert (await handle.wait()).kind is ExitKind.EXITED
        finally:
            await runner.aclose()

    asyncio.run(go())


def test_without_a_pids_cgroup_max_processes_is_said_to_bound_nothing_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(local, "_warned_unbounded", set())
    monkeypatch.setattr(ResourceGroup, "create", classmethod(lambda cls, *a, **k: None))
    with caplog.at_level(logging.WARNING, logger="harnessrl.controller"):
        run_twice(tmp_path)
    assert sum(WARNING in r.getMessage() for r in caplog.records) == 1  # once, not per attempt


def test_control_with_this_machines_pids_cgroup_nothing_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    group = ResourceGroup.create("probe-pids", memory_mb=None, max_processes=8)
    if group is None or "pids" not in group.controllers:
        pytest.skip("this machine has no writable pids cgroup")
    group.destroy()
    monkeypatch.setattr(local, "_warned_unbounded", set())
    with caplog.at_level(logging.WARNING, logger="harnessrl.controller"):
        run_twice(tmp_path)
    assert not [r for r in caplog.records if WARNING in r.getMessage()]
