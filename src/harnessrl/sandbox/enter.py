"""The host side of a sandbox launch: ``python -m harnessrl.sandbox.enter SPEC.json``.

It runs as the controller's user (root on our machines), single-threaded, between the controller
and ``bwrap``: (1) it joins the attempt's cgroups, so everything started below is counted and can
be killed as one; (2) it sets the rlimits, which every process below inherits; (3) it starts
``bwrap`` with the seccomp filter on an inherited descriptor and reads bwrap's JSON status, so a
sandbox that failed to start (exit 125) is told apart from a harness that exited non-zero; (4) it
exits with the sandboxed command's status. With ``"bwrap_argv": null`` (``sandbox = "none"``) it
runs the command directly: cgroups and rlimits only, no isolation.

Exit status: the command's own; ``128 + N`` if it was killed by signal ``N``; 125 if the sandbox
could not be set up (an infrastructure failure); 127 if the command could not be started.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from typing import Any

SETUP_FAILED = 125
CANNOT_START = 127


def _set_limits(limits: dict[str, Any]) -> None:
    if limits.get("cpu_seconds"):
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 5))
    if limits.get("memory_mb") and not limits.get("cgroup_memory"):
        cap = limits["memory_mb"] * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    if limits.get("max_processes") and not limits.get("cgroup_pids"):
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))


def _run_bwrap(argv: list[str], seccomp_file: str) -> int:
    """Start bwrap, telling it the filter and a status pipe; 125 if the child never started."""
    filter_fd = os.open(seccomp_file, os.O_RDONLY)
    status_read, status_write = os.pipe()
    full = [argv[0], "--seccomp", str(filter_fd), "--json-status-fd", str(status_write), *argv[1:]]
    try:
        proc = subprocess.Popen(full, pass_fds=(filter_fd, status_write), stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"harnessrl sandbox: cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        return SETUP_FAILED
    finally:
        os.close(filter_fd)
        os.close(status_write)
    started = False
    with os.fdopen(status_read, "rb") as status:
        for line in status:  # bwrap writes one JSON object per line: child-pid first, exit-code last
            try:
                started = started or "child-pid" in json.loads(line)
            except ValueError:
                continue
    code = proc.wait()
    if not started:
        print(f"harnessrl sandbox: bwrap failed to set up the sandbox (exit {code})", file=sys.stderr)
        return SETUP_FAILED
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    try:
        for group in spec.get("cgroup_dirs", []):
            with open(os.path.join(group, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        _set_limits(spec.get("limits", {}))
    except OSError as exc:
        print(f"harnessrl sandbox: setup failed: {exc}", file=sys.stderr, flush=True)
        return SETUP_FAILED
    if spec.get("bwrap_argv"):
        return _run_bwrap(spec["bwrap_argv"], spec["seccomp_file"])
    try:  # sandbox = "none"
        child = subprocess.Popen(spec["argv"], cwd=spec["cwd"], env=spec["env"], stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"harnessrl sandbox: cannot start {spec['argv'][0]!r}: {exc}", file=sys.stderr, flush=True)
        return CANNOT_START
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
