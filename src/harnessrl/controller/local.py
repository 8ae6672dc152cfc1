"""The local runner: each rollout attempt is a sandboxed process tree on this machine.

Per attempt: a bubblewrap sandbox (``harnessrl.sandbox.bwrap``: its own user, PID, mount and network
namespaces, a read-only system, only the workspace and home writable — at the fixed paths of
``Launch.inside`` when the controller gives them, ``/rollout/workspace`` and ``/rollout/home`` — the
gateway reachable through ``GatewayBridge`` and nothing else), a cgroup (memory, process count,
freezer) when the machine allows, rlimits, stdout/stderr logged to files, and a deadline after which
everything in the attempt is killed. ``aclose`` kills whatever is still running, so a controller
shutdown leaves no orphans; a controller killed outright takes its sandboxes with it (the launcher
dies with its parent: ``sandbox.enter``).

**Disk is bounded three ways.** stdout and stderr reach their files through pipes the controller
reads: each log keeps ``max_log_bytes`` (10 MiB, as the Kubernetes runner keeps) of an attempt, its
beginning and its last MiB, and drops the middle, still draining the pipe so the harness never
blocks. No single file may grow past ``limits.file_mb`` (``RLIMIT_FSIZE``, set by the launcher). And
the workspace and home together may hold ``limits.disk_mb``: a watchdog sums their allocated blocks
every ``DISK_CHECK_INTERVAL_S`` or more (and once more at exit), with the files the attempt's
processes hold open after unlinking them (``sandbox.disk``), and kills the attempt past it, a
``RESOURCE_LIMIT`` outcome.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from harnessrl.controller.base import Exit, ExitKind, Launch, ResourceLimits
from harnessrl.errors import ConfigError
from harnessrl.sandbox.bwrap import Bind, python_install_paths
from harnessrl.sandbox.cgroups import ResourceGroup
from harnessrl.sandbox.disk import disk_used
from harnessrl.sandbox.enter import PARENT_ENV, read_status
from harnessrl.sandbox.host import LAUNCHER_ENV, SandboxHost, files_in_argv, shared_host

# Variables the controller copies from its own machine (``harness._INHERITED``): they describe the
# host's installs, so a harness whose root is an image starts from the image's instead.
HOST_ONLY_ENV = frozenset({"PATH", "PYTHONPATH", "VIRTUAL_ENV", "JAVA_HOME", "NODE_PATH"})

# Processes of the sandbox wrapper itself (the launcher, bwrap, init.py and its one relay thread)
# count against the pids cap.
_WRAPPER_PIDS = 16

log = logging.getLogger("harnessrl.controller")
_warned_unbounded: set[str] = set()  # the warnings of ``_warn_unbounded`` already given (once a process)


def _warn_unbounded(limits: ResourceLimits, group: ResourceGroup | None) -> None:
    """Say once, loudly, that ``max_processes`` bounds nothing here: without a ``pids`` cgroup it is
    ``RLIMIT_NPROC``, which the kernel never applies to root's processes (the sandbox user is the
    controller's root, mapped), so a fork bomb is not contained (docs/sandbox.md)."""
    if limits.max_processes is None or os.geteuid() != 0:
        return
    if group is not None and "pids" in group.controllers:
        return
    if "max_processes" not in _warned_unbounded:
        _warned_unbounded.add("max_processes")
        log.warning(
            "harness.limits.max_processes bounds nothing on this machine: no writable pids cgroup, and "
            "RLIMIT_NPROC does not apply to root (a fork bomb in a sandbox is not contained; docs/sandbox.md)"
        )


#: What each attempt's stdout.log and stderr.log keep (the Kubernetes runner's ``max_log_bytes``).
MAX_LOG_BYTES = 10 * 1024 * 1024
# The end of a log is kept too: the evaluator reads the last MiB of stdout (``controller.py``).
_LOG_TAIL_BYTES = 1 << 20
#: How often the disk watchdog sums the workspace and home (a walk in a thread, off the event loop).
DISK_CHECK_INTERVAL_S = 2.0
# How long the logs may still drain after the attempt's processes are all dead (a pipe someone
# outside the attempt's group still holds, with ``sandbox = "none"``, must not hang the controller).
_LOG_DRAIN_S = 5.0


