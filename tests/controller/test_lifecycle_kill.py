"""A controller killed outright (``SIGKILL``: no shutdown code runs) takes its sandboxes with it: the
launcher dies with its parent (``PR_SET_PDEATHSIG``), bwrap with the launcher (``--die-with-parent``),
the harness with bwrap's PID namespace. They used to run on under PID 1 until their deadline.

What stays is each attempt's cgroup folder, empty (nobody is left to remove it; a later controller
does not reap them): the test checks it is empty and removes it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harnessrl.sandbox.cgroups import CGROUP_ROOT, ResourceGroup

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")

# A sleep duration no other process on the machine uses, so the scan finds only this test's harness.
MARK = f"{400 + os.getpid() % 1000}.{time.time_ns() % 10**6}"

CONTROLLER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from harnessrl.controller.base import HarnessSpec
    from harnessrl.controller.controller import Controller, ControllerConfig, GatewayEndpoint
    from harnessrl.controller.evaluators import build_evaluator
    from harnessrl.controller.local import LocalRunner
    from harnessrl.store.sqlite import SQLiteStore

    tmp, mark = Path(sys.argv[1]), sys.argv[2]
    store = SQLiteStore(tmp / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    controller = Controller(
        store,
        LocalRunner(bridge_path=None),
        gateway=GatewayEndpoint("127.0.0.1", 9),
        harness=HarnessSpec(command=["sleep", mark], timeout_s=600, sandbox="bwrap"),
        evaluator=build_evaluator({"type": "command", "command": ["true"]}),
        run_dir=tmp / "run",
        config=ControllerConfig(poll_interval_s=0.1),
    )
    asyncio.run(controller.run_until_done([rid], timeout_s=600))
    """
)


def sandbox_processes(*markers: str) -> list[int]:
    """Pids of live processes whose command line holds any of ``markers`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(
                line for line in (entry / "status").read_text().splitlines() if line.startswith("State")
            )
        except (OSError, StopIteration):
            continue  # gone meanwhile
        if "Z" not in state.split()[1] and any(m in cmdline for m in markers):
            found.append(int(entry.name))
    return found


def attempt_cgroups(controller_pid: int) -> list[Path]:
    """The cgroup folders of the attempts a controller process started (named
    ``<rollout>-<attempt>-<pid>@<owner tag>``, under ``harnessrl/`` of each hierarchy: v2, or v1's
    per-controller ones)."""
    pattern = f"harnessrl/*-{controller_pid}@*"
    return [*CGROUP_ROOT.glob(pattern), *CGROUP_ROOT.glob(f"*/{pattern}")]


def cgroups_here() -> bool:
    """Whether this machine gives the sandbox cgroups (a group can be made, then is removed)."""
    group = ResourceGroup.create(f"probe-{os.getpid()}", memory_mb=None, max_processes=None)
    if group is None:
        return False
    group.destroy()
    return True


def cgroup_empty(group: Path) -> bool:
    """No process in ``group``; a group already removed (another process's ``create`` sweeps the
    empty groups of a killed owner) is empty too."""
    try:
        return (group / "cgroup.procs").read_text() == ""
    except FileNotFoundError:
        return True


def wait_for(condition, timeout_s: float = 60) -> bool:
    """Poll ``condition`` until it holds (a state, not a time: ``timeout_s`` only ends a hung test)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_sigkilled_controller_leaves_no_sandbox_running(tmp_path):
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(tmp_path), MARK])
    try:
        # The harness, bwrap and the launcher (whose argv names the attempt's spec in tmp_path).
        markers = (f"sleep {MARK}", str(tmp_path / "run"))
        # Control: the sandbox is really up before the kill (harness running: the scan can see it).
        assert wait_for(lambda: len(sandbox_processes(f"sleep {MARK}")) > 0), "the harness never started"
        assert sandbox_processes(str(tmp_path / "run")), "the launcher is not seen by the scan"
        groups = attempt_cgroups(controller.pid)  # none where this machine gives no cgroups
        assert groups or not cgroups_here()  # control: the scan sees the attempt's groups
        controller.send_signal(signal.SIGKILL)
        controller.wait()
        assert wait_for(lambda: sandbox_processes(*markers) == [], timeout_s=30), (
            f"left running after the controller was killed: {sandbox_processes(*markers)}"
        )
        for group in groups:
            assert wait_for(lambda g=group: cgroup_empty(g), timeout_s=30), group
    finally:
        controller.kill()
        for pid in sandbox_processes(f"sleep {MARK}", str(tmp_path / "run")):  # an old launcher's leftovers
            os.kill(pid, signal.SIGKILL)
        for group in attempt_cgroups(controller.pid):
            wait_for(lambda g=group: cgroup_empty(g), timeout_s=30)
            with contextlib.suppress(FileNotFoundError):
                group.rmdir()
