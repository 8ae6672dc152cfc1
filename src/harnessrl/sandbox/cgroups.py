"""Per-rollout resource groups on Linux cgroups (v2 unified, or v1 ``memory`` + ``pids``).

Why cgroups and not only rlimits: harnesses run as root on our machines, and the kernel does not
enforce ``RLIMIT_NPROC`` for root, so a fork bomb is only contained by a ``pids`` cgroup. A memory
cgroup also lets us tell an OOM kill (``ExitKind.OOM``) from an ordinary crash, and killing every
process in the group catches children that escaped the process group with ``setsid``.

When no cgroup hierarchy is writable, ``ResourceGroup.create`` returns ``None`` and the sandbox
falls back to rlimits (see ``enter.py``); the docs say what that loses.

**A group outlives no owner.** A process killed with ``SIGKILL`` never runs ``destroy``, and its
groups stay (empty once the sandbox's processes died with it). So each group's folder is named
``NAME@NS.PID.START`` after the process that made it (its PID namespace, pid and start time), and
``create`` first removes the empty groups of owners of its own PID namespace that are gone, and
other empty groups once they are an hour old (an owner in another namespace, or an older harnessrl
that tagged nothing: a group is joined as soon as it is made). A group that still holds a process
is never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Age past which an empty group whose owner cannot be seen is abandoned (groups are joined at once).
UNTAGGED_GRACE_S = 3600


def _start_time(pid: int | str) -> str | None:
    """The start time of process ``pid`` (field 22 of ``/proc/PID/stat``), None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # comm may hold spaces and parentheses
    return fields[19].decode() if len(fields) > 19 else None


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]") or "0"
    except OSError:
        return "0"


def _owner_tag() -> str:
    """``NS.PID.START``: this process's PID namespace, pid and start time."""
    return f"{_pid_namespace()}.{os.getpid()}.{_start_time(os.getpid())}"


def _abandoned(group: Path) -> bool:
    """Whether ``group`` (a folder under a ``harnessrl`` parent) belongs to no living process: its
    owner, in this PID namespace, is gone; or (an owner this process cannot see: another namespace,
    an older harnessrl that tagged nothing) it has been there an hour (groups are joined at once)."""
    tag = group.name.rpartition("@")[2] if "@" in group.name else ""
    ns, pid, start = ([*tag.split("."), "", "", ""])[:3]
    if ns == _pid_namespace() and pid.isdigit() and start:
        return _start_time(pid) != start
    with contextlib.suppress(OSError):
        return time.time() - group.stat().st_mtime > UNTAGGED_GRACE_S
    return False


def sweep_abandoned(parent: Path) -> list[Path]:
    """Remove the empty groups under ``parent`` whose owner is gone; returns them."""
    removed = []
    try:
        groups = [p for p in parent.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return removed
    for group in groups:
        try:
            if not _abandoned(group) or (group / "cgroup.procs").read_text().strip():
                continue  # its owner lives, or processes are still in it: not ours to end
            group.rmdir()
        except OSError:
            continue
        removed.append(group)
    return removed


def _own_v1_path(controller: str) -> str:
    """This process's path inside a v1 controller hierarchy (from /proc/self/cgroup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.lstrip("/")
    return ""


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


@dataclass
class ResourceGroup:
    """One rollout's cgroup(s). ``dirs`` are the folders whose ``cgroup.procs`` a process joins."""

    dirs: list[Path]
    version: int
    controllers: frozenset[str]  # what the kernel does for us: {"memory", "pids", "freezer"}

    @classmethod
    def create(cls, name: str, *, memory_mb: int | None, max_processes: int | None) -> ResourceGroup | None:
        """Create the group with the given caps; ``None`` if this machine has no writable cgroups. Its
        folders are named ``name`` tagged with this process (``NAME@NS.PID.START``)."""
        name = f"{name}@{_owner_tag()}"
        unified = CGROUP_ROOT / "unified" if (CGROUP_ROOT / "unified").is_dir() else CGROUP_ROOT
        # cgroup v2 is usable only if the controllers we need are enabled; on hybrid hosts they live in v1.
        controllers_file = unified / "cgroup.controllers"
        if controllers_file.is_file() and {"memory", "pids"} <= set(controllers_file.read_text().split()):
            group = unified / "harnessrl" / name
            sweep_abandoned(group.parent)
            try:
                group.mkdir(parents=True, exist_ok=True)
                (unified / "harnessrl" / "cgroup.subtree_control").write_text("+memory +pids")
                if memory_mb:
                    (group / "memory.max").write_text(str(memory_mb * 1024 * 1024))
                    (group / "memory.swap.max").write_text("0")
                if max_processes:
                    (group / "pids.max").write_text(str(max_processes))
                return cls([group], 2, frozenset({"memory", "pids"}))
            except OSError:
                pass
        dirs, controllers = [], set()
        for controller, limit_file, value in (
            ("memory", "memory.limit_in_bytes", memory_mb * 1024 * 1024 if memory_mb else None),
            ("pids", "pids.max", max_processes),
            ("freezer", None, None),  # no limit: it lets kill_all stop the whole tree before killing it
        ):
            base = CGROUP_ROOT / controller / _own_v1_path(controller)
            if not _writable_dir(base):
                continue
            group = base / "harnessrl" / name
            sweep_abandoned(group.parent)
            try:
                group.mkdir(parents=True, exist_ok=True)
                if limit_file is not None and value is not None:
                    (group / limit_file).write_text(str(value))
                if controller == "memory":
                    with contextlib.suppress(OSError):  # no swap accounting on some kernels
                        (group / "memory.memsw.limit_in_bytes").write_text(str(value))
            except OSError:
                continue
            dirs.append(group)
            controllers.add(controller)
        return cls(dirs, 1, frozenset(controllers)) if dirs else None

    def join(self, pid: int | None = None) -> None:
        """Move ``pid`` (default: this process) into the group; its future children inherit it."""
        for group in self.dirs:
            (group / "cgroup.procs").write_text(str(pid or os.getpid()))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for group in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (group / "cgroup.procs").read_text().split())
        return found

    def kill_all(self, rounds: int = 20) -> None:
        """SIGKILL every process in the group: with ``cgroup.kill`` (v2) or frozen first (v1 freezer),
        so nothing can fork while it is being killed; else repeatedly while new processes appear."""
        for group in self.dirs:
            with contextlib.suppress(OSError):
                if (group / "cgroup.kill").exists():
                    (group / "cgroup.kill").write_text("1")
        freezer = next((d for d in self.dirs if (d / "freezer.state").exists()), None)
        if freezer is not None and self.pids():
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("FROZEN")
                for _ in range(100):  # freezing is asynchronous; a tree is frozen within milliseconds
                    if (freezer / "freezer.state").read_text().strip() == "FROZEN":
                        break
                    time.sleep(0.005)
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):  # the queued SIGKILLs take effect when it thaws
                (freezer / "freezer.state").write_text("THAWED")
        for _ in range(rounds):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def oom_killed(self) -> bool:
        for group in self.dirs:
            for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
                with contextlib.suppress(OSError):
                    for line in (group / name).read_text().splitlines():
                        parts = line.split()
                        if len(parts) == 2 and parts[0] == key and int(parts[1]) > 0:
                            return True
        return False

    def pids_limit_hit(self) -> bool:
        for group in self.dirs:
            with contextlib.suppress(OSError):
                for line in (group / "pids.events").read_text().splitlines():
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == "max" and int(parts[1]) > 0:
                        return True
        return False

    def destroy(self) -> None:
        self.kill_all()
        for group in self.dirs:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # processes still exiting
                    time.sleep(0.02)
