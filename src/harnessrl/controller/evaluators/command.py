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
nested past ``_MAX_VERDICT_DEPTH``, or a number past the float range), is killed, or runs past
``timeout_s`` gives reward 0 with a flag (``scorer_failed``, ``reward_out_of_range``,
``scorer_timeout``) — the agent's code can do all of that to it, and a 0 it could turn into "not
counted" would be a way out of every failing group. So can the agent delete or ``chmod -x`` a scorer
program that lives in the workspace (``{workspace}/run_tests.sh``, ``./run_tests.sh``): when the
launcher reports that such a program could not be started (the sandbox came up; the exec did not),
the reward is 0 with ``scorer_missing``. Which program is the workspace's is decided from the path
before the launch, never from the launcher's message. A workspace over the copy's caps
gives reward 0 with ``workspace_too_large``; special files left out are flagged
``special_files_skipped`` (informational).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import harnessrl
from harnessrl.controller.evaluators.config import CommandEvaluatorConfig
from harnessrl.controller.evaluators.types import (
    EvaluationInput,
    EvaluationResult,
    EvaluatorError,
    scorer_flags,
)
from harnessrl.errors import ConfigError
from harnessrl.sandbox.bwrap import DEFAULT_PATH, SYSTEM_DIRS, Bind, python_install_paths
from harnessrl.sandbox.cgroups import ResourceGroup
from harnessrl.sandbox.copy import copy_untrusted_tree
from harnessrl.sandbox.enter import CANNOT_START, PARENT_ENV, read_status
from harnessrl.sandbox.host import LAUNCHER_ENV, SandboxHost, shared_host
from harnessrl.tasks.fields import HIDDEN, get_field

_PLACEHOLDER = re.compile(r"\{(workspace|task_file|rollout_id|prompt|task\[([^\]\}]+)\])\}")
# Passed through from the controller's environment; everything else (the admin key, PYTHONPATH,
# HOME, VIRTUAL_ENV: places the agent might have planted a sitecustomize.py) is dropped.
_INHERITED_ENV = ("LANG", "LC_ALL", "TZ")
_OUTPUT_LIMIT = 1 << 20  # bytes of stdout/stderr kept (the tail): a chatty test suite can't exhaust memory
# A JSON verdict nested deeper than this is no verdict: it is stored with the rollout (details), and
# whoever serialises it later (the store, the dashboard) would hit Python's recursion limit.
_MAX_VERDICT_DEPTH = 32
_WRAPPER_PIDS = 8  # the launcher, bwrap and the sandbox's init count against the process cap

HARNESSRL_PACKAGE = Path(harnessrl.__file__).parent

# Where the scorer's own things are inside its sandbox (never shown to the code it runs through
# ``run_scored``, whose domain does not include /run).
INSIDE = Path("/run/harnessrl")
INPUTS_INSIDE = INSIDE / "inputs"
TASK_INSIDE = INSIDE / "task.json"
SCORER_DIR_INSIDE = INSIDE / "scorer"

# Flags a command evaluator records with the rollout.
SCORER_FAILED = "scorer_failed"  # the scorer ran but gave no valid verdict (exit status, output, killed)
SCORER_TIMEOUT = "scorer_timeout"  # the scorer ran past timeout_s
SCORER_MISSING = "scorer_missing"  # its program, in the workspace, was gone or not executable
REWARD_OUT_OF_RANGE = "reward_out_of_range"  # a verdict outside reward_range
WORKSPACE_TOO_LARGE = "workspace_too_large"  # over max_workspace_mb / max_workspace_files: not scored
SPECIAL_FILES_SKIPPED = "special_files_skipped"  # FIFOs, sockets or devices left out of the copy


def scrubbed_env(home: Path) -> dict[str, str]:
    """The environment an evaluator command starts from: a standard PATH (harnessrl's venv first,
    added by the sandbox), a fresh ``HOME``, the locale; nothing else of the controller's."""
    env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
    env.update(PATH=DEFAULT_PATH, HOME=str(home), TMPDIR="/tmp", PYTHONNOUSERSITE="1")
    return env


def scorer_view(task: dict[str, Any], withheld: list[str]) -> dict[str, Any]:
    """The task as a scorer sees it: ``hidden`` without the ``withheld`` fields (the solution)."""
    hidden = task.get(HIDDEN)
    if not isinstance(hidden, dict):
        return dict(task)
    return {**task, HIDDEN: {k: v for k, v in hidden.items() if k not in withheld}}


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


_MAX_INPUT_BYTES = 1 << 30  # a scorer input bigger than this belongs in evaluator.mounts


