"""Running the code under test from inside a scorer, in a trust domain of its own: ``run_scored``.

A scorer (the process whose output is the reward) often has to run the agent's code: import it, call
it, run the repository's tests. That code is as hostile as the agent: in the same sandbox, as the
same uid, it could read the scorer's inputs (hidden tests, expected values), its environment and
memory (``/proc/<scorer>/{environ,mem}``), write the scorer's stdout (``/proc/<scorer>/fd/1``),
signal it, or leave a process behind that writes a verdict once the scorer has exited.

``run_scored`` starts the code in a nested Landlock domain (``landlock.py``, run as a tiny launcher
that enters the domain and execs the command):

- it may read only the system folders, ``/etc``, ``/dev``, ``/proc``, Python's install and the
  ``readable`` paths, write only its working folder, ``/tmp`` and the ``writable`` paths: nothing of
  the scorer's own (keep inputs and private files elsewhere, e.g. under ``/run/harnessrl``);
- it cannot ptrace-attach to the scorer (``/proc/<scorer>/mem`` is closed) and, the scorer being
  non-dumpable, cannot open its ``environ``, ``maps`` or ``fd/*`` (as an unprivileged sandbox user;
  a root caller outside a sandbox keeps the read-mode ones), and cannot signal it (Landlock ABI 6);
- it gets none of the scorer's descriptors: stdin is a file or ``/dev/null``, stdout and stderr go to
  a file of the scorer's that it never sees by name;
- every process it started is killed before ``run_scored`` returns (the scorer is their subreaper,
  so nothing escapes by double-forking or ``setsid``), so nothing is left to write anything later.

The scorer also makes itself non-dumpable (``PR_SET_DUMPABLE 0``), which closes its ``/proc`` files
to same-uid processes even where Landlock is missing. ``ScoredRun.isolation`` says what held.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harnessrl.sandbox import landlock

_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_LAUNCHER = Path(landlock.__file__)

# Always readable (and executable): what any program needs to start. /dev is also writable (/dev/null).
_SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/sys")


class ScoredIsolationError(RuntimeError):
    """The scored code could not be started in its own domain (the launcher failed before exec)."""


@dataclass(frozen=True)
class ScoredRun:
    exit_code: int | None  # None when it was killed at its time limit; 128 + N when killed by signal N
    timed_out: bool
    output: bytes  # the tail of its stdout + stderr: untrusted, parse with care
    isolation: str  # "landlock" | "landlock-no-signal-scope" | "dumpable-only"
    leftovers: int = 0  # processes it left running that were killed after it exited


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if (
        libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        != 0
    ):
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def guard_scorer() -> None:
    """Make this (scoring) process non-dumpable and the reaper of everything it starts. Idempotent."""
    _prctl(_PR_SET_DUMPABLE, 0)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def isolation_level(abi: int | None = None) -> str:
    abi = landlock.abi_version() if abi is None else abi
    if abi >= landlock.SCOPE_ABI:
        return "landlock"
    return "landlock-no-signal-scope" if abi >= 1 else "dumpable-only"


def _python_paths() -> set[str]:
    return {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}


def domain_spec(*, cwd: Path, readable: Sequence[Path], writable: Sequence[Path], abi: int) -> dict:
    """The Landlock domain of scored code (JSON for the launcher): read/execute the system and Python,
    read ``readable``, read/write/execute ``cwd``, ``/tmp``, ``/dev`` and ``writable``; scoped."""
    read = landlock.READ | landlock.EXECUTE
    rules: dict[str, int] = {p: read for p in (*_SYSTEM_READ, *sorted(_python_paths()))}
    rules.update({str(p): read for p in readable})
    for path in ("/tmp", "/dev", str(cwd), *(str(p) for p in writable)):
        rules[path] = read | landlock.WRITE
    return {
        "rules": rules,
        "handled": read | landlock.WRITE,
        "scoped": landlock.SCOPE_SIGNAL | landlock.SCOPE_ABSTRACT_UNIX_SOCKET,
        "abi": abi,
    }


def _children_of(pids: set[int]) -> set[int]:
    """Every process whose parent is in ``pids``, read from /proc (each process's ``stat``)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) in pids:
            found.add(int(entry))
    return found


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = _children_of(frontier) - found
        found |= frontier
    return found


def kill_descendants(rounds: int = 200) -> int:
    """SIGKILL every process below this one until none is left (a fork race is bounded by the
    sandbox's process cap), reaping them; returns how many were killed."""
    killed: set[int] = set()
    me = os.getpid()
    for _ in range(rounds):
        alive = descendants(me)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= alive
        _reap()
        if not alive:
            break
        time.sleep(0.001)
    return len(killed)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run_scored(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    readable: Sequence[Path] = (),
    writable: Sequence[Path] = (),
    stdin: bytes | None = None,
    output_limit: int = 1 << 16,
) -> ScoredRun:
    """Run ``argv`` (the code under test) in its own domain; wait up to ``timeout_s``; kill everything
    it started; return its exit and the tail of its output. ``env`` is its whole environment.

    Everything below the calling process is killed when it returns (orphans are re-parented to the
    scorer and cannot be told apart): call it from one thread at a time."""
    guard_scorer()
    abi = landlock.abi_version()
    private = Path(tempfile.mkdtemp(prefix="scorer-", dir=_private_root()))
    status_r, status_w = os.pipe()
    try:
        out_path = private / "output"
        in_path = private / "stdin"
        in_path.write_bytes(stdin or b"")
        command = [sys.executable, "-I", "-S", str(_LAUNCHER)]
        if abi >= 1:
            spec = domain_spec(cwd=cwd, readable=readable, writable=writable, abi=abi)
            command += [json.dumps(spec), str(status_w), "--", *argv]
        else:  # no Landlock: only the scorer's non-dumpability protects it (isolation says so)
            command = list(argv)
            os.write(status_w, b"ok")
        with in_path.open("rb") as fin, out_path.open("wb") as fout:
            try:
                proc = subprocess.Popen(
                    command,
                    cwd=cwd,
                    env=dict(env),
                    stdin=fin,
                    stdout=fout,
                    stderr=subprocess.STDOUT,
                    pass_fds=(status_w,) if abi >= 1 else (),
                    start_new_session=True,
                )
            except OSError as exc:
                raise ScoredIsolationError(f"cannot start the scored code {argv[0]!r}: {exc}") from exc
            os.close(status_w)
            status_w = -1
            timed_out = False
            try:
                code: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out, code = True, None
            leftovers = len(descendants(os.getpid()) - {proc.pid})
            kill_descendants()
            if proc.returncode is None:
                proc.wait()
            if code is not None and code < 0:
                code = 128 - code
        with os.fdopen(status_r, "rb") as status:
            status_r = -1
            isolated = status.read() == b"ok"
        if not isolated:
            raise ScoredIsolationError(
                "the scored code could not be put in its own domain: "
                + _tail(out_path, 2000).decode(errors="replace").strip()
            )
        return ScoredRun(code, timed_out, _tail(out_path, output_limit), isolation_level(abi), leftovers)
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        _remove(private)


def _private_root() -> str | None:
    """Where the scorer keeps its own files: ``$HARNESSRL_SCORER_DIR`` (the evaluator sandbox points it
    at a folder the scored code's domain does not include), else the default temp folder."""
    return os.environ.get("HARNESSRL_SCORER_DIR") or None


def _tail(path: Path, limit: int) -> bytes:
    with path.open("rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
        return f.read(limit)


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
