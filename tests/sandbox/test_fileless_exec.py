"""No program held only in memory runs inside a sandbox ("fileless" execution).

The attack: copy an executable into a memfd and run it through ``/proc/self/fd/N`` or through
``execveat(fd, "", AT_EMPTY_PATH)`` (glibc's ``fexecve``), or ask for an executable memfd outright
(``MFD_EXEC``). Two layers stop it, each seen in the errno: the launcher gives the sandbox a PID
namespace whose ``vm.memfd_noexec`` is 2 (every memfd non-executable, ``MFD_EXEC`` refused:
EACCES, from the kernel), and the seccomp filter denies ``execveat`` (EPERM). The control runs the
same probe with ``sandbox = "none"``: every way runs the program, and the host's own
``vm.memfd_noexec`` is what it was.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harnessrl.controller.sandbox_check import run_probe
from harnessrl.sandbox.bwrap import sandbox_problem

MEMFD_NOEXEC = Path("/proc/sys/vm/memfd_noexec")

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
    ),
    pytest.mark.skipif(not MEMFD_NOEXEC.exists(), reason="vm.memfd_noexec needs Linux 6.3"),
]


def test_a_memfd_cannot_be_executed_inside_the_sandbox():
    host_before = MEMFD_NOEXEC.read_text()
    run = run_probe(["fileless"])
    seen = run.seen.get("fileless", {})
    assert seen, run.stderr[-2000:]
    assert seen["memfd_noexec"] == "2"
    assert seen["memfd"] == "EACCES"  # the kernel: the memfd is sealed non-executable
    assert seen["memfd_execveat"] == "EPERM"  # seccomp denies execveat
    assert seen["memfd_exec_flag"] == seen["memfd_exec_flag_execveat"] == "memfd_create: EACCES"
    assert MEMFD_NOEXEC.read_text() == host_before  # the host's value is never changed


def test_control_without_the_sandbox_every_way_runs_the_program():
    host_before = MEMFD_NOEXEC.read_text()
    run = run_probe(["fileless"], sandbox="none")
    seen = run.seen.get("fileless", {})
    assert seen, run.stderr[-2000:]
    assert seen["memfd_noexec"] == host_before.strip()
    if host_before.strip() == "0":  # a host that already forbids it leaves nothing to control
        assert {k: v for k, v in seen.items() if k != "memfd_noexec"} == {
            "memfd": "ran",
            "memfd_execveat": "ran",
            "memfd_exec_flag": "ran",
            "memfd_exec_flag_execveat": "ran",
        }
