"""The command evaluator's part of ``harnessrl sandbox check``, tried through the real ``CommandEvaluator``.

One evaluation over a workspace that holds a FIFO, a Unix socket and a sparse file, with small
limits; its scorer (``SCORER``, standard library only) reports what it sees of its workspace copy
and what its sandbox let it do: allocate four times the memory cap in a child, start processes up to
four times the process cap, fill ``/tmp`` to four times its size. The host side turns that into two
properties: the workspace copy skips special files and keeps sparse files sparse (and the evaluation
ends, rather than hanging on the FIFO), and the limits hold.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.controller.evaluators.command import SPECIAL_FILES_SKIPPED, CommandEvaluator, EvaluatorSandbox
from harnessrl.controller.evaluators.config import CommandEvaluatorConfig, EvaluatorLimits
from harnessrl.controller.evaluators.types import EvaluationInput

SPARSE_BYTES = 256 << 20  # apparent size of the sparse file; one byte of data at its end
MEMORY_MB, MAX_PROCESSES, TMP_MB = 128, 16, 8  # the caps the check's evaluation runs under
LIMITS = EvaluatorLimits(memory_mb=MEMORY_MB, max_processes=MAX_PROCESSES, tmp_mb=TMP_MB)
TRIES = 4  # the scorer asks for TRIES times each cap

SCORER = r"""
import json, os, stat, subprocess, sys
caps = json.loads(sys.argv[1])
ws = os.environ["HARNESSRL_WORKSPACE"]
out = {}
def kind(name):
    try:
        mode = os.lstat(os.path.join(ws, name)).st_mode
    except FileNotFoundError:
        return "absent"
    return "fifo" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "other"
out["fifo"], out["socket"] = kind("pipe"), kind("sock")
sparse = os.stat(os.path.join(ws, "sparse.bin"))
out["sparse_size"], out["sparse_allocated"] = sparse.st_size, sparse.st_blocks * 512
hog = subprocess.run([sys.executable, "-c", f"b = bytearray({caps['memory']}); b[-1] = 1"], capture_output=True)
out["memory"] = "allocated" if hog.returncode == 0 else f"refused (exit {hog.returncode})"
started = []
try:
    for _ in range(caps["processes"]):
        started.append(subprocess.Popen(["sleep", "30"]))
except OSError as exc:
    out["processes_refused"] = exc.strerror
out["processes"] = len(started)
for proc in started:
    proc.kill()
    proc.wait()
written = 0
fill = f"/tmp/harnessrl-check-fill-{os.getpid()}"
try:
    with open(fill, "wb") as f:
        while written < caps["tmp"]:
            f.write(b"x" * (1 << 20))
            f.flush()
            written += 1 << 20
except OSError as exc:
    out["tmp_refused"] = exc.strerror
finally:  # unsandboxed (the tests' control) this is the host's /tmp
    if os.path.exists(fill):
        os.remove(fill)
out["tmp_written"] = written
print(json.dumps({"reward": 0.0, **out}))
"""


@dataclass(frozen=True)
class EvaluatorProbe:
    seen: dict[str, Any]  # what the scorer reported ({} when it reported nothing)
    flags: tuple[str, ...]
    details: dict[str, Any]


def prepare_workspace(workspace: Path) -> None:
    """A FIFO, a Unix socket file and a sparse file: what once hung or amplified the copy."""
    workspace.mkdir(parents=True, exist_ok=True)
    os.mkfifo(workspace / "pipe")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(workspace / "sock"))
    with open(workspace / "sparse.bin", "wb") as f:
        f.truncate(SPARSE_BYTES - 1)
        f.seek(SPARSE_BYTES - 1)
        f.write(b"x")


async def probe_evaluator(
    workspace: Path, *, mode: str = "bwrap", limits: EvaluatorLimits | None = LIMITS
) -> EvaluatorProbe:
    """Run ``SCORER`` over ``workspace`` (``prepare_workspace``) through ``CommandEvaluator``: its
    sandbox ``mode`` ("none" for a control) and ``limits`` (None: no caps, the other control)."""
    asked = {  # always TRIES times the check's own caps, so the no-limits control asks the same
        "memory": TRIES * MEMORY_MB << 20,
        "processes": TRIES * MAX_PROCESSES,
        "tmp": TRIES * TMP_MB << 20,
    }
    config = CommandEvaluatorConfig(
        command=[sys.executable, "-I", "-c", SCORER, json.dumps(asked)],
        reward_from="json",
        timeout_s=60,
        limits=limits or EvaluatorLimits(memory_mb=None, max_processes=None),
    )
    evaluator = CommandEvaluator(config, sandbox=EvaluatorSandbox(mode=mode))
    inp = EvaluationInput(task={}, workspace=workspace, rollout_id="sandbox-check")
    result = await asyncio.wait_for(evaluator.evaluate(inp), 120)
    return EvaluatorProbe(result.details.get("output", {}), result.flags, result.details)


def copy_held(probe: EvaluatorProbe) -> tuple[bool, str]:
    seen = probe.seen
    if not seen:
        return False, f"the scorer reported nothing: {probe.details.get('why', probe.details)}"
    held = (
        seen["fifo"] == seen["socket"] == "absent"
        and SPECIAL_FILES_SKIPPED in probe.flags
        and seen["sparse_size"] == SPARSE_BYTES
        and seen["sparse_allocated"] < 1 << 20
    )
    return held, (
        f"FIFO {seen['fifo']}, socket {seen['socket']}, {SPARSE_BYTES >> 20} MiB sparse file copied "
        f"as {seen['sparse_allocated'] >> 10} KiB"
    )


def limits_held(probe: EvaluatorProbe) -> tuple[bool, str]:
    seen = probe.seen
    if not seen:
        return False, f"the scorer reported nothing: {probe.details.get('why', probe.details)}"
    held = (
        seen["memory"] != "allocated"
        and seen["processes"] < TRIES * MAX_PROCESSES  # the cgroup's cap also leaves room for the wrappers
        and seen["tmp_written"] <= (TMP_MB + 1) << 20
    )
    return held, (
        f"{TRIES}x the {MEMORY_MB} MiB memory cap {seen['memory']}, {seen['processes']} of "
        f"{TRIES * MAX_PROCESSES} processes started (cap {MAX_PROCESSES} + the sandbox's own), "
        f"{seen['tmp_written'] >> 20} of {TRIES * TMP_MB} MiB written to a {TMP_MB} MiB /tmp"
    )
