"""The host side of a sandbox launch: ``python -m harnessrl.sandbox.enter SPEC.json``.

It runs as the controller's user (root on our machines), single-threaded, between the controller
and ``bwrap``: (1) it joins the attempt's cgroups, so everything started below is counted and can
be killed as one; (2) it sets the rlimits (CPU time, open files, file size, no core files,
and address space or processes where no cgroup does), which every process below inherits; (3) it starts
``bwrap`` with the seccomp filter on an inherited descriptor, and learns from ``init.py`` (on
``INIT_STATUS_FD``, which the command never holds) whether the command started; (4) it watches the
entries of the folders the sandbox may write (``limits.max_entries``), and kills the sandbox past
them; (5) it exits with the sandboxed command's status. With ``"bwrap_argv": null``
(``sandbox = "none"``) it runs the command directly: cgroups and rlimits only, no isolation.

**Whether the command started is written to the spec's ``status_file``** (``{"started": bool,
"detail": ..., "exit_code": ...}``), a file in a folder the sandbox never sees. That file, not the
exit status, is how the controller tells an infrastructure failure (the sandbox could not be set
up, the command could not be started) from the command's own outcome: an exit status is the
command's to choose, so a harness that exits 125 is a harness that exited 125.

**It dies with its controller.** It asks the kernel for ``SIGKILL`` when its parent dies
(``PR_SET_PDEATHSIG``), and ``bwrap`` runs with ``--die-with-parent``, whose death ends the sandbox's
PID namespace: a controller killed with ``SIGKILL`` (or any signal it does not handle) leaves no
launcher, ``bwrap`` or harness running under PID 1. The parent may die before the request is made, so
afterwards the launcher checks its parent is still the one that started it (``PARENT_ENV``, set by the
runner; else the parent seen at start) and exits 125 if not. With ``sandbox = "none"`` the command
gets the same signal; what it started in a new session of its own is then left to the cgroup, which
no one kills after a controller's death (its folder stays while a process is in it; an empty one is
removed by the next ``ResourceGroup.create``, see ``cgroups.py``).

**No core files** (``RLIMIT_CORE`` 0, hard): a crashing process wrote its core into the workspace
(a core file the size of its memory, past ``disk_mb``'s next look), and a host whose
``kernel/core_pattern`` pipes to a helper would hand the helper, outside the sandbox, every core.

**The entries of the writable folders are bounded** (``limits.max_entries``, the spec's ``writable``
folders): the launcher counts them every ``ENTRY_CHECK_INTERVAL_S`` (or ten times as long as a
count took) while it waits, and once more when the command ends; past the cap it kills ``bwrap``
(its PID namespace dies with it), says so on stderr and in the status file (``"limit"``), and exits
``ENTRIES_EXCEEDED``.
Millions of empty files or hard links take no disk worth counting, but every later walk of the tree
(the evaluator's copy, the removal) must visit each. The count is the launcher's CPU time, so the
CPU limit is set in the children only (``RLIMIT_CPU`` of the launcher would end the attempt for it).

Exit status: the command's own; ``128 + N`` if it was killed by signal ``N``; 125 if the sandbox
could not be set up; 127 if the command could not be started (both also said in the status file);
``ENTRIES_EXCEEDED`` (``128 + SIGXFSZ``, the kernel's own status for a file past its size limit,
which the runners count as a resource limit) if it killed the sandbox for ``limits.max_entries``.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.sandbox.bwrap import INIT_PATH, INIT_STATUS_FD
from harnessrl.sandbox.disk import count_entries

SETUP_FAILED = 125
CANNOT_START = 127
_CLONE_NEWPID = 0x20000000
MEMFD_NOEXEC = "/proc/sys/vm/memfd_noexec"
#: The pid of the process that starts the launcher (the controller), in the launcher's environment:
#: what ``_die_with_parent`` compares with (removed before bwrap starts: its environ shows inside).
PARENT_ENV = "HARNESSRL_LAUNCHER_PARENT"
_PR_SET_PDEATHSIG = 1
#: The launcher's exit status when it killed the sandbox for ``limits.max_entries``.
ENTRIES_EXCEEDED = 128 + signal.SIGXFSZ
#: The shortest pause between two counts of the writable folders' entries.
ENTRY_CHECK_INTERVAL_S = 2.0


def status_path(spec_path: str) -> str:
    """Where the launch of ``spec_path`` reports whether its command started (beside the spec)."""
    return (
        spec_path[: -len(".json")] + ".status.json" if spec_path.endswith(".json") else spec_path + ".status"
    )


def read_status(spec_path: str) -> dict[str, Any]:
    """The launch's status; ``{"started": False, ...}`` when the launcher never wrote one."""
    try:
        with open(status_path(spec_path)) as f:
            status = json.load(f)
    except (OSError, ValueError):
        return {"started": False, "detail": "the sandbox launcher wrote no status (it did not run?)"}
    return status if isinstance(status, dict) else {"started": False, "detail": "unreadable status"}


