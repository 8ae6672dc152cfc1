"""The local runner: each rollout attempt is a sandboxed process tree on this machine.

Per attempt: a bubblewrap sandbox (``harnessrl.sandbox.bwrap``: its own user, PID, mount and network
namespaces, a read-only system, only the workspace and home writable — at the fixed paths of
``Launch.inside`` when the controller gives them, ``/rollout/workspace`` and ``/rollout/home`` — the
gateway reachable through ``GatewayBridge`` and nothing else), a cgroup (memory, process count, freezer) when the machine
allows, rlimits, stdout/stderr logged to files, and a deadline after which everything in the
attempt is killed. ``aclose`` kills whatever is still running, so a controller shutdown leaves no
orphans; a controller killed outright takes its sandboxes with it (the launcher dies with its parent:
``sandbox.enter``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from harnessrl.controller.base import Exit, ExitKind, Launch
from harnessrl.errors import ConfigError
from harnessrl.sandbox.bwrap import Bind, python_install_paths
from harnessrl.sandbox.cgroups import ResourceGroup
from harnessrl.sandbox.enter import PARENT_ENV, read_status
from harnessrl.sandbox.host import LAUNCHER_ENV, SandboxHost, files_in_argv, shared_host

# Variables the controller copies from its own machine (``harness._INHERITED``): they describe the
# host's installs, so a harness whose root is an image starts from the image's instead.
HOST_ONLY_ENV = frozenset({"PATH", "PYTHONPATH", "VIRTUAL_ENV", "JAVA_HOME", "NODE_PATH"})

# Processes of the sandbox wrapper itself (Python + relay threads) count against the pids cap.
_WRAPPER_PIDS = 16


class LocalRunHandle:
    def __init__(
        self, proc: asyncio.subprocess.Process, launch: Launch, group: ResourceGroup | None, spec: Path
    ):
        self._proc = proc
        self._launch = launch
        self._group = group
        self._spec = spec
        self._forced: ExitKind | None = None
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

    async def kill(self, kind: ExitKind = ExitKind.CANCELLED) -> None:
        if self._forced is None and self._proc.returncode is None:
            self._forced = kind
        # Off the event loop: freezing and killing a cgroup polls the kernel (the trainer shares the loop).
        await asyncio.to_thread(self._kill_tree)

    async def wait(self) -> Exit:
        async with self._lock:
            if self._exit is None:
                self._exit = await self._wait()
            return self._exit

    async def _wait(self) -> Exit:
        try:
            code = await asyncio.wait_for(self._proc.wait(), self._launch.timeout_s)
        except TimeoutError:
            await self.kill(ExitKind.TIMEOUT)
            code = await self._proc.wait()
        # The harness may have left background children behind: they die with the attempt.
        await asyncio.to_thread(self._kill_tree)
        try:
            return self._classify(code)
        finally:
            if self._group is not None:
                await asyncio.to_thread(self._group.destroy)

    def _classify(self, code: int) -> Exit:
        if self._forced is not None:
            return Exit(self._forced, code, f"killed ({self._forced.value})")
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
        return Exit(ExitKind.EXITED, code, "")


class LocalRunner:
    """Runs harnesses as sandboxed subprocesses. ``bridge_path`` is the gateway's Unix bridge socket."""

    def __init__(self, *, bridge_path: str | None, host: SandboxHost | None = None):
        self.bridge_path = bridge_path
        self.host = host or shared_host()
        self._handles: set[LocalRunHandle] = set()

    async def launch(self, launch: Launch) -> LocalRunHandle:
        if launch.inside is not None and launch.sandbox != "bwrap":
            # Without the sandbox's mount namespace nothing can appear at another path.
            raise ConfigError(
                f"rollout {launch.rollout_id}: fixed in-sandbox paths need harness.sandbox = 'bwrap'"
            )
        launch.log_dir.mkdir(parents=True, exist_ok=True)
        name = f"{launch.rollout_id}-{launch.attempt}-{os.getpid()}"
        limits = launch.limits
        group = ResourceGroup.create(
            name,
            memory_mb=limits.memory_mb,
            max_processes=(limits.max_processes + _WRAPPER_PIDS) if limits.max_processes else None,
        )
        try:
            home = launch.home or launch.workspace.parent / "home"
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
        stdout = open(launch.log_dir / "stdout.log", "ab")  # noqa: SIM115 - handed to the child
        stderr = open(launch.log_dir / "stderr.log", "ab")  # noqa: SIM115
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *argv,
                # Not the controller's environment (bwrap's /proc/1/environ is visible inside); the
                # controller's pid, so the launcher can tell it died before asking to die with it.
                env={**LAUNCHER_ENV, PARENT_ENV: str(os.getpid())},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
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
        finally:
            stdout.close()
            stderr.close()
        handle = LocalRunHandle(proc, launch, group, spec)
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
