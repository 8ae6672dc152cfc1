"""The ``command`` evaluator: a program (the *scorer*) run over a copy of the workspace scores the rollout.

The reward is the scorer's exit code (0 -> 1.0), its last stdout line as a float, or its last stdout
line as JSON ``{"reward": x, "flags": [...], ...}`` (``reward_from``). A scorer usually runs the
agent's code (its tests, its functions), and that code is as hostile as the agent, so by default the
scorer runs in a fresh bubblewrap sandbox of its own where it sees only what scoring needs:

- **a copy of the workspace** (``sandbox.copy``: special files skipped, sparse files kept sparse,
  hard links linked, capped in size and count, links out of it and Python bytecode dropped), at the
  workspace's own path;
- **its inputs, copied**: a path a ``{task[F]}`` placeholder renders to, and an absolute path named
  in the command, is copied into ``/run/harnessrl/inputs/`` and the command names the copy. Nothing
  else of the task's is there: not the original repository, not the task folder, not a gold patch
  beside the hidden tests. ``evaluator.mounts`` are bound read-only (for large, shared, non-secret
  things: a dataset, a tool); Python and harnessrl itself read-only, as for harnesses;
- **a task file without the solution** (``$HARNESSRL_TASK_FILE`` = ``/run/harnessrl/task.json``): the
  task minus ``hidden``'s ``withheld_fields`` (the gold patch, the repository's path...). The task is
  not in the environment: every child would inherit it;
- a private folder for the scorer (``$HARNESSRL_SCORER_DIR``, also its ``HOME``), a sized ``/tmp``,
  no network, a scrubbed environment, and a cgroup with the evaluator's ``limits``.

**Disk is bounded twice**, as for harnesses (``controller.local``): no process may write a file
past ``limits.file_mb`` (``RLIMIT_FSIZE``, set by the launcher; the scorer's stdout and stderr are
files too), and the evaluation's folders on the host (the workspace copy, the scorer's folder, its
output) may grow by ``limits.disk_mb`` at most: a watchdog sums their blocks (each file or folder at
least ``sandbox.disk.ENTRY_BYTES``, so a million empty files count too) every ``DISK_CHECK_INTERVAL_S`` or more
and once more after the scorer exited, and kills the scorer past it. Either is the policy's outcome
(reward 0 with ``disk_limit_exceeded``, or ``file_size_limit_exceeded`` for a scorer killed by
``SIGXFSZ``), never an infrastructure failure. A watchdog over the host folders, not a sized tmpfs
for the copy: a tmpfs would hold the whole copy (up to ``max_workspace_mb``) in the scorer's memory.

A scorer that runs the agent's code should do so through ``harnessrl.sandbox.scored.run_scored``
(the coding tasks' and ``harnessrl.tasks.pytest_scoring``'s scorers do): that code then cannot read
the inputs or the task file, reach the scorer's memory, descriptors or stdout, or signal it.

**The verdict is the scorer's only after everything else is dead.** When the scorer's process exits,
the sandbox's first process kills every other process in it, and the controller kills the cgroup,
before the output is read. A reward outside ``reward_range`` is refused (reward 0, flag
``reward_out_of_range``).

**Only the controller decides what is an infrastructure failure** (an ``EvaluatorError``, retried):
the scorer's sandbox did not start, its program (one outside the workspace) could not be started, or
the command named a task field the task lacks. Everything after the scorer started is the policy's
outcome: a scorer that exits non-zero (``json`` and ``stdout_float``), prints no verdict (or one
nested past ``verdict.MAX_VERDICT_DEPTH``, or a number past the float range), is killed, or runs past
``timeout_s`` gives reward 0 with a flag (``scorer_failed``, ``reward_out_of_range``,
``scorer_timeout``) — the agent's code can do all of that to it, and a 0 it could turn into "not
counted" would be a way out of every failing group. So can the agent delete or ``chmod -x`` a scorer
program that lives in the workspace (``{workspace}/run_tests.sh``, ``./run_tests.sh``): when the
launcher reports that such a program could not be started (the sandbox came up; the exec did not),
the reward is 0 with ``scorer_missing``. Which program is the workspace's is decided from the path
before the launch, never from the launcher's message. A workspace over the copy's caps
gives reward 0 with ``workspace_too_large``; special files left out are flagged
``special_files_skipped`` (informational).

Here are the sandbox, the workspace copy and the scorer's run. What the sandbox holds besides the
copy (the staged inputs, the rendered placeholders, the task file, the environment) is built by
``evaluators.staging``; the run's verdict, and each flag but the copy's, is read by
``evaluators.verdict``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import harnessrl
from harnessrl.controller.evaluators.config import CommandEvaluatorConfig
from harnessrl.controller.evaluators.staging import (
    SCORER_DIR_INSIDE,
    TASK_INSIDE,
    InputStage,
    fill_placeholders,
    scorer_view,
    scrubbed_env,
)
from harnessrl.controller.evaluators.types import EvaluationInput, EvaluationResult, EvaluatorError
from harnessrl.controller.evaluators.verdict import ScorerRun, scorer_verdict
from harnessrl.errors import ConfigError
from harnessrl.sandbox.bwrap import Bind, python_install_paths
from harnessrl.sandbox.cgroups import ResourceGroup
from harnessrl.sandbox.copy import copy_untrusted_tree
from harnessrl.sandbox.disk import disk_used, remove_tree
from harnessrl.sandbox.enter import CANNOT_START, PARENT_ENV, read_status
from harnessrl.sandbox.host import LAUNCHER_ENV, SandboxHost, shared_host

_OUTPUT_LIMIT = 1 << 20  # bytes of stdout/stderr kept (the tail): a chatty test suite can't exhaust memory
_WRAPPER_PIDS = 8  # the launcher, bwrap and the sandbox's init count against the process cap
#: How often the disk watchdog sums the evaluation's folders (a walk in a thread, off the event loop).
DISK_CHECK_INTERVAL_S = 2.0

HARNESSRL_PACKAGE = Path(harnessrl.__file__).parent

# Flags a command evaluator records with the rollout.
WORKSPACE_TOO_LARGE = "workspace_too_large"  # over max_workspace_mb / max_workspace_files: not scored
SPECIAL_FILES_SKIPPED = "special_files_skipped"  # FIFOs, sockets or devices left out of the copy


@dataclass(frozen=True)
class EvaluatorSandbox:
    """How command evaluators are isolated: ``mode`` ``"bwrap"`` (default) or ``"none"`` (the scorer
    runs on the host, in the agent's own workspace, with the task's own paths: debugging only)."""

    mode: str = "bwrap"
    mounts: tuple[Path, ...] = ()  # more read-only paths (bound at the same path)
    host: SandboxHost = field(default_factory=shared_host)

    def shared(self) -> tuple[Path, ...]:
        """What every scorer may read where it is: Python, harnessrl (evaluator code) and the mounts."""
        return (*python_install_paths(), HARNESSRL_PACKAGE, *self.mounts)


def _in_workspace(program: str, workspace: Path) -> bool:
    """Whether ``program`` (a command's first word, run from ``workspace``) names a file in the
    workspace: a path under it, or a relative path with a slash (``./run_tests.sh``). A bare name is
    looked up on ``PATH``, the scorer's tools: never the workspace's."""
    if "/" not in program:
        return False
    root = os.path.normpath(workspace)
    path = os.path.normpath(os.path.join(root, program))  # an absolute ``program`` stays itself
    return path != root and Path(path).is_relative_to(root)


def _runs_programs(folder: Path) -> bool:
    """Whether files in ``folder`` may be executed (False on a ``noexec`` mount, such as a hardened
    ``/tmp``: then no workspace program could start, whatever the policy did)."""
    try:
        return not os.statvfs(folder).f_flag & os.ST_NOEXEC
    except OSError:
        return False


# Harness placeholders an evaluator has no value for; used only to give a clear config error.
_HARNESS_ONLY = re.compile(r"\{(base_url|anthropic_base_url|api_key|model|attempt)\}")


class CommandEvaluator:
    def __init__(self, config: CommandEvaluatorConfig, *, sandbox: EvaluatorSandbox | None = None):
        self.config = config
        # The sandbox's mode comes from the caller (the harness's); the paths to mount from this config.
        base = sandbox or EvaluatorSandbox()
        self.sandbox = replace(base, mounts=(*base.mounts, *(Path(m) for m in config.mounts)))

    def validate(self) -> None:
        for i, arg in enumerate([*self.config.command, *self.config.env.values()]):
            where = f"evaluator.command[{i}]" if i < len(self.config.command) else "evaluator.env"
            bad = _HARNESS_ONLY.search(arg)
            if bad:
                raise ConfigError(
                    f"{where}: {bad.group(0)} is not available to evaluators "
                    "(use {workspace}, {task_file}, {rollout_id}, {prompt}, {task[FIELD]}, {task[hidden.FIELD]})"
                )
        exe = self.config.command[0]
        if "{" in exe or ("/" in exe and not os.path.isabs(exe)):
            return  # rendered per rollout, or relative to the workspace: checked when it runs
        if shutil.which(exe) is None:
            raise ConfigError(f"evaluator.command[0]: executable {exe!r} not found on PATH")

    async def evaluate(self, inp: EvaluationInput) -> EvaluationResult:
        # 0700: the sandbox never sees it. Removed by ``remove_tree``, not ``TemporaryDirectory``: its
        # ``rmtree`` recurses (Python 3.11), and a workspace copy nested 3,000 folders deep raised
        # ``RecursionError`` here: "evaluator crashed", an infrastructure failure for the policy's 0.
        scratch = Path(tempfile.mkdtemp(prefix="harnessrl-eval-"))
        try:
            return await self._evaluate_in(inp, scratch)
        finally:
            await asyncio.to_thread(remove_tree, scratch)

    async def _evaluate_in(self, inp: EvaluationInput, scratch: Path) -> EvaluationResult:
        if self.sandbox.mode == "none":
            return await self._evaluate_unsandboxed(inp, scratch)
        copy = await asyncio.to_thread(
            copy_untrusted_tree,
            inp.workspace,
            scratch / "workspace",
            max_bytes=self.config.max_workspace_mb * 1024 * 1024,
            max_files=self.config.max_workspace_files,
            drop_bytecode=True,  # Python recompiles from the source the audit read
        )
        copied = {
            "bytes": copy.bytes,
            "files": copy.files,
            "skipped": copy.skipped[:20],
            "dropped_links": copy.dropped_links[:20],
            "dropped_bytecode": copy.dropped_bytecode,
            "unreadable": copy.unreadable[:20],  # entries the policy made that could not be copied
        }
        flags = (SPECIAL_FILES_SKIPPED,) if copy.skipped else ()
        if copy.over_limit:
            return EvaluationResult(
                self.config.failure_reward,
                {"workspace_copy": {**copied, "over_limit": copy.over_limit}},
                (WORKSPACE_TOO_LARGE, *flags),
            )
        stage = InputStage(scratch, self.sandbox.shared(), inp.workspace)
        values = {
            "workspace": str(inp.workspace),  # the copy is bound at the workspace's own path
            "task_file": str(TASK_INSIDE),
            "rollout_id": inp.rollout_id,
            "prompt": inp.task.get("prompt"),
            "task": inp.task,
        }
        command = [fill_placeholders(a, values, stage) for a in self.config.command]
        env = scrubbed_env(SCORER_DIR_INSIDE)
        env.update(self._task_env(inp, str(TASK_INSIDE)), HARNESSRL_SCORER_DIR=str(SCORER_DIR_INSIDE))
        env.update({k: fill_placeholders(v, values, stage) for k, v in self.config.env.items()})
        task_file = scratch / "task.json"
        task_file.write_text(json.dumps(stage.rewrite(scorer_view(inp.task, self.config.withheld_fields))))
        (scratch / "scorer").mkdir(mode=0o700)
        binds = (
            Bind(scratch / "workspace", inp.workspace, writable=True),
            Bind(scratch / "scorer", SCORER_DIR_INSIDE, writable=True),
            Bind(task_file, TASK_INSIDE),
            *stage.binds(),
        )
        if inp.environment is not None:  # the image's tools after harnessrl's venv
            env["PATH"] = inp.environment.search_path()
        run = await self._run(command, inp, scratch, env=env, cwd=inp.workspace, binds=binds, disk=(scratch,))
        result = scorer_verdict(run, self.config)
        return replace(
            result,
            details={**result.details, "workspace_copy": copied},
            flags=(*result.flags, *flags),
        )

    def _task_env(self, inp: EvaluationInput, task_file: str) -> dict[str, str]:
        return {
            "HARNESSRL_WORKSPACE": str(inp.workspace),
            "HARNESSRL_TASK_FILE": task_file,
            "HARNESSRL_ROLLOUT_ID": inp.rollout_id,
        }

    async def _evaluate_unsandboxed(self, inp: EvaluationInput, scratch: Path) -> EvaluationResult:
        """``sandbox = "none"``: the scorer runs on the host in the agent's workspace (no copy, no
        staging, the full task): what the red-team controls compare against. Never train with it."""
        task_file = scratch / "task.json"
        task_file.write_text(json.dumps(inp.task))
        values = {
            "workspace": str(inp.workspace),
            "task_file": str(task_file),
            "rollout_id": inp.rollout_id,
            "prompt": inp.task.get("prompt"),
            "task": inp.task,
        }
        command = [fill_placeholders(a, values) for a in self.config.command]
        (scratch / "scorer").mkdir()
        env = scrubbed_env(scratch / "scorer")
        env.update(self._task_env(inp, str(task_file)), HARNESSRL_SCORER_DIR=str(scratch / "scorer"))
        env.update({k: fill_placeholders(v, values) for k, v in self.config.env.items()})
        run = await self._run(
            command, inp, scratch, env=env, cwd=inp.workspace, binds=(), disk=(scratch, inp.workspace)
        )
        return scorer_verdict(run, self.config)

    async def _run(
        self,
        command: list[str],
        inp: EvaluationInput,
        scratch: Path,
        *,
        env: dict[str, str],
        cwd: Path,
        binds: tuple[Bind, ...],
        disk: tuple[Path, ...],
    ) -> ScorerRun:
        """Run the scorer in its sandbox and cgroup; kill everything left once it exits, times out or
        makes ``disk`` (the folders it may write on the host) grow past ``limits.disk_mb``;
        ``EvaluatorError`` only if the launcher says it never started, unless what could not start
        was a program in the workspace (``ScorerRun.missing``: the policy's outcome)."""
        limits = self.config.limits
        disk_cap = None
        if limits.disk_mb:  # what the evaluation starts with (the copy, its inputs) plus disk_mb
            disk_cap = await asyncio.to_thread(disk_used, disk) + limits.disk_mb * 1024 * 1024
        group = ResourceGroup.create(
            f"eval-{inp.rollout_id or 'x'}-{os.getpid()}-{scratch.name}",
            memory_mb=limits.memory_mb,
            max_processes=limits.max_processes + _WRAPPER_PIDS if limits.max_processes else None,
        )
        spec = scratch / "sandbox.json"
        out_path, err_path = scratch / "stdout", scratch / "stderr"
        try:
            argv = self.sandbox.host.launch_argv(
                spec,
                sandbox=self.sandbox.mode,
                command=command,
                cwd=cwd,
                env=env,
                read_only=self.sandbox.shared(),
                binds=binds,
                network="none",
                cgroup_dirs=tuple(group.dirs) if group else (),
                limits={
                    "cpu_seconds": limits.cpu_seconds,
                    "memory_mb": limits.memory_mb,
                    "max_processes": limits.max_processes,
                    "file_mb": limits.file_mb,
                    "cgroup_memory": group is not None and "memory" in group.controllers,
                    "cgroup_pids": group is not None and "pids" in group.controllers,
                },
                tmp_size_mb=limits.tmp_mb,
                root=inp.environment if self.sandbox.mode == "bwrap" else None,
            )
            started = time.monotonic()
            with out_path.open("wb") as out_fh, err_path.open("wb") as err_fh:
                try:
                    proc = await asyncio.create_subprocess_exec(
                        *argv,
                        env={**LAUNCHER_ENV, PARENT_ENV: str(os.getpid())},  # dies with us
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=out_fh,
                        stderr=err_fh,
                        start_new_session=True,
                    )
                except OSError as exc:
                    raise EvaluatorError(f"cannot start the evaluator's sandbox: {exc}") from exc
                over_disk = asyncio.Event()
                watchdog = (
                    asyncio.create_task(_watch_disk(disk, disk_cap, proc.pid, group, over_disk))
                    if disk_cap is not None
                    else None
                )
                code: int | None
                try:
                    code = await asyncio.wait_for(proc.wait(), self.config.timeout_s)
                except TimeoutError:
                    code = None
                finally:
                    if watchdog is not None:
                        watchdog.cancel()
                    # Everything the scorer left (and, on a timeout, the scorer) dies before its
                    # output is read: nothing can append to it afterwards.
                    await asyncio.to_thread(_kill, proc.pid, group)
                    if proc.returncode is None:
                        await proc.wait()
            oom = group is not None and group.oom_killed()
            # Written in the last moments, between two looks of the watchdog: too much all the same.
            too_much = over_disk.is_set() or (
                disk_cap is not None and await asyncio.to_thread(disk_used, disk, disk_cap) > disk_cap
            )
        finally:
            if group is not None:
                await asyncio.to_thread(group.destroy)
        status = read_status(str(spec))
        seconds = round(time.monotonic() - started, 3)
        if not status.get("started"):
            detail = str(status.get("detail") or _tail(err_path)[-500:])
            # The launcher exits CANNOT_START only once the sandbox is up and the command's exec is
            # all that failed (SETUP_FAILED otherwise). A program in the workspace is the policy's to
            # delete or chmod -x (the copy keeps its modes), so that is its outcome, not ours; a
            # program outside it (a tool, a scorer input) that cannot start is a broken setup.
            host_workspace = cwd if self.sandbox.mode == "none" else scratch / "workspace"
            if code == CANNOT_START and _in_workspace(command[0], cwd) and _runs_programs(host_workspace):
                return ScorerRun(None, "", _tail(err_path), seconds, missing=detail)
            raise EvaluatorError(f"the scorer did not start: {detail}")
        run = ScorerRun(code, _tail(out_path), _tail(err_path), seconds, oom)
        if too_much:
            run.disk_limit = f"its folders grew by more than limits.disk_mb = {limits.disk_mb} MiB"
        return run


async def _watch_disk(
    folders: tuple[Path, ...], cap: int, pid: int, group: ResourceGroup | None, over: asyncio.Event
) -> None:
    """Kill the scorer's sandbox (and set ``over``) once ``folders`` hold more than ``cap`` bytes."""
    pause = DISK_CHECK_INTERVAL_S
    while True:
        await asyncio.sleep(pause)
        began = time.monotonic()
        if await asyncio.to_thread(_disk_used, folders, cap, group) > cap:
            over.set()
            await asyncio.to_thread(_kill, pid, group)
            return
        # A big workspace copy takes a while to walk: wait ten walks between two, so the watchdogs
        # of many evaluations never keep the controller's CPUs busy.
        pause = max(DISK_CHECK_INTERVAL_S, 10 * (time.monotonic() - began))


def _disk_used(folders: tuple[Path, ...], cap: int, group: ResourceGroup | None) -> int:
    """``disk_used`` with the scorer's processes: a file they hold open after unlinking it has no
    name to walk to and takes the disk all the same (only its group knows them: none without cgroups)."""
    return disk_used(folders, cap, holders=group.pids() if group is not None else ())


def _kill(pid: int, group: ResourceGroup | None) -> None:
    if group is not None:
        group.kill_all()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _tail(path: Path) -> str:
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - _OUTPUT_LIMIT))
        return fh.read().decode(errors="replace")
