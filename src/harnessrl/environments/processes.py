"""Killing a command with everything it started, for the container tool's timeouts, and reaping what a
killed process left running.

``podman build`` runs each ``RUN`` step under runc, which makes the step's process a session leader
of its own: killing podman's process group leaves it running (re-parented to init, spinning
forever). ``kill_tree`` walks ``/proc`` for every descendant instead, stops them all first (so none
forks a child between the listing and the kill), kills them, and says which overlay layers they
ran on (a build's working containers, which the caller then removes).

A process killed outright (SIGKILL, the OOM killer, a SIGTERM Python does not catch) cannot do that:
its ``podman build`` or ``mmdebstrap`` runs in a session of its own and lives on, re-parented, with
its ``RUN`` steps. So every such command carries two environment variables: ``OWNER_ENV``, which
process started it (``owner()``: pid, start time, PID namespace), and ``STORE_ENV``, the image store
it works on; and the scratch folders a build makes under ``<store>/tmp`` carry the owner in their
name (``<kind>-<owner>-<random>``). ``reap_orphans`` (run by the next build of the store and by
``prune``) kills, with ``kill_tree``, every process of the store whose owner is gone, and
``stale_scratch`` lists the scratch folders of owners that are gone. Only owners of the reader's own
PID namespace are judged (another namespace's pids name other processes here). PR_SET_PDEATHSIG is
not used: it fires when the *thread* that started the child exits (``asyncio.to_thread`` workers
come and go), and it would kill only the podman client, leaving its ``RUN`` steps (sessions of their
own) with no parent that leads to them.

``communicate`` waits on a command as ``Popen.communicate`` does, but in a worker thread
(``asyncio.to_thread``) it gives up once the interpreter exits, so that Ctrl-C does not wait for a
build to finish (the caller then kills it).

One caller's builds are stopped without touching anyone else's with a ``BuildStop``: work run under
``stoppable(stop)`` (``stopping.in_thread_stoppably`` does it for a worker thread) has each of its long
commands (``is_long_command``: a build, pull, import, ``mmdebstrap``) watched by ``communicate``,
which raises ``Stopped`` once ``stop.stop()`` was called; the code that started the command then kills
it with everything it started (``kill_tree``), as after Ctrl-C. The store's wait for another
process's build lock ends the same way (``locks.build_lock``). Commands of other work, in
this process or another, go on.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

OWNER_ENV = "HARNESSRL_TOOL_OWNER"
STORE_ENV = "HARNESSRL_TOOL_STORE"
_OWNER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_SCRATCH = re.compile(r"^[a-z]+-(\d+\.\d+\.\d+)-")


def _parents() -> dict[int, int]:
    """pid -> parent pid, for every process here."""
    table: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            table[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return table


def _root_layer(pid: int) -> str:
    """The overlay layer a process runs on (``upperdir=<graphroot>/overlay/<layer>/diff`` of its
    ``/``), or ""."""
    try:
        for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[4] == "/" and "upperdir=" in line:
                match = re.search(r"upperdir=([^,\s]+)/diff", line)
                return Path(match.group(1)).name if match else ""
    except OSError:
        pass
    return ""


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        for child in children.get(current, []):
            out.append(child)
            todo.append(child)
    return out


def _signal(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _kill_pid_tree(pid: int) -> frozenset[str]:
    # Stopped first, so that nothing forks a child between the listing and the kill.
    seen = [pid, *_descendants(pid)]
    _signal(seen, signal.SIGSTOP)
    seen += [p for p in _descendants(pid) if p not in seen]
    layers = frozenset(layer for layer in map(_root_layer, seen) if layer)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _signal(seen, signal.SIGKILL)
    return layers


def kill_tree(process: subprocess.Popen[str]) -> frozenset[str]:
    """Kill ``process`` (a session leader) and every process it started, also those that left its
    session (a build's ``RUN`` step: runc makes it a session leader, so killing the process group is
    not enough). Returns the overlay layers the killed processes ran on."""
    layers = _kill_pid_tree(process.pid)
    process.wait()
    return layers


class Exiting(Exception):
    """The interpreter is exiting (its main thread has ended) while a worker thread waits on a command."""


class Stopped(Exception):
    """The work waiting on a build (or on another process's build lock) was stopped (``BuildStop``)."""


class BuildStop:
    """A handle on the builds of one piece of work (one rollout's image, one pre-flight): ``stop()``
    makes the long commands it runs under ``stoppable`` end with ``Stopped`` (each killed with all it
    started by the code that started it), now and later, and its wait for a build lock too. Thread-safe;
    nothing of other work is touched."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def stop(self) -> None:
        self._event.set()

    @property
    def stopped(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``stop()``; whether it was called."""
        return self._event.wait(timeout)


_STOP: contextvars.ContextVar[BuildStop | None] = contextvars.ContextVar("harnessrl_build_stop", default=None)


@contextlib.contextmanager
def stoppable(stop: BuildStop) -> Iterator[None]:
    """Run the block's builds under ``stop`` (a context variable: this thread, or this task)."""
    token = _STOP.set(stop)
    try:
        yield
    finally:
        _STOP.reset(token)


def current_stop() -> BuildStop | None:
    """The ``BuildStop`` the running code is under (``stoppable``), or None."""
    return _STOP.get()


#: The container-tool commands that can run for long (a build, a pull, an import; mmdebstrap): the
#: short ones (inspect, mount, rm) are left to finish, a failed build's clean-up among them.
LONG_VERBS = frozenset({"build", "pull", "import"})


def is_long_command(argv: Sequence[str]) -> bool:
    """``podman build|pull|import`` (the verb first, or second after an interpreter running a
    wrapper script) or ``mmdebstrap`` (also under ``unshare``)."""
    return any(arg in LONG_VERBS for arg in argv[1:3]) or any(Path(a).name == "mmdebstrap" for a in argv)


def _exiting(main: threading.Thread) -> bool:
    # threading._shutdown sets _SHUTTING_DOWN, then joins the threads of concurrent.futures (those
    # of asyncio.to_thread) before it marks the main thread stopped: both are looked at.
    return bool(getattr(threading, "_SHUTTING_DOWN", False)) or not main.is_alive()


def communicate(
    process: subprocess.Popen[str], timeout: float, *, stop_on_exit: bool = True
) -> tuple[str | None, str | None]:
    """``process.communicate(timeout)``, except that a wait in a worker thread (``asyncio.to_thread``)
    ends with ``Exiting`` once the main thread has ended (``stop_on_exit``; not for the clean-up that
    follows a kill): the interpreter would otherwise wait for the thread, and so for the command, up
    to ``timeout`` (a build: 30 min) after Ctrl-C. A long command (``is_long_command``) of work under
    a ``BuildStop`` (``stoppable``) ends with ``Stopped`` once that is stopped, also before it waited."""
    deadline = time.monotonic() + timeout
    main = threading.main_thread()
    args = [process.args] if isinstance(process.args, (str, bytes, os.PathLike)) else process.args
    stop = current_stop() if stop_on_exit and is_long_command([str(a) for a in args]) else None
    while True:
        if stop is not None and stop.stopped:
            raise Stopped(f"{args[0]}: stopped, the work that waited on it was stopped")
        left = deadline - time.monotonic()
        step = left if threading.current_thread() is main and stop is None else min(left, 0.5)
        try:
            return process.communicate(timeout=max(step, 0))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(process.args, timeout) from None
            if stop_on_exit and _exiting(main):
                raise Exiting(f"{process.args[0]}: stopped, the process is exiting") from None


# -- what a killed process left -------------------------------------------------------------------
def pid_namespace() -> str:
    """This process's PID namespace (its inode): a pid names a process only within one."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def started(pid: int) -> str:
    """A process's start time (clock ticks since boot, ``/proc/<pid>/stat``), "" when it is gone (or a
    zombie: dead, not yet reaped): with the pid, it names one process (a pid is reused, its start time
    is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return "" if fields[0] in ("Z", "X") else fields[19]
    except (OSError, ValueError, IndexError):
        return ""


def session(pid: int) -> int:
    """A process's session id; 0 when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return 0 if fields[0] in ("Z", "X") else int(fields[3])
    except (OSError, ValueError, IndexError):
        return 0


def owner() -> str:
    """This process, as ``<pid>.<start time>.<PID namespace>`` (``OWNER_ENV``, scratch folder names)."""
    pid = os.getpid()
    return f"{pid}.{started(pid)}.{pid_namespace()}"


def owner_gone(token: str) -> bool:
    """Whether the process ``owner()`` named by ``token`` is gone. One of another PID namespace (or a
    token that is not one) is never judged gone: its pid may name a live process here."""
    match = _OWNER.match(token)
    if match is None or match.group(3) != pid_namespace():
        return False
    return started(int(match.group(1))) != match.group(2)


def tool_env(store: Path) -> dict[str, str]:
    """The variables that mark a command this process starts on ``store`` (``reap_orphans``)."""
    return {OWNER_ENV: owner(), STORE_ENV: str(store)}


def marks(pid: int) -> dict[str, str]:
    """The harnessrl marks (``OWNER_ENV``, ``STORE_ENV``) in a process's environment; none when it is
    gone or not ours to read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    found = {}
    for item in raw.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key in (OWNER_ENV.encode(), STORE_ENV.encode()):
            found[key.decode()] = value.decode(errors="replace")
    return found


def reap_orphans(store: Path) -> frozenset[str]:
    """Kill every command on ``store`` whose owner is gone, with all it started (``kill_tree``).
    Returns the overlay layers the killed processes ran on (working containers to remove)."""
    layers: frozenset[str] = frozenset()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        found = marks(int(entry))
        if found.get(STORE_ENV) != str(store) or not owner_gone(found.get(OWNER_ENV, "")):
            continue
        # Each command harnessrl starts leads a session of its own; a process that only inherited the
        # marks (a child of one) goes with its command's tree.
        if session(int(entry)) != int(entry):
            continue
        layers |= _kill_pid_tree(int(entry))
    return layers


def stale_scratch(folder: Path) -> list[Path]:
    """The scratch folders under ``folder`` (``<kind>-<owner>-<random>``) whose owner is gone."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    out = []
    for entry in entries:
        match = _SCRATCH.match(entry.name)
        if match and owner_gone(match.group(1)):
            out.append(entry)
    return out


def _mount_points() -> set[str]:
    points = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4:
                points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def remove_scratch(path: Path) -> None:
    """Remove a scratch folder without entering a mount point in it (a build may have left one: what
    is mounted there is not the scratch's to delete); what cannot be removed is left."""
    mounts = _mount_points()

    def remove(folder: str) -> None:
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        if entry.path not in mounts:
                            remove(entry.path)
                            os.rmdir(entry.path)
                    else:
                        os.unlink(entry.path)

    if str(path) in mounts:
        return
    remove(str(path))
    with contextlib.suppress(OSError):
        os.rmdir(path)
