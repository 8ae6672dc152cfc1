"""``/proc/<pid>/mem`` inside a sandbox: what holds, as docs/sandbox.md states it.

Without Yama (this kernel has none) the kernel lets a process open the memory of any dumpable
process of the same uid with no more capabilities: inside one sandbox, every process of the harness
can read and write every other (its own children, bwrap's pid 1). The sandbox boundary is the PID
namespace (nothing outside is visible: ``tests/redteam``'s ``proc_mem_admin_key``), and a scorer
is a separate domain (``run_scored``: ``test_scored.py``, and ``harnessrl sandbox check``). This
test pins the residual, so a change to it (Yama, a per-process domain) updates the docs.
"""

from __future__ import annotations

import os

import pytest

from harnessrl.controller.sandbox_check import run_probe
from harnessrl.sandbox.bwrap import sandbox_problem


@pytest.mark.skipif(
    os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
)
@pytest.mark.skipif(os.path.exists("/proc/sys/kernel/yama"), reason="Yama decides this where present")
def test_processes_of_one_sandbox_can_open_each_others_memory():
    run = run_probe(["proc_mem"])
    assert run.seen.get("proc_mem") == {"child": "opened", "pid1": "opened"}, run.stderr[-2000:]