async def _keep_log(pipe: asyncio.StreamReader, path: Path, max_bytes: int) -> None:
    """Append what ``pipe`` carries to ``path``: at most ``max_bytes`` of it, the beginning and the
    last ``_LOG_TAIL_BYTES`` (what the evaluator and the failure summary read), with a line saying
    how much was dropped between them. The pipe is drained to its end whatever is kept."""
    tail_cap = min(_LOG_TAIL_BYTES, max_bytes // 2)
    head_left = max_bytes - tail_cap
    tail: collections.deque[bytes] = collections.deque()
    tail_size = dropped = 0
    with open(path, "ab") as log:
        try:
            while data := await pipe.read(65536):
                if head_left:
                    log.write(data[:head_left])
                    log.flush()
                    data, head_left = data[head_left:], max(0, head_left - len(data))
                if data:
                    tail.append(data)
                    tail_size += len(data)
                    # Drop the oldest whole chunks while the rest still hold the last ``tail_cap`` bytes.
                    while len(tail) > 1 and tail_size - len(tail[0]) >= tail_cap:
                        tail_size -= len(tail[0])
                        dropped += len(tail.popleft())
        finally:
            kept = b"".join(tail)
            dropped += max(0, len(kept) - tail_cap)
            if dropped:
                log.write(b"\n[harnessrl: %d bytes of this log dropped here]\n" % dropped)
            log.write(kept[-tail_cap:] if tail_cap else b"")


def _host_path(launch: Launch, home: Path, path: Path) -> Path | None:
    """The host path of ``path`` as the harness sees it, when it lies in the workspace or the home
    (``launch.inside`` moves those); None for any other path in the sandbox."""
    if launch.inside is None:
        return path
    for inside, host in ((launch.inside.workspace, launch.workspace), (launch.inside.home, home)):
        if path.is_relative_to(inside):
            return host / path.relative_to(inside)
    return None


class LocalRunHandle:
    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        launch: Launch,
        group: ResourceGroup | None,
        spec: Path,
        *,
        logs: tuple[asyncio.Task[None], ...] = (),
        disk: tuple[Path, ...] = (),
    ):
        self._proc = proc
        self._launch = launch
        self._group = group
        self._spec = spec
        self._logs = logs
        self._disk = disk  # the writable folders ``limits.disk_mb`` bounds together
        self._forced: ExitKind | None = None
        self._forced_detail = ""
        self._exit: Exit | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _kill_tree(self) -> None:
        if self._group is not None:
            self._group.kill_all()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)

    async def kill(self, kind: ExitKind = ExitKind.CANCELLED, detail: str = "") -> None:
        if self._forced is None and self._proc.returncode is None:
            self._forced = kind
            self._forced_detail = detail
        # Off the event loop: freezing and killing a cgroup polls the kernel (the trainer shares the loop).
        await asyncio.to_thread(self._kill_tree)

    async def wait(self) -> Exit:
        async with self._lock:
            if self._exit is None:
                self._exit = await self._wait()
            return self._exit

    def _disk_cap(self) -> int | None:
        disk_mb = self._launch.limits.disk_mb
        return disk_mb * 1024 * 1024 if disk_mb and self._disk else None

    def _disk_used(self, cap: int) -> int:
        # The attempt's processes too: a file they hold open after unlinking it has no name to walk
        # to, and takes the disk all the same (only its group knows them: none without cgroups).
        holders = self._group.pids() if self._group is not None else ()
        return disk_used(self._disk, cap, holders=holders)

    async def _over_disk(self) -> bool:
        cap = self._disk_cap()
        return cap is not None and await asyncio.to_thread(self._disk_used, cap) > cap

    async def _watch_disk(self) -> None:
        """Kill the attempt once its workspace and home hold more than ``limits.disk_mb``."""
        pause = DISK_CHECK_INTERVAL_S
        while True:
            await asyncio.sleep(pause)
            started = time.monotonic()
            if await self._over_disk():
                await self.kill(ExitKind.RESOURCE_LIMIT, "disk limit exceeded (limits.disk_mb)")
                return
            # A workspace of many files takes a while to walk: wait ten walks between two, so the
            # watchdogs of many attempts never keep the controller's CPUs busy.
            pause = max(DISK_CHECK_INTERVAL_S, 10 * (time.monotonic() - started))

    async def _wait(self) -> Exit:
        watchdog = asyncio.create_task(self._watch_disk()) if self._disk_cap() else None
        try:
            code = await asyncio.wait_for(self._proc.wait(), self._launch.timeout_s)
        except TimeoutError:
            await self.kill(ExitKind.TIMEOUT)
            code = await self._proc.wait()
        finally:
            if watchdog is not None:
                watchdog.cancel()
        # The harness may have left background children behind: they die with the attempt.
        await asyncio.to_thread(self._kill_tree)
        if self._logs:
            _, late = await asyncio.wait(self._logs, timeout=_LOG_DRAIN_S)
            for task in late:
                task.cancel()
        # Written in the last moments before exit, between two looks of the watchdog: still too much.
        over_disk = self._forced is None and await self._over_disk()
        try:
            return self._classify(code, over_disk)
        finally:
            if self._group is not None:
                await asyncio.to_thread(self._group.destroy)

    def _classify(self, code: int, over_disk: bool = False) -> Exit:
        if self._forced is not None:
            return Exit(self._forced, code, self._forced_detail or f"killed ({self._forced.value})")
        # Only the launcher's own report makes this an infrastructure failure, never an exit status:
        # the harness chooses its exit status (125 included), it cannot write the launcher's status.
        status = read_status(str(self._spec))
        if not status.get("started"):
            return Exit(ExitKind.INFRA, code, f"the harness never started: {status.get('detail', '')}")
        if self._group is not None and self._group.oom_killed():
            return Exit(ExitKind.OOM, code, "memory limit exceeded")
        if code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL) and self._launch.limits.cpu_seconds:
            return Exit(ExitKind.RESOURCE_LIMIT, code, "CPU time limit exceeded")
        if code != 0 and self._group is not None and self._group.pids_limit_hit():
            return Exit(ExitKind.RESOURCE_LIMIT, code, "process limit reached")
        if status.get("limit") == "max_entries":  # the launcher's own count (``sandbox.enter``)
            return Exit(
                ExitKind.RESOURCE_LIMIT, code, "too many files, links and folders (limits.max_entries)"
            )
        if code == 128 + signal.SIGXFSZ and self._launch.limits.file_mb:
            return Exit(ExitKind.RESOURCE_LIMIT, code, "file size limit exceeded (limits.file_mb)")
        if over_disk:
            return Exit(ExitKind.RESOURCE_LIMIT, code, "disk limit exceeded (limits.disk_mb)")
        return Exit(ExitKind.EXITED, code, "")