def _write_status(path: str | None, **status: Any) -> None:
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(status, f)
    os.replace(tmp, path)


def _set_limits(limits: dict[str, Any]) -> None:
    """The rlimits of the launcher and so of all below it (the CPU limit: ``_set_cpu``, children only)."""
    # No core files: in the workspace (core_pattern "core") each is as large as the process's memory;
    # a pipe in core_pattern hands it to a helper on the host. Hard, so nothing below can raise it.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.get("memory_mb") and not limits.get("cgroup_memory"):
        cap = limits["memory_mb"] * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    if limits.get("max_processes") and not limits.get("cgroup_pids"):
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))
    if limits.get("file_mb"):
        # The largest file any process may write or fallocate (EFBIG past it; SIGXFSZ, which Python
        # ignores, kills most other programs). The logs are pipes, not files: not counted here.
        cap = limits["file_mb"] * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))


def _set_cpu(limits: dict[str, Any]) -> None:
    """``RLIMIT_CPU``, in the child before its exec: the launcher's own time (counting entries) is not
    the command's."""
    if limits.get("cpu_seconds"):
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 5))


def _in_child(limits: dict[str, Any], *then: Callable[[], None] | None) -> Callable[[], None]:
    """A ``preexec_fn``: the CPU limit, then ``then`` (those not None)."""

    def run() -> None:
        _set_cpu(limits)
        for step in then:
            if step is not None:
                step()

    return run


@dataclass
class _EntryCap:
    """``limits.max_entries`` over the spec's ``writable`` folders."""

    folders: tuple[Path, ...]
    cap: int

    @classmethod
    def of(cls, spec: dict[str, Any]) -> _EntryCap | None:
        cap = spec.get("limits", {}).get("max_entries")
        folders = tuple(Path(f) for f in spec.get("writable", []))
        return cls(folders, cap) if cap and folders else None

    def over(self) -> bool:
        try:
            return count_entries(self.folders, self.cap) > self.cap
        except MemoryError:  # the names of a folder of millions, under RLIMIT_AS: too many to count
            return True


def _wait(proc: subprocess.Popen[bytes], entries: _EntryCap | None) -> tuple[int, bool]:
    """Wait for ``proc`` (killing it once ``entries`` are over their cap); its exit status, and whether
    the entries went past their cap (counted once more at the end: what was made after the last count,
    right before the command ended, counts too). This process's only thread does it: after
    ``unshare(CLONE_NEWPID)`` it cannot start another."""
    if entries is None:
        return proc.wait(), False
    pause = ENTRY_CHECK_INTERVAL_S
    while True:
        try:
            return proc.wait(timeout=pause), entries.over()
        except subprocess.TimeoutExpired:
            pass
        started = time.monotonic()
        if entries.over():
            proc.kill()
            return proc.wait(), True
        # A tree of many entries takes a while to count: wait ten counts between two.
        pause = max(ENTRY_CHECK_INTERVAL_S, 10 * (time.monotonic() - started))


