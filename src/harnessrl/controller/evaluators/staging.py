"""What a ``command`` scorer's sandbox holds besides the workspace copy: its inputs, task and environment.

A host path the command names (an absolute argument, or what a ``{task[F]}`` placeholder renders to)
is copied once per rollout into ``/run/harnessrl/inputs/`` (``InputStage``), and the command names
the copy: the scorer never sees the task's folder, the original repository or a gold patch beside
the hidden tests. Not copied: the workspace (the scorer gets its own copy of it) and what holds it,
what every scorer may read in place (the system, Python, harnessrl, ``evaluator.mounts``), and
``/dev`` and ``/proc``, which the sandbox has its own of. Only regular files and folders are copied:
another kind of file (a FIFO, a device) is an ``EvaluatorError`` naming it, never a copy of
``/dev/zero`` that runs until the disk is full or a read from a FIFO that never ends.
``fill_placeholders`` renders the command and its environment; ``scorer_view`` is the task file
without the solution; ``scrubbed_env`` the environment the scorer starts from. ``evaluators.command``
runs the scorer with them. See docs/evaluators.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from harnessrl.controller.evaluators.types import EvaluatorError
from harnessrl.sandbox.bwrap import DEFAULT_PATH, SYSTEM_DIRS, Bind
from harnessrl.tasks.fields import HIDDEN, get_field

_PLACEHOLDER = re.compile(r"\{(workspace|task_file|rollout_id|prompt|task\[([^\]\}]+)\])\}")
# Passed through from the controller's environment; everything else (the admin key, PYTHONPATH,
# HOME, VIRTUAL_ENV: places the agent might have planted a sitecustomize.py) is dropped.
_INHERITED_ENV = ("LANG", "LC_ALL", "TZ")

# Where the scorer's own things are inside its sandbox (never shown to the code it runs through
# ``run_scored``, whose domain does not include /run).
INSIDE = Path("/run/harnessrl")
INPUTS_INSIDE = INSIDE / "inputs"
TASK_INSIDE = INSIDE / "task.json"
SCORER_DIR_INSIDE = INSIDE / "scorer"


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


_MAX_INPUT_BYTES = 1 << 30  # a scorer input bigger than this belongs in evaluator.mounts
# The sandbox's own (``bwrap --dev``, ``--proc``): a path there names the scorer's device or process
# file, which no copy could stand in for (``/dev/zero`` copied is the host's disk filled).
_SANDBOX_OWN = (Path("/dev"), Path("/proc"))


class InputStage:
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
            or any(source.is_relative_to(own) for own in _SANDBOX_OWN)
            or source.is_relative_to(self.workspace)
            or self.workspace.is_relative_to(source)
        ):
            return value
        mode = source.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise EvaluatorError(
                f"evaluator input {value!r} is not a regular file or folder (a FIFO, socket or device): "
                "it cannot be copied in"
            )
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


def fill_placeholders(template: str, values: dict[str, Any], stage: InputStage | None = None) -> str:
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