class LocalRunner:
    """Runs harnesses as sandboxed subprocesses. ``bridge_path`` is the gateway's Unix bridge socket;
    ``max_log_bytes`` what each attempt's stdout.log and stderr.log keep."""

    def __init__(
        self, *, bridge_path: str | None, host: SandboxHost | None = None, max_log_bytes: int = MAX_LOG_BYTES
    ):
        self.bridge_path = bridge_path
        self.host = host or shared_host()
        self.max_log_bytes = max_log_bytes
        self._handles: set[LocalRunHandle] = set()

    async def launch(self, launch: Launch) -> LocalRunHandle:
        if launch.inside is not None and launch.sandbox != "bwrap":
            # Without the sandbox's mount namespace nothing can appear at another path.
            raise ConfigError(
                f"rollout {launch.rollout_id}: fixed in-sandbox paths need harness.sandbox = 'bwrap'"
            )
        launch.log_dir.mkdir(parents=True, exist_ok=True)
        home = launch.home or launch.workspace.parent / "home"
        cwd = _host_path(launch, home, launch.cwd)
        if cwd is not None and not cwd.is_dir():
            # bwrap's chdir failed: every attempt an infrastructure failure, "bwrap failed to set up".
            raise ConfigError(
                f"harness.workdir: {str(launch.cwd)!r} is not a folder of the workspace (the repo or "
                "harness.files must make it)"
            )
        name = f"{launch.rollout_id}-{launch.attempt}-{os.getpid()}"
        limits = launch.limits
        group = ResourceGroup.create(
            name,
            memory_mb=limits.memory_mb,
            max_processes=(limits.max_processes + _WRAPPER_PIDS) if limits.max_processes else None,
        )
        _warn_unbounded(limits, group)
        try:
            home.mkdir(parents=True, exist_ok=True)
            spec = launch.log_dir / f"sandbox-{launch.attempt}.json"
            env = launch.env
            # Bound at the host paths (as they are), or where ``launch.inside`` says the harness sees them.
            writable: tuple[Path, ...] = (launch.workspace, home)
            task_files: tuple[Path, ...] = (launch.task_file,) if launch.task_file else ()
            binds: tuple[Bind, ...] = ()
            inside_workspace = launch.workspace
            if launch.inside is not None:
                writable, task_files, inside_workspace = (), (), launch.inside.workspace
                binds = (
                    Bind(launch.workspace, launch.inside.workspace, writable=True),
                    Bind(home, launch.inside.home, writable=True),
                    *((Bind(launch.task_file, launch.inside.task_file),) if launch.task_file else ()),
                )
            if launch.root is not None:
                env = {k: v for k, v in env.items() if k not in HOST_ONLY_ENV}
            argv = self.host.launch_argv(
                spec,
                sandbox=launch.sandbox,
                command=launch.argv,
                cwd=launch.cwd,
                env=env,
                writable=writable,
                read_only=(
                    *python_install_paths(),
                    *launch.mounts,
                    *task_files,
                    *files_in_argv(launch.argv, inside=inside_workspace),
                ),
                binds=binds,
                network=launch.network,
                gateway_port=launch.gateway_port,
                gateway_socket=self.bridge_path,
                cgroup_dirs=tuple(group.dirs) if group else (),
                limits={
                    **limits.model_dump(),
                    "cgroup_memory": group is not None and "memory" in group.controllers,
                    "cgroup_pids": group is not None and "pids" in group.controllers,
                },
                root=launch.root,
                # In an image the harness finds the image's tools first; its own install is named by
                # absolute path (presets do), so harnessrl's venv stays off its PATH.
                venv_on_path=launch.root is None,
            )
        except BaseException:
            if group is not None:
                group.destroy()
            raise
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *argv,
                # Not the controller's environment (bwrap's /proc/1/environ is visible inside); the
                # controller's pid, so the launcher can tell it died before asking to die with it.
                env={**LAUNCHER_ENV, PARENT_ENV: str(os.getpid())},
                stdin=asyncio.subprocess.DEVNULL,
                # Pipes, not the log files: what reaches the files is capped (``_keep_log``).
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # one process group for the whole attempt
            )
        )
        try:
            # Shielded: if the caller is cancelled while the process is being created, the process
            # still exists; it must be killed here, or it would run on as an orphan nobody tracks.
            proc = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                orphan = await spawn
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(orphan.pid, signal.SIGKILL)
            if group is not None:
                group.destroy()
            raise
        except BaseException:
            if group is not None:
                group.destroy()
            raise
        logs = tuple(
            asyncio.create_task(_keep_log(pipe, launch.log_dir / name, self.max_log_bytes))
            for pipe, name in ((proc.stdout, "stdout.log"), (proc.stderr, "stderr.log"))
            if pipe is not None
        )
        handle = LocalRunHandle(proc, launch, group, spec, logs=logs, disk=(launch.workspace, home))
        self._handles.add(handle)
        return handle

    def forget(self, handle: LocalRunHandle) -> None:
        self._handles.discard(handle)

    async def aclose(self) -> None:
        handles = list(self._handles)
        for handle in handles:
            await handle.kill(ExitKind.CANCELLED)
        for handle in handles:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(handle.wait(), 10)
        self._handles.clear()
