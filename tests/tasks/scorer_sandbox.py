"""Run a scorer the way the command evaluator does (``docs/evaluators.md``): in a bubblewrap sandbox of
its own, over the workspace at its own path, with its inputs *copied* under
``/run/harnessrl/inputs/<i>/<name>``, the task file at ``/run/harnessrl/task.json``, a private
``$HARNESSRL_SCORER_DIR``, a private ``/tmp``, no network and a scrubbed environment.

It launches through ``SandboxHost.launch_argv``, the one way harnessrl starts a sandboxed command, with
the same binds the evaluator makes; tests use it to run real scorers (and the controls that show an
attack would work without them) against real coding tasks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import harnessrl
from harnessrl.sandbox.bwrap import DEFAULT_PATH, Bind, python_install_paths, sandbox_problem
from harnessrl.sandbox.host import shared_host

INSIDE = Path("/run/harnessrl")
PY = sys.executable


def sandbox_missing() -> str | None:
    return sandbox_problem()


@dataclass(frozen=True)
class Scored:
    code: int
    stdout: str
    stderr: str

    @property
    def last(self) -> dict:
        """The scorer's verdict: its last non-empty stdout line, as JSON."""
        line = next(line for line in reversed(self.stdout.splitlines()) if line.strip())
        return json.loads(line)


def run_in_sandbox(
    command: Sequence[str],
    *,
    workspace: Path,
    scratch: Path,
    inputs: Mapping[str, Path] = {},  # noqa: B006 (read only)
    task: dict | None = None,
    timeout_s: float = 180,
) -> Scored:
    """Run ``command`` as the evaluator runs a scorer; ``{NAME}`` in it becomes the inside path of the
    copy of ``inputs[NAME]``."""
    staging = scratch / "inputs"
    inside: dict[str, str] = {}
    for i, (name, source) in enumerate(inputs.items()):
        copy = staging / str(i) / source.name
        copy.parent.mkdir(parents=True)
        if source.is_dir():
            shutil.copytree(source, copy, symlinks=True)
        else:
            shutil.copyfile(source, copy)
        inside[name] = str(INSIDE / "inputs" / str(i) / source.name)
    task_file = scratch / "task.json"
    task_file.write_text(json.dumps(task or {}))
    scorer_dir = scratch / "scorer"
    scorer_dir.mkdir(mode=0o700)
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": str(INSIDE / "scorer"),
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONNOUSERSITE": "1",
        "HARNESSRL_WORKSPACE": str(workspace),
        "HARNESSRL_TASK_FILE": str(INSIDE / "task.json"),
        "HARNESSRL_SCORER_DIR": str(INSIDE / "scorer"),
    }
    binds = (
        Bind(workspace, workspace, writable=True),
        Bind(scorer_dir, INSIDE / "scorer", writable=True),
        Bind(task_file, INSIDE / "task.json"),
        *((Bind(staging, INSIDE / "inputs"),) if inside else ()),
    )
    filled = [_fill(arg, inside) for arg in command]
    argv = shared_host().launch_argv(
        scratch / "sandbox.json",
        sandbox="bwrap",
        command=filled,
        cwd=workspace,
        env=env,
        read_only=(*python_install_paths(), Path(harnessrl.__file__).parent),
        binds=binds,
        network="none",
    )
    proc = subprocess.run(
        argv, env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}, capture_output=True, text=True, timeout=timeout_s
    )
    return Scored(proc.returncode, proc.stdout, proc.stderr)


def _fill(arg: str, inside: Mapping[str, str]) -> str:
    for name, path in inside.items():
        arg = arg.replace("{" + name + "}", path)
    return arg
