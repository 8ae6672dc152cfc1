"""Turning a ``HarnessSpec`` into one attempt's argv, environment, files and working folder.

Placeholders like ``{workspace}`` are replaced only when they are one of the known names below, so a
command can carry shell (``${HOME}``) or JSON braces untouched. The harness's environment is built
from an allow-list, never inherited wholesale: it must not see the admin key or the host's secrets.

Everything the harness sees is rendered against its view of the task (``harness_view``: no
``hidden``), and ``{task[hidden.…]}`` there is refused. Only ``harness.repo`` — a folder the
controller copies into the workspace, never shown to the harness — is rendered against the full task,
so a task can keep the path of its original repository (whose history holds the fix) hidden.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.controller.base import ROLLOUT_PATHS, HarnessSpec, SandboxPaths
from harnessrl.errors import ConfigError
from harnessrl.schemas import Rollout
from harnessrl.tasks.fields import HIDDEN, check_visible, get_field, is_hidden_path

if TYPE_CHECKING:
    from harnessrl.controller.evaluators import EvaluatorConfig

_PLACEHOLDER = re.compile(
    r"\{(rollout_id|attempt|workspace|base_url|anthropic_base_url|api_key|model|task_file|prompt|task\[([^\]\}]+)\])\}"
)

# Variables passed through from the controller's environment (everything else is dropped).
_INHERITED = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "JAVA_HOME", "NODE_PATH")

# Harnesses and their SDKs phone home for telemetry, updates and cost maps; inside the sandbox
# those attempts fail anyway, these make them not try (and not wait for timeouts).
QUIET_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
    "DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
    "TERM": "dumb",
    "NO_COLOR": "1",
}


@dataclass(frozen=True)
class RenderedHarness:
    argv: list[str]
    env: dict[str, str]
    files: dict[str, str]
    cwd: Path
    repo: Path | None
    task_file: Path


def fill(template: str, values: dict[str, Any], *, field: str, hidden_ok: bool = False) -> str:
    """``template`` with its known placeholders replaced; ``{task[a.b]}`` is a dotted path. Hidden
    paths (``{task[hidden.x]}``) are refused unless ``hidden_ok`` (``harness.repo`` only)."""

    def substitute(match: re.Match[str]) -> str:
        name, task_key = match.group(1), match.group(2)
        if task_key is not None:
            if is_hidden_path(task_key) and not hidden_ok:
                raise ConfigError(
                    f"{field}: {match.group(0)} is evaluator-only data; the harness sees only the task's "
                    "visible fields (hidden ones may be used in harness.repo and by evaluators)"
                )
            try:
                value = get_field(values["task"], task_key)
            except KeyError:
                raise ConfigError(
                    f"{field}: the task has no field {task_key!r} (used as {match.group(0)})"
                ) from None
            return value if isinstance(value, str) else json.dumps(value)
        if name == "prompt" and values.get("prompt") is None:
            raise ConfigError(f"{field}: {{prompt}} needs a 'prompt' field in the task")
        value = values[name]
        # A prompt that is not a string (a list of messages...) as JSON, like ``{task[prompt]}``: str()
        # gave the harness Python's repr (single quotes, True/None).
        return json.dumps(value) if name == "prompt" and not isinstance(value, str) else str(value)

    return _PLACEHOLDER.sub(substitute, template)


# Linux refuses to exec a program one of whose arguments or environment entries ("NAME=value") is
# longer than MAX_ARG_STRLEN (32 pages, its NUL included), or whose arguments and environment
# together pass ARG_MAX (E2BIG). The sandbox's own wrapper adds its arguments on top: ``_EXEC_MARGIN``.
MAX_EXEC_STRING = 32 * os.sysconf("SC_PAGESIZE") - 1
_EXEC_MARGIN = 64 * 1024


def _exec_budget() -> int:
    return max(os.sysconf("SC_ARG_MAX"), 32 * os.sysconf("SC_PAGESIZE")) - _EXEC_MARGIN


def os_bytes(where: str, text: str) -> int:
    """How many bytes ``text`` is as the OS gets it (an argument, a variable, a path); a ``ConfigError``
    naming ``where`` when it can be none of these: a NUL byte, or a lone surrogate (``\\ud800``: valid
    JSON, no text). Both came from task fields and raised ``ValueError`` deep in the launch."""
    if "\0" in text:
        raise ConfigError(
            f"{where}: contains a NUL byte (from the task?), which no argument, variable or path can hold"
        )
    try:  # as ``os.fsencode`` does: surrogateescape stands for bytes that are not UTF-8
        return len(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        raise ConfigError(
            f"{where}: holds a lone surrogate (\\ud800…, from the task?), which is no text a program "
            "can be given"
        ) from None


def check_exec(argv: list[tuple[str, str]], env: list[tuple[str, str, str]]) -> None:
    """Refuse what no ``exec`` could start, naming the field: ``argv`` as ``(field, item)``, ``env`` as
    ``(field, name, value)``. A NUL byte (from a task field) ended the string early, crashed the
    sandbox's launcher, or — in the environment, which reaches bubblewrap as NUL-separated options —
    added options of its own (``--bind / …``: the host's files writable in the sandbox). A string past
    ``MAX_EXEC_STRING`` or a total past ``ARG_MAX`` failed every attempt as "bwrap failed to set up
    the sandbox"."""
    for where, name, _ in env:
        if not name or "=" in name:  # bubblewrap's setenv failed: every attempt an infrastructure failure
            raise ConfigError(f"{where}: {name!r} is no environment variable name (empty, or holding '=')")
    total = 0
    for where, text in [*argv, *((where, f"{name}={value}") for where, name, value in env)]:
        size = os_bytes(where, text)
        if size > MAX_EXEC_STRING:
            raise ConfigError(
                f"{where}: {size} bytes, longer than one argument or environment variable may be "
                f"({MAX_EXEC_STRING} bytes on Linux): pass long task data through the task file "
                "({task_file}) instead"
            )
        total += size + 1 + 8  # the string, its NUL, its pointer
    if total > _exec_budget():
        raise ConfigError(
            f"harness: the command line and environment are {total} bytes together, more than a program "
            f"may be started with here ({_exec_budget()} bytes): pass long task data through the task "
            "file ({task_file}) instead"
        )


def harness_view(task: dict[str, Any]) -> dict[str, Any]:
    """The task as the harness may see it: everything but ``task["hidden"]``.

    Task data under ``hidden`` (a gold patch, hidden test names, answers) is for evaluators only: it
    never reaches the harness's environment, task file or command line.
    """
    return {k: v for k, v in task.items() if k != HIDDEN}


def render_harness(
    spec: HarnessSpec,
    *,
    rollout: Rollout,
    workspace: Path,
    base_url: str,
    anthropic_base_url: str,
    inside: SandboxPaths | None = None,
) -> RenderedHarness:
    """The harness's argv, environment, files and cwd for one attempt in ``workspace`` (a host folder;
    its home is ``workspace/../home`` and the task file ``workspace/../task.json``). With ``inside``
    (``ROLLOUT_PATHS`` in the bubblewrap sandbox) everything the harness reads names the paths it sees
    there; ``RenderedHarness.task_file`` is the host file, for the runner to bind."""
    # A task created through the API skips the task loaders' check: refuse it here, before launch.
    check_visible(rollout.task, where=f"rollout {rollout.rollout_id}")
    task = harness_view(rollout.task)
    task_file = workspace.parent / "task.json"
    task_file.parent.mkdir(parents=True, exist_ok=True)
    task_file.write_text(json.dumps(task, indent=2))
    seen = inside or SandboxPaths(workspace=workspace, home=workspace.parent / "home", task_file=task_file)
    values: dict[str, Any] = {
        "rollout_id": rollout.rollout_id,
        "attempt": rollout.attempt,
        "workspace": str(seen.workspace),
        "base_url": base_url,
        "anthropic_base_url": anthropic_base_url,
        "api_key": rollout.api_key,
        "model": spec.model_name,
        "task_file": str(seen.task_file),
        "prompt": task.get("prompt"),
        "task": task,
    }
    fields = [f"harness.command[{i}]" for i in range(len(spec.command))]
    fields += [f"harness.args[{i}]" for i in range(len(spec.args))]
    argv = [
        fill(arg, values, field=where) for where, arg in zip(fields, [*spec.command, *spec.args], strict=True)
    ]
    home = workspace.parent / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {name: os.environ[name] for name in _INHERITED if name in os.environ}
    env.update(QUIET_ENV)
    env.update(
        {
            "HOME": str(seen.home),
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_BASE": base_url,
            "OPENAI_API_KEY": rollout.api_key,
            "ANTHROPIC_BASE_URL": anthropic_base_url,
            "ANTHROPIC_API_KEY": rollout.api_key,
            "HARNESSRL_ROLLOUT_ID": rollout.rollout_id,
            "HARNESSRL_ATTEMPT": str(rollout.attempt),
            "HARNESSRL_TASK": json.dumps(task),
            "HARNESSRL_TASK_FILE": str(seen.task_file),
            "HARNESSRL_MODEL": spec.model_name,
        }
    )
    if len("HARNESSRL_TASK=") + len(env["HARNESSRL_TASK"]) > MAX_EXEC_STRING:  # json.dumps: ASCII only
        del env["HARNESSRL_TASK"]  # too long for any environment: the task file holds the same JSON
    for key, value in spec.env.items():
        env[key] = fill(value, values, field=f"harness.env.{key}")
    files = {
        fill(rel, values, field="harness.files"): fill(content, values, field=f"harness.files[{rel!r}]")
        for rel, content in spec.files.items()
    }
    workdir = fill(spec.workdir, values, field="harness.workdir") if spec.workdir else ""
    cwd = seen.workspace / workdir if workdir else seen.workspace
    if not Path(os.path.normpath(cwd)).is_relative_to(os.path.normpath(seen.workspace)):
        # The scorer reads only the workspace: a harness started in its private /tmp or its home did
        # its work where no evaluator looked (reward 0, silently), and the Kubernetes runner started
        # it in the workspace instead; a path above the workspace failed every attempt at launch.
        raise ConfigError(f"harness.workdir: {workdir!r} is outside the workspace (give a folder in it)")
    # The controller copies the repo; the harness never sees its path: the full task, hidden included.
    full = {**values, "task": rollout.task}
    repo = fill(spec.repo, full, field="harness.repo", hidden_ok=True) if spec.repo else None
    names = [("harness.files", rel) for rel in files] + [("harness.workdir", workdir)]
    for where, text in [*names, ("harness.repo", repo or "")]:
        os_bytes(where, text)  # paths the controller itself opens: ValueError there left it hanging
    for rel, content in files.items():  # written as UTF-8 (a NUL is fine in a file)
        if not content.isascii():
            try:
                content.encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(
                    f"harness.files[{rel!r}]: holds a lone surrogate (\\ud800…, from the task?), which "
                    "no file can be written with"
                ) from None
    check_exec(
        list(zip(fields, argv, strict=True)),
        [(f"harness.env.{k}" if k in spec.env else f"the harness's ${k}", k, v) for k, v in env.items()],
    )
    return RenderedHarness(
        argv=argv, env=env, files=files, cwd=cwd, repo=Path(repo) if repo else None, task_file=task_file
    )


def check_task(spec: HarnessSpec, task: dict[str, Any], evaluator: EvaluatorConfig | None = None) -> None:
    """Render ``spec`` (its preset applied) for ``task`` once, in a scratch folder removed again: a task
    the harness cannot start on — a field its templates name missing, a NUL byte, a prompt too long
    for a command line — is a ``ConfigError`` naming the field before anything starts, not an
    infrastructure failure of every attempt (``harnessrl rollout``). With ``evaluator``, a field the
    evaluator needs to score the task (``hidden.answer``...) missing is one too."""
    with tempfile.TemporaryDirectory(prefix="harnessrl-check-") as scratch:
        _render_for_check(spec, task, Path(scratch))
    if evaluator is not None:
        try:
            evaluator.check_task(task)
        except ConfigError as exc:
            raise ConfigError(f"the evaluator cannot score the task: {exc}") from exc


def check_tasks(
    spec: HarnessSpec,
    tasks: Iterable[tuple[str, dict[str, Any]]],
    evaluator: EvaluatorConfig | None = None,
    *,
    repo_here: bool = True,
) -> None:
    """``check_task`` for each ``(task_id, task)``, in one scratch folder (a training set holds many
    thousand): the first task the harness cannot start on, or (with ``evaluator``) that lacks a field
    the evaluator needs (``EvaluatorConfig.check_task``), is a ``ConfigError`` naming it. Without this
    a task with no ``hidden.answer`` was found only when each attempt was scored: an infrastructure
    failure, retried, the run going on (exit 0) with the task never trained. ``repo_here``: the
    harnesses launch on this machine, so each task's ``harness.repo`` folder must be here."""
    with tempfile.TemporaryDirectory(prefix="harnessrl-check-") as scratch:
        for task_id, task in tasks:
            try:
                _render_for_check(spec, task, Path(scratch), repo_here=repo_here)
            except ConfigError as exc:
                raise ConfigError(f"task {task_id!r}: the harness cannot start on it: {exc}") from exc
            if evaluator is None:
                continue
            try:
                evaluator.check_task(task)
            except ConfigError as exc:
                raise ConfigError(f"task {task_id!r}: the evaluator cannot score it: {exc}") from exc


def _render_for_check(
    spec: HarnessSpec, task: dict[str, Any], scratch: Path, *, repo_here: bool = True
) -> None:
    rollout = Rollout(rollout_id="rollout-check", api_key="hrl-check", task=task)
    workspace = scratch / "attempt" / "workspace"
    rendered = render_harness(
        spec,
        rollout=rollout,
        workspace=workspace,
        base_url="http://127.0.0.1:1/rollouts/rollout-check/v1",
        anthropic_base_url="http://127.0.0.1:1/rollouts/rollout-check",
        inside=ROLLOUT_PATHS if spec.sandbox == "bwrap" else None,
    )
    if repo_here and rendered.repo is not None:
        check_repo(rendered.repo)
    check_files_inside(rendered.files)
    seen = ROLLOUT_PATHS.workspace if spec.sandbox == "bwrap" else workspace
    # Not with a task image: what its workspace holds is known only once it is built (at launch).
    if spec.environment is None and (repo_here or rendered.repo is None):
        check_workdir_made(os.path.relpath(rendered.cwd, seen), rendered.repo, rendered.files)


def check_repo(repo: Path) -> None:
    """``harness.repo``, rendered for a task, names a folder the controller can copy. Found only at
    launch, a missing one (or a file) failed every attempt as an infrastructure failure and the run
    stopped after its folder and store were made."""
    if not repo.is_dir():
        what = "does not exist" if not repo.exists() else "is not a folder"
        raise ConfigError(f"harness.repo: {str(repo)!r} {what} (the repo copied into each workspace)")
    if not os.access(repo, os.R_OK | os.X_OK):
        raise ConfigError(f"harness.repo: {str(repo)!r} cannot be read by this process")


def check_workdir_made(workdir: str, repo: Path | None, files: Iterable[str]) -> None:
    """``harness.workdir`` (``workdir``: relative to the workspace), rendered for a task, is a folder
    the repo or ``harness.files`` make in the workspace; nothing else does before the harness starts,
    so a missing one failed every attempt at launch. A workdir outside the workspace is left as it was."""
    rel = os.path.normpath(workdir)
    if rel == "." or rel == ".." or rel.startswith(".." + os.sep):
        return
    if repo is not None and (repo / rel).is_dir():
        return
    if any(os.path.normpath(name).startswith(rel + os.sep) for name in files):
        return
    raise ConfigError(
        f"harness.workdir: {rel!r} is not a folder of the workspace (the repo or harness.files must make it)"
    )


def check_files_inside(files: Iterable[str]) -> None:
    """Each ``harness.files`` path, rendered for a task, names a file inside the workspace (not an
    absolute path, not ``..`` out of it, not the workspace itself). Found only at launch, each was an
    infrastructure failure of every attempt, after the run had started."""
    workspace = Path("/workspace")
    for rel in files:
        target = Path(os.path.normpath(workspace / rel))
        if target == workspace or not target.is_relative_to(workspace):
            raise ConfigError(f"harness.files: {rel!r} is not a file path inside the workspace")


# Interpreters whose first argument is the program they run (python3.11, node, bash...).
_INTERPRETER = re.compile(r"^(python[\d.]*|node|bash|sh|zsh|ruby|perl|deno|bun)$")


def check_harness(spec: HarnessSpec) -> None:
    """Fail before any rollout starts if the harness cannot run at all."""
    exe = spec.command[0]
    if "{" not in exe and shutil.which(exe) is None and not Path(exe).is_file():
        raise ConfigError(f"harness.command[0]: executable {exe!r} not found on PATH")
    if "{" not in exe and Path(exe).is_file() and not os.access(exe, os.X_OK):
        raise ConfigError(f"harness.command[0]: {exe!r} is not executable")
    # The script an interpreter runs (the python preset: [python, "/abs/agent.py", ...]): a typo in
    # it would otherwise fail every rollout as the policy's fault, reward 0, and the run "train" on.
    if len(spec.command) > 1 and _INTERPRETER.match(Path(exe).name):
        script = spec.command[1]
        if os.path.isabs(script) and "{" not in script and not Path(script).is_file():
            raise ConfigError(f"harness.command[1]: script {script!r} does not exist")
