"""The command evaluator's process runner: placeholders filled, environment built, argv run.

``CommandEvaluator`` (in ``evaluators``) renders its argv with ``fill_placeholders`` and runs it
with ``run_command``: in its own process group, killed as a group on timeout and once it exits,
output written to files of which only the tail is read back.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harnessrl
from harnessrl.controller.evaluator_types import EvaluatorError
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
