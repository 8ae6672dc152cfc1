"""The ``command`` evaluator: a program run in the workspace (e.g. the task's tests) scores the rollout.

``CommandEvaluator`` renders its argv with ``fill_placeholders`` and runs it with ``run_command``:
in its own process group, killed as a group on timeout and once it exits, output written to files
of which only the tail is read back. The reward is its exit code (0 -> 1.0), the last stdout line
as a float, or the last stdout line as JSON ``{"reward": x, ...}`` (``reward_from``).

An evaluator runs code the policy wrote (its tests, a ``conftest.py``), so by default it runs in an
``EvaluatorSandbox``: a fresh bubblewrap sandbox of its own over a *copy* of the workspace, with no
network, the evaluator's code and the task's hidden data bound read-only, and a scrubbed
environment (``scrubbed_env``: no inherited ``PYTHONPATH``, ``HOME`` or site folders; a fresh home).
Nothing the agent left behind outside its workspace — and it can reach nothing else — can change
the reward.
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
from typing import Any

import harnessrl
from harnessrl.controller.evaluator_config import CommandEvaluatorConfig
from harnessrl.controller.evaluator_types import (
    EvaluationInput,
    EvaluationResult,
    EvaluatorError,
    checked_result,
)
from harnessrl.errors import ConfigError
from harnessrl.sandbox.bwrap import DEFAULT_PATH, python_install_paths
from harnessrl.sandbox.host import SandboxHost, shared_host
from harnessrl.tasks.fields import get_field

_PLACEHOLDER = re.compile(r"\{(workspace|task_file|rollout_id|prompt|task\[([^\]\}]+)\])\}")
# Passed through from the controller's environment; everything else (the admin key, PYTHONPATH,
# HOME, VIRTUAL_ENV: places the agent might have planted a sitecustomize.py) is dropped.
_INHERITED_ENV = ("LANG", "LC_ALL", "TZ")
_OUTPUT_LIMIT = 1 << 20  # bytes of stdout/stderr kept (the tail): a chatty test suite can't exhaust memory


HARNESSRL_PACKAGE = Path(harnessrl.__file__).parent


def scrubbed_env(home: Path) -> dict[str, str]:
    """The environment an evaluator command starts from: a standard PATH (harnessrl's venv first,
    added by the sandbox), a fresh ``HOME``, the locale; nothing else of the controller's."""
    env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
    env.update(PATH=DEFAULT_PATH, HOME=str(home), TMPDIR="/tmp", PYTHONNOUSERSITE="1")
    return env


def paths_in(value: Any) -> set[Path]:
    """Absolute paths of existing files or folders named anywhere in ``value`` (a task, an argv):
    the hidden data an evaluator needs bound read-only into its sandbox."""
    found: set[Path] = set()
    if isinstance(value, str):
        if value.startswith("/") and "\n" not in value and len(value) < 4096 and os.path.exists(value):
            found.add(Path(value))
    elif isinstance(value, dict):
        for item in value.values():
            found |= paths_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            found |= paths_in(item)
    return found


def drop_escaping_links(root: Path) -> list[Path]:
    """Remove every symlink under ``root`` that points outside it (returned). The scorer binds hidden
    data read-only into its sandbox; a link the agent planted (``answer.txt -> /hidden/gold.txt``)
    would otherwise let the scorer read the gold answer as if the agent had written it."""
    dropped = []
    real_root = os.path.realpath(root)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            if path.is_symlink():
                target = os.path.realpath(path)
                if target != real_root and not target.startswith(real_root + os.sep):
                    path.unlink()
                    dropped.append(path)
    return dropped


@dataclass(frozen=True)
class EvaluatorSandbox:
    """How command evaluators are isolated: ``mode`` ``"bwrap"`` (default) or ``"none"``."""

    mode: str = "bwrap"
    mounts: tuple[Path, ...] = ()  # more read-only paths (the evaluator's own code)
    host: SandboxHost = field(default_factory=shared_host)

    def copy_workspace(self, workspace: Path, scratch: Path) -> Path:
        """A private copy of the agent's workspace to score (links copied as links, never followed)."""
        copy = scratch / "workspace"
        if workspace.is_dir():
            shutil.copytree(workspace, copy, symlinks=True)
            drop_escaping_links(copy)
        else:
            copy.mkdir()
        return copy

    def argv(
        self,
        command: list[str],
        *,
        workspace: Path,
        original_workspace: Path,
        scratch: Path,
        task: dict[str, Any],
        task_file: Path,
        env: dict[str, str],
    ) -> list[str]:
        """The sandboxed argv for ``command`` over the copy ``workspace``; the task's and the command's
        paths (hidden tests, the evaluator script) are bound read-only, except any folder holding
        the original workspace (that would be the run folder)."""
        home = scratch / "home"
        home.mkdir(exist_ok=True)
        named = {
            p
            for p in paths_in(task) | paths_in(command)
            if p != Path("/") and not original_workspace.is_relative_to(p)
        }
        return self.host.launch_argv(
            scratch / "sandbox.json",
            sandbox=self.mode,
            command=command,
            cwd=workspace,
            env=env,
            writable=(workspace, home),
            # harnessrl itself is evaluator code (e.g. the coding tasks' scorer): read-only, like the
            # rest; an editable install keeps it in the project checkout, which harnesses never see.
            read_only=(*python_install_paths(), HARNESSRL_PACKAGE, task_file, *self.mounts, *sorted(named)),
            network="none",
        )