def _entries_exceeded(status_file: str | None, entries: _EntryCap, code: int) -> int:
    detail = (
        f"the sandbox's writable folders held more than limits.max_entries = {entries.cap} entries "
        "(files, links, folders): killed"
    )
    print(f"harnessrl sandbox: {detail}", file=sys.stderr, flush=True)
    _write_status(status_file, started=True, detail=detail, exit_code=code, limit="max_entries")
    return ENTRIES_EXCEEDED


def _set_open_files(limits: dict[str, Any]) -> None:
    """``RLIMIT_NOFILE`` (per process; what bounds the controller's side is the bridge's cap per
    sandbox, proxy.py). Set last, right before the command or bwrap starts, once this process's own
    descriptors are in place: a cap below ``INIT_STATUS_FD`` (200; ``open_files`` may be as low as 16)
    made its ``dup2`` there fail, and every attempt an infrastructure failure. A descriptor already
    open stays usable under a lower cap."""
    if limits.get("open_files"):
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))


def _read_line(fd: int, limit: int = 4096) -> bytes:
    """The first line written on ``fd`` (up to ``limit`` bytes), or what came before EOF."""
    data = b""
    while b"\n" not in data and len(data) < limit:
        chunk = os.read(fd, limit - len(data))
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


def _new_pid_namespace() -> bool:
    """Make the next child the first process (pid 1) of a new PID namespace; False where this process
    may not (it needs CAP_SYS_ADMIN: the controller is root on our machines)."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.unshare(_CLONE_NEWPID) == 0


def _memfds_not_executable() -> None:
    """Run in bwrap's process before its exec, as pid 1 of the namespace ``_new_pid_namespace`` made:
    set that namespace's ``vm.memfd_noexec`` to 2. The sysctl is per PID namespace (Linux 6.3+): the
    host's own value is untouched, the sandbox's namespace (a child of this one) inherits it and
    cannot lower it, so no memfd created inside can be executed and ``MFD_EXEC`` is refused. Without
    the sysctl (an older kernel) nothing is set: ``harnessrl sandbox check`` reports it."""
    try:
        with open(MEMFD_NOEXEC, "w") as f:
            f.write("2")
    except OSError:
        pass


def _command_start(argv: list[str]) -> int:
    """Where bwrap's options end: the ``--`` before the sandbox's init (``python -I -S INIT_PATH``)."""
    for i, arg in enumerate(argv):
        if arg == "--" and argv[i + 4 : i + 5] == [INIT_PATH]:
            return i
    return len(argv)


def _run_bwrap(
    argv: list[str],
    seccomp_file: str,
    status_file: str | None,
    limits: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
) -> int:
    """Start bwrap with the filter and init.py's status descriptor; report whether the command started."""
    filter_fd = os.open(seccomp_file, os.O_RDONLY)
    init_read, init_write = os.pipe()
    os.dup2(init_write, INIT_STATUS_FD, inheritable=True)
    os.close(init_write)
    # bwrap's options (binds with host paths, the environment) go through a file descriptor, not its
    # command line: the sandbox's pid 1 is a copy of bwrap, and its /proc/1/cmdline is visible inside.
    split = _command_start(argv)
    options = tempfile.TemporaryFile()  # noqa: SIM115 - closed below, once bwrap has read it
    # os.fsencode: a host path need not be UTF-8 (a run folder named with byte 0xff is a str with a
    # lone surrogate here, which str.encode refused: every launch in that folder failed).
    options.write(b"".join(os.fsencode(a) + b"\0" for a in ["--seccomp", str(filter_fd), *argv[1:split]]))
    options.flush()
    options.seek(0)
    args_fd = options.fileno()
    full = [argv[0], "--args", str(args_fd), *argv[split:]]
    # bwrap becomes pid 1 of a PID namespace of our own, whose memfds cannot be executed (this process
    # is single-threaded, so preexec_fn is safe). Killing bwrap kills everything in that namespace.
    noexec = _memfds_not_executable if _new_pid_namespace() else None
    try:
        _set_open_files(limits or {})
        proc = subprocess.Popen(
            full,
            pass_fds=(filter_fd, INIT_STATUS_FD, args_fd),
            stdin=subprocess.DEVNULL,
            preexec_fn=_in_child(limits or {}, noexec),
        )
    except OSError as exc:
        print(f"harnessrl sandbox: cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        _write_status(status_file, started=False, detail=f"cannot start {argv[0]!r}: {exc}")
        return SETUP_FAILED
    finally:
        os.close(filter_fd)
        os.close(INIT_STATUS_FD)
        options.close()
    # init.py writes "ok" right before it execs the command, or "error: ..."; EOF with nothing means
    # bwrap failed before init.py ran (bwrap itself holds a copy until it exits).
    with os.fdopen(init_read, "rb") as init_status:
        said = _read_line(init_status.fileno()).decode(errors="replace")
    if said == "ok":
        _write_status(status_file, started=True, detail="")
    # Killing bwrap, the first process of our PID namespace, ends every process of the sandbox.
    entries = _EntryCap.of(spec or {}) if said == "ok" else None
    code, too_many = _wait(proc, entries)
    code = 128 - code if code < 0 else code
    if entries is not None and too_many:
        return _entries_exceeded(status_file, entries, code)
    if said != "ok":
        detail = said.removeprefix("error: ") or f"bwrap failed to set up the sandbox (exit {code})"
        print(f"harnessrl sandbox: {detail}", file=sys.stderr, flush=True)
        _write_status(status_file, started=False, detail=detail, exit_code=code)
        return CANNOT_START if said.startswith("error:") else SETUP_FAILED
    _write_status(status_file, started=True, detail="", exit_code=code)
    return code


def _kill_me_with_parent() -> None:
    """``SIGKILL`` this process when its parent (the thread that forked it) dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _die_with_parent() -> bool:
    """Ask to die with the parent; whether the parent is still the one that started this process (if
    it died before the request, the request will never fire: the caller must exit)."""
    expected = os.environ.pop(PARENT_ENV, "")
    parent = int(expected) if expected.isdigit() else os.getppid()
    _kill_me_with_parent()
    return os.getppid() == parent


def main(argv: list[str]) -> int:
    if not _die_with_parent():
        print("harnessrl sandbox: the controller is gone; not starting", file=sys.stderr, flush=True)
        return SETUP_FAILED
    with open(argv[1]) as f:
        spec = json.load(f)
    status_file = spec.get("status_file")
    try:
        for group in spec.get("cgroup_dirs", []):
            with open(os.path.join(group, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        _set_limits(spec.get("limits", {}))
    except OSError as exc:
        print(f"harnessrl sandbox: setup failed: {exc}", file=sys.stderr, flush=True)
        _write_status(status_file, started=False, detail=f"setup failed: {exc}")
        return SETUP_FAILED
    if spec.get("bwrap_argv"):
        return _run_bwrap(spec["bwrap_argv"], spec["seccomp_file"], status_file, spec.get("limits"), spec)
    try:  # sandbox = "none"
        _set_open_files(spec.get("limits", {}))
        child = subprocess.Popen(  # single-threaded here: preexec_fn is safe
            spec["argv"],
            cwd=spec["cwd"],
            env=spec["env"],
            stdin=subprocess.DEVNULL,
            preexec_fn=_in_child(spec.get("limits", {}), _kill_me_with_parent),
        )
    except OSError as exc:
        print(f"harnessrl sandbox: cannot start {spec['argv'][0]!r}: {exc}", file=sys.stderr, flush=True)
        _write_status(status_file, started=False, detail=f"cannot start {spec['argv'][0]!r}: {exc}")
        return CANNOT_START
    _write_status(status_file, started=True, detail="")
    entries = _EntryCap.of(spec)  # killed past it: what it started in a session of its own is the cgroup's
    code, too_many = _wait(child, entries)
    code = 128 - code if code < 0 else code
    if entries is not None and too_many:
        return _entries_exceeded(status_file, entries, code)
    _write_status(status_file, started=True, detail="", exit_code=code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