class _Stage:
    """The scorer's inputs: each host path named by the command, copied once into ``scratch``.
    Not copied: the workspace (the scorer gets its own copy of it) and what holds it (the run
    folder), and what every scorer may read in place (``EvaluatorSandbox.shared``)."""

    def __init__(self, scratch: Path, shared: tuple[Path, ...], workspace: Path):
        self.folder = scratch / "inputs"
        self.shared = shared
        self.workspace = workspace
        self.inside: dict[str, str] = {}  # host path -> its copy's path inside the sandbox

    def path(self, value: str) -> str:
        """``value`` itself, or the inside path of its copy when it names a host file or folder."""
        if value in self.inside:
            return self.inside[value]
        if not _names_a_host_path(value):
            return value
        source = Path(os.path.normpath(value))
        if (
            self._is_shared(source)
            or source.is_relative_to(self.workspace)
            or self.workspace.is_relative_to(source)
        ):
            return value
        if _size(source) > _MAX_INPUT_BYTES:
            raise EvaluatorError(
                f"evaluator input {value!r} is over {_MAX_INPUT_BYTES >> 20} MB to copy for each rollout: "
                "bind it read-only with evaluator.mounts instead"
            )
        index = len(self.inside)
        host_copy = self.folder / str(index) / (source.name or "root")
        host_copy.parent.mkdir(parents=True)
        if source.is_dir():
            shutil.copytree(source, host_copy, symlinks=True)
        else:
            shutil.copyfile(source, host_copy)
            shutil.copymode(source, host_copy)
        self.inside[value] = str(INPUTS_INSIDE / str(index) / host_copy.name)
        return self.inside[value]

    def _is_shared(self, path: Path) -> bool:
        roots = [Path(d) for d in SYSTEM_DIRS] + list(self.shared)
        return any(path == r or path.is_relative_to(r) for r in roots)

    def binds(self) -> tuple[Bind, ...]:
        return (Bind(self.folder, INPUTS_INSIDE),) if self.inside else ()

    def rewrite(self, value: Any) -> Any:
        """``value`` (a task) with every string that names a copied path pointing at the copy."""
        if isinstance(value, str):
            return self.inside.get(value, value)
        if isinstance(value, dict):
            return {k: self.rewrite(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.rewrite(v) for v in value]
        return value


def _names_a_host_path(value: str) -> bool:
    return value.startswith("/") and "\n" not in value and len(value) < 4096 and os.path.exists(value)


def _size(path: Path) -> int:
    if not path.is_dir():
        return path.stat().st_size
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
        if total > _MAX_INPUT_BYTES:
            break
    return total


def fill_placeholders(template: str, values: dict[str, Any], stage: _Stage | None = None) -> str:
    """Replace known placeholders only, so shell ``${X}`` and JSON braces pass through.
    ``{task[F]}`` takes a dotted path into the full task (``{task[hidden.tests]}``); with ``stage``,
    a value naming a host path becomes its copy's path inside the sandbox."""

    def substitute(match: re.Match[str]) -> str:
        name, key = match.group(1), match.group(2)
        if key is not None:
            try:
                value = get_field(values["task"], key)
            except KeyError:
                value = None
        else:
            value = values.get(name)
        if value is None:
            raise EvaluatorError(f"evaluator template {match.group(0)}: the task has no such field")
        text = value if isinstance(value, str) else json.dumps(value)
        return stage.path(text) if stage is not None and key is not None else text

    filled = _PLACEHOLDER.sub(substitute, template)
    return stage.path(filled) if stage is not None else filled


@dataclass
class _Run:
    code: int | None  # None: killed at the time limit
    stdout: str
    stderr: str
    seconds: float
    oom: bool = False
    # The launcher's report when the scorer's program, a file in the workspace, could not be started.
    missing: str | None = None


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
        with tempfile.TemporaryDirectory(prefix="harnessrl-eval-") as tmp:  # 0700: the sandbox never sees it
            scratch = Path(tmp)
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
                    0.0,
                    {"workspace_copy": {**copied, "over_limit": copy.over_limit}},
                    (WORKSPACE_TOO_LARGE, *flags),
                )
            stage = _Stage(scratch, self.sandbox.shared(), inp.workspace)
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
            task_file.write_text(
                json.dumps(stage.rewrite(scorer_view(inp.task, self.config.withheld_fields)))
            )
            (scratch / "scorer").mkdir(mode=0o700)
            binds = (
                Bind(scratch / "workspace", inp.workspace, writable=True),
                Bind(scratch / "scorer", SCORER_DIR_INSIDE, writable=True),
                Bind(task_file, TASK_INSIDE),
                *stage.binds(),
            )
            if inp.environment is not None:  # the image's tools after harnessrl's venv
                env["PATH"] = inp.environment.search_path()
            run = await self._run(command, inp, scratch, env=env, cwd=inp.workspace, binds=binds)
        result = self._verdict(run)
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
        return self._verdict(await self._run(command, inp, scratch, env=env, cwd=inp.workspace, binds=()))

    async def _run(
        self,
        command: list[str],
        inp: EvaluationInput,
        scratch: Path,
        *,
        env: dict[str, str],
        cwd: Path,
        binds: tuple[Bind, ...],
    ) -> _Run:
        """Run the scorer in its sandbox and cgroup; kill everything left once it exits or times out;
        ``EvaluatorError`` only if the launcher says it never started, unless what could not start
        was a program in the workspace (``_Run.missing``: the policy's outcome)."""
        limits = self.config.limits
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
                code: int | None
                try:
                    code = await asyncio.wait_for(proc.wait(), self.config.timeout_s)
                except TimeoutError:
                    code = None
                finally:
                    # Everything the scorer left (and, on a timeout, the scorer) dies before its
                    # output is read: nothing can append to it afterwards.
                    await asyncio.to_thread(_kill, proc.pid, group)
                    if proc.returncode is None:
                        await proc.wait()
            oom = group is not None and group.oom_killed()
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
                return _Run(None, "", _tail(err_path), seconds, missing=detail)
            raise EvaluatorError(f"the scorer did not start: {detail}")
        return _Run(code, _tail(out_path), _tail(err_path), seconds, oom)

    def _verdict(self, run: _Run) -> EvaluationResult:
        """The reward the scorer's run gives, or 0 with a flag when it gave no valid verdict."""
        details: dict[str, Any] = {
            "exit_code": run.code,
            "seconds": run.seconds,
            "stdout_tail": run.stdout[-2000:],
            "stderr_tail": run.stderr[-2000:],
        }
        if run.missing is not None:
            why = f"its program, in the workspace, could not be started: {run.missing[:500]}"
            return EvaluationResult(0.0, {**details, "why": why}, (SCORER_MISSING,))
        if run.code is None:
            return EvaluationResult(
                0.0, {**details, "why": f"timed out after {self.config.timeout_s:g} s"}, (SCORER_TIMEOUT,)
            )
        if run.oom:
            details["oom_killed"] = True
        if self.config.reward_from == "exit_code":
            return self._in_range(1.0 if run.code == 0 else 0.0, details, ())
        if run.code != 0:
            return _failed(details, f"the scorer exited with {run.code}")
        last = next((line.strip() for line in reversed(run.stdout.splitlines()) if line.strip()), "")
        if self.config.reward_from == "stdout_float":
            try:
                reward = float(last)
            except ValueError:
                return _failed(details, f"its output's last line is not a number: {last[:200]!r}")
            return self._in_range(reward, details, ())
        try:
            payload = json.loads(last)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            return _failed(details, f"its output's last line is not JSON: {last[:200]!r}")
        if not isinstance(payload, dict) or "reward" not in payload:
            return _failed(details, f'its JSON has no "reward": {last[:200]!r}')
        if _depth(payload) > _MAX_VERDICT_DEPTH:
            return _failed(details, f"its JSON nests deeper than {_MAX_VERDICT_DEPTH} levels: {last[:200]!r}")
        reward = payload.pop("reward")
        flags = scorer_flags(payload.get("flags"))
        return self._in_range(reward, {**details, "output": payload}, flags)

    def _in_range(self, reward: Any, details: dict[str, Any], flags: tuple[str, ...]) -> EvaluationResult:
        if not isinstance(reward, bool | int | float) or (
            isinstance(reward, float) and not math.isfinite(reward)
        ):
            return _failed(details, f"its reward is not a finite number: {repr(reward)[:200]}", flags)
        low, high = self.config.reward_range
        # Compared as it is: Python compares an int of any size with a float exactly, where float()
        # of a JSON integer past ~1e308 raises OverflowError. Such a reward is outside any range.
        if not low <= reward <= high:
            why = f"reward {repr(reward)[:200]} outside reward_range [{low:g}, {high:g}]"
            return EvaluationResult(0.0, {**details, "why": why}, (*flags, REWARD_OUT_OF_RANGE))
        return EvaluationResult(float(reward), details, flags)


def _failed(details: dict[str, Any], why: str, flags: tuple[str, ...] = ()) -> EvaluationResult:
    return EvaluationResult(0.0, {**details, "why": why}, (*flags, SCORER_FAILED))


def _depth(value: Any) -> int:
    """How deeply parsed JSON nests objects and lists (``{}`` is 1); iterative, so any depth."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _kill(pid: int, group: ResourceGroup | None) -> None:
    if group is not None:
        group.kill_all()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _tail(path: Path) -> str:
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - _OUTPUT_LIMIT))
        return fh.read().decode(errors="replace")
