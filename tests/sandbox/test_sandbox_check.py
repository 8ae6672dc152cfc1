"""``harnessrl sandbox check`` reports issue 35's properties, and notices when one does not hold.

The check itself is run as users run it; its control feeds the same property functions what the
same probes see without isolation (``sandbox = "none"``, a scorer running its code with a plain
subprocess, the command evaluator with ``sandbox = "none"`` and no limits): each must then be
reported NOT HELD.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.controller.sandbox_check import (
    check_folder,
    no_fileless_exec,
    run_probe,
    scorer_isolation,
    seccomp_parity,
)
from harnessrl.controller.sandbox_check_evaluator import (
    copy_held,
    limits_held,
    prepare_workspace,
    probe_evaluator,
)
from harnessrl.sandbox import landlock
from harnessrl.sandbox.bwrap import sandbox_problem

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
)

NEW_PROPERTIES = (
    "seccomp at least as strict as Docker's default",
    "no fileless exec",
    "scorer isolation",
    "evaluator workspace copy skips FIFOs/sockets and keeps sparse files sparse",
    "evaluator sandbox limits (memory, processes, /tmp)",
    "host sysctls read-only",
)


def test_the_check_reports_the_new_properties_held():
    proc = subprocess.run(
        [sys.executable, "-m", "harnessrl", "sandbox", "check"], capture_output=True, text=True, timeout=120
    )
    lines = {name: [line for line in proc.stdout.splitlines() if name in line] for name in NEW_PROPERTIES}
    assert all(len(found) == 1 for found in lines.values()), proc.stdout + proc.stderr
    assert all(found[0].startswith("held") for found in lines.values()), proc.stdout
    scorer = lines["scorer isolation"][0]
    assert f"Landlock ABI {landlock.abi_version()}" in scorer
    if landlock.abi_version() >= landlock.SCOPE_ABI:
        assert "isolation 'landlock'" in scorer
    assert "all refused" in lines["seccomp at least as strict as Docker's default"][0]


def test_control_the_same_probes_without_isolation_are_reported_not_held():
    run = run_probe(["syscalls", "fileless", "scorer"], sandbox="none", plain=True)
    assert set(run.seen) == {"syscalls", "fileless", "scorer"}, run.stderr[-2000:]
    parity = seccomp_parity(run.seen["syscalls"], run.targets["calls"])
    fileless = no_fileless_exec(run.seen["fileless"])
    scorer = scorer_isolation(run.seen["scorer"], run.stdout, run.targets["forged"])
    assert not parity.held and "io_uring_setup" in parity.detail and "mbind" in parity.detail
    assert not fileless.held and "memfd" in fileless.detail
    assert not scorer.held and "environ" in scorer.detail and "leftover" in scorer.detail


def test_control_the_evaluator_probe_without_its_sandbox_and_limits_is_reported_not_held():
    folder = check_folder()
    fills = lambda: {p.name for p in Path("/tmp").glob("harnessrl-check-fill-*")}  # noqa: E731
    before = fills()  # another run's, killed before its cleanup: not this probe's to answer for
    try:
        prepare_workspace(folder / "ws")
        probe = asyncio.run(probe_evaluator(folder / "ws", mode="none", limits=None))
        copy, copy_detail = copy_held(probe)
        limits, limits_detail = limits_held(probe)
        assert not copy and "FIFO fifo, socket socket" in copy_detail
        assert not limits and probe.seen["memory"] == "allocated" and probe.seen["processes"] == 64
        # unsandboxed, the scorer wrote into the host's /tmp: it leaves nothing there (CI's disk)
        assert fills() <= before
        # and the "sparse" measure notices a copy that wrote the holes out
        shutil.copyfile(folder / "ws" / "sparse.bin", folder / "dense.bin")
        assert os.stat(folder / "dense.bin").st_blocks * 512 >= 64 << 20
    finally:
        shutil.rmtree(folder, ignore_errors=True)