def fill_placeholders(template: str, values: dict[str, Any]) -> str:
    """Replace known placeholders only, so shell ``${X}`` and JSON braces pass through.
    ``{task[F]}`` takes a dotted path into the full task (``{task[hidden.tests]}``)."""

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
        return value if isinstance(value, str) else json.dumps(value)

    return _PLACEHOLDER.sub(substitute, template)


async def run_command(
    argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float, scratch: Path
) -> tuple[int, str, str]:
    """Run ``argv`` in its own process group; kill the whole group on timeout and once it exits.

    Output goes to files in ``scratch``, not pipes: test suites leave servers behind that would hold
    a pipe open (and asyncio's ``wait()`` waits for the pipes), and a file's tail is cheap to read.
    """
    out_path, err_path = scratch / "stdout", scratch / "stderr"
    with out_path.open("wb") as out_fh, err_path.open("wb") as err_fh:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_fh,
                stderr=err_fh,
                start_new_session=True,
            )
        except OSError as exc:
            raise EvaluatorError(f"cannot start evaluator command {argv[0]!r}: {exc}") from exc
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError as exc:
            raise EvaluatorError(f"evaluator command timed out after {timeout_s:g}s") from exc
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.returncode is None:
                await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, _tail(out_path), _tail(err_path)


def _tail(path: Path) -> str:
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - _OUTPUT_LIMIT))
        return fh.read().decode(errors="replace")


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
            # The full task (hidden fields included) for the scorer; the harness saw only its view.
            task_file = scratch / "task.json"
            task_file.write_text(json.dumps(inp.task))
            sandboxed = self.sandbox.mode != "none"
            workspace = (
                await asyncio.to_thread(self.sandbox.copy_workspace, inp.workspace, scratch)
                if sandboxed
                else inp.workspace
            )
            values = {
                "workspace": str(workspace),
                "task_file": str(task_file),
                "rollout_id": inp.rollout_id,
                "prompt": inp.task.get("prompt"),
                "task": inp.task,
            }
            command = [fill_placeholders(a, values) for a in self.config.command]
            env = scrubbed_env(scratch / "home")
            env.update(
                HARNESSRL_WORKSPACE=str(workspace),
                HARNESSRL_TASK_FILE=str(task_file),
                HARNESSRL_TASK=json.dumps(inp.task),
                HARNESSRL_ROLLOUT_ID=inp.rollout_id,
            )
            env.update({k: fill_placeholders(v, values) for k, v in self.config.env.items()})
            argv = self.sandbox.argv(
                command,
                workspace=workspace,
                original_workspace=inp.workspace,
                scratch=scratch,
                task=inp.task,
                task_file=task_file,
                env=env,
            )
            started = time.monotonic()
            code, out, err = await run_command(argv, workspace, {}, self.config.timeout_s, scratch)
        details = {
            "exit_code": code,
            "seconds": round(time.monotonic() - started, 3),
            "stdout_tail": out[-2000:],
            "stderr_tail": err[-2000:],
        }
        if code in self.config.infra_exit_codes:
            raise EvaluatorError(f"evaluator command could not run (exit {code}): {err[-500:].strip()}")
        if self.config.reward_from == "exit_code":
            return checked_result(1.0 if code == 0 else 0.0, details)
        if code != 0:
            raise EvaluatorError(f"evaluator command exited with {code}: {err[-500:].strip()}")
        last = next((line.strip() for line in reversed(out.splitlines()) if line.strip()), "")
        if self.config.reward_from == "stdout_float":
            try:
                return checked_result(float(last), details)
            except ValueError as exc:
                raise EvaluatorError(f"evaluator output's last line is not a number: {last[:200]!r}") from exc
        try:
            payload = json.loads(last)
        except ValueError as exc:
            raise EvaluatorError(f"evaluator output's last line is not JSON: {last[:200]!r}") from exc
        if not isinstance(payload, dict) or "reward" not in payload:
            raise EvaluatorError(f'evaluator JSON has no "reward": {last[:200]!r}')
        return checked_result(payload.pop("reward"), {**details, "output": payload})
