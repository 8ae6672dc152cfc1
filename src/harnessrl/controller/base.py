"""The controller's vocabulary: what a harness is, how one attempt is launched, and how it ended.

A ``Runner`` (local sandbox, Kubernetes Job) starts one attempt of a rollout from a ``Launch`` and
returns a ``RunHandle``; the controller waits on it, runs the evaluator, and records the outcome.
``Exit.kind`` tells policy failures (the harness itself failed, ran out of its own time) apart from
infrastructure failures (the sandbox or cluster failed) — only the latter are retried and they never
enter a group's baseline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harnessrl.environments.config import EnvironmentConfig
from harnessrl.sandbox.rootfs import ImageRoot

# ``{task[hidden]}`` / ``{task[hidden.x]}``: evaluator-only data, refused wherever the harness sees it.
_HIDDEN_PLACEHOLDER = re.compile(r"\{task\[hidden(?:\.[^\]\}]*)?\]\}")


class ResourceLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu_seconds: int | None = Field(default=None, ge=1, description="RLIMIT_CPU of each process")
    memory_mb: int | None = Field(default=2048, ge=16, description="address-space / cgroup memory cap")
    max_processes: int | None = Field(default=256, ge=1, description="process-count cap (fork bombs)")
    cpus: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="CPU share (Kubernetes: limits.cpu)"
    )
    open_files: int | None = Field(
        default=4096, ge=16, description="RLIMIT_NOFILE of each process (local runner)"
    )
    file_mb: int | None = Field(
        default=1024, ge=1, description="largest file a process may write, RLIMIT_FSIZE (local runner)"
    )
    disk_mb: int | None = Field(
        default=10240,
        ge=1,
        description="disk the workspace and home may use together; the attempt is killed past it "
        "(local runner; Kubernetes: ephemeral_storage_limit)",
    )
    max_entries: int | None = Field(
        default=1_000_000,
        ge=1,
        description="entries (files, links, folders, each name of a hard-linked file) the workspace "
        "and home may hold together; the attempt is killed past it, disk_mb or not (local runner)",
    )


class HarnessSpec(BaseModel):
    """How to run a harness for one rollout. Strings may use ``{placeholders}`` filled per rollout:
    ``{rollout_id}``, ``{workspace}``, ``{base_url}`` (OpenAI-style, ends in /v1),
    ``{anthropic_base_url}``, ``{api_key}``, ``{model}``, ``{task_file}``, ``{prompt}`` (the
    task's ``prompt`` field, if any; JSON when it is not a string) and ``{task[FIELD]}`` (``FIELD``
    may be a dotted path; JSON when not a string).
    ``{task[hidden.…]}`` is refused everywhere but ``repo``, which the harness never sees.
    ``{workspace}`` and ``{task_file}`` are the paths the harness sees: ``/rollout/workspace`` and
    ``/rollout/task.json`` in the bubblewrap sandbox (``ROLLOUT_PATHS``; ``$HOME`` is ``/rollout/home``),
    the host paths with ``sandbox = "none"``."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] = Field(
        default_factory=list, description="argv; the first item must be an executable (or use a preset)"
    )
    args: list[str] = Field(
        default_factory=list,
        description="argv items appended after the command (templates), e.g. extra flags for a preset",
    )
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = Field(
        default=None, description="subfolder of the workspace to start in (template); default: workspace"
    )
    files: dict[str, str] = Field(
        default_factory=dict, description="relative path -> content placed in the workspace (templates)"
    )
    repo: str | None = Field(
        default=None, description="folder (template) copied into the workspace before launch"
    )
    git_history: str = Field(default="squash", pattern="^(keep|squash|remove)$")
    # Finite: ``inf`` (valid TOML) passed ``gt=0`` and crashed the Kubernetes Job's deadline
    # (math.ceil) with the rollout left running.
    timeout_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    network: str = Field(default="gateway", pattern="^(gateway|host)$")
    sandbox: Literal["bwrap", "none"] = Field(
        default="bwrap",
        description='"bwrap": the bubblewrap sandbox (docs/sandbox.md); "none": no isolation at all '
        "(unsafe for training: the agent can read and change everything the controller can)",
    )
    mounts: list[str] = Field(
        default_factory=list,
        description="absolute host paths the harness may read (bound read-only into its sandbox)",
    )
    preset: str | None = None
    model_name: str = "policy"
    environment: EnvironmentConfig | None = Field(
        default=None,
        description="each task's environment: a container image as the sandbox's root "
        "(docs/environments.md); None: the host's system folders for every task",
    )
    tools: list[Literal["search"]] = Field(
        default_factory=list,
        description='tools the gateway serves that the harness gets: "search" (the retriever as a '
        "`search` command and, for Claude Code, Codex and OpenCode, an MCP server; needs [retrieval])",
    )

    @model_validator(mode="after")
    def _command_or_preset(self) -> HarnessSpec:
        if not self.command and not self.preset:
            raise ValueError("set harness.command (an argv list) or harness.preset")
        return self

    @model_validator(mode="after")
    def _no_hidden_fields(self) -> HarnessSpec:
        templates = [(f"command[{i}]", a) for i, a in enumerate(self.command)]
        templates += [(f"args[{i}]", a) for i, a in enumerate(self.args)]
        templates += [(f"env.{k}", v) for k, v in self.env.items()]
        templates += [("files", rel) for rel in self.files]
        templates += [(f"files[{rel!r}]", content) for rel, content in self.files.items()]
        templates += [("workdir", self.workdir or "")]
        for where, template in templates:
            found = _HIDDEN_PLACEHOLDER.search(template)
            if found:
                raise ValueError(
                    f"harness.{where}: {found.group(0)} is evaluator-only data and would reach the harness "
                    "(only harness.repo, which the controller copies, may use hidden task fields)"
                )
        return self


class ExitKind(StrEnum):
    EXITED = "exited"  # the process ended by itself (any exit code)
    TIMEOUT = "timeout"  # killed at the rollout's deadline
    OOM = "oom"  # killed for exceeding its memory cap
    RESOURCE_LIMIT = "resource_limit"  # CPU time / process / file size / disk cap hit
    CANCELLED = "cancelled"  # killed because the rollout was cancelled
    INFRA = "infra"  # the sandbox, pod or node failed: not the policy's fault


@dataclass(frozen=True)
class Exit:
    kind: ExitKind
    exit_code: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class SandboxPaths:
    """Where an attempt's workspace, home and task file appear to the harness inside its sandbox."""

    workspace: Path
    home: Path
    task_file: Path


# In the bubblewrap sandbox every attempt sees the same paths, whatever its run folder and rollout id:
# harnesses write their cwd and $HOME into the prompt (Hermes, Claude Code, Codex, OpenCode), and a
# host path there would make each rollout's prompt differ from the others' from that token on — no
# prefix cache across a group, no shared-prefix training rows, and run folders and rollout ids
# shown to the policy and kept in its training data. ``{workspace}/../home`` is the home here too.
ROLLOUT_PATHS = SandboxPaths(
    workspace=Path("/rollout/workspace"), home=Path("/rollout/home"), task_file=Path("/rollout/task.json")
)


@dataclass
class Launch:
    """Everything a runner needs to start one attempt of one rollout."""

    rollout_id: str
    attempt: int
    argv: list[str]
    env: dict[str, str]
    task: dict[str, Any]
    files: dict[str, str]  # rendered harness files (already placed in ``workspace`` for local runs)
    workspace: Path  # prepared by the controller (files placed, repo copied, history hidden)
    cwd: Path
    log_dir: Path  # stdout.log / stderr.log go here
    timeout_s: float
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    network: str = "gateway"
    gateway_port: int | None = None
    sandbox: str = "bwrap"  # "bwrap" | "none"
    home: Path | None = None  # the attempt's $HOME (writable in the sandbox); default workspace/../home
    task_file: Path | None = None  # the task as the harness sees it (bound read-only)
    mounts: tuple[Path, ...] = ()  # more host paths bound read-only (the harness's install, ...)
    # The task's environment (docs/environments.md): ``root`` is its image mounted on this machine
    # (local runner: the sandbox's / is the image's), ``image`` the reference a cluster pulls
    # (Kubernetes: the Job's image). Both None: the host's system, as before.
    root: ImageRoot | None = None
    image: str | None = None
    # Where the harness sees the workspace, home and task file (``ROLLOUT_PATHS`` in the bubblewrap
    # sandbox): ``argv``, ``env``, ``files`` and ``cwd`` then name those paths, and the runner puts
    # the host's ``workspace``, ``home`` and ``task_file`` there. None: the host paths, as they are.
    inside: SandboxPaths | None = None


class RunHandle(Protocol):
    async def wait(self) -> Exit:
        """Wait for the attempt to end (the runner enforces the timeout)."""

    async def kill(self, kind: ExitKind = ExitKind.CANCELLED) -> None:
        """Kill the attempt and everything it started; ``wait`` then returns ``kind``."""


class Runner(Protocol):
    async def launch(self, launch: Launch) -> RunHandle: ...

    def forget(self, handle: RunHandle) -> None:
        """The controller is done with ``handle`` (its attempt ended and was recorded): drop it
        from what ``aclose`` would kill."""

    async def aclose(self) -> None:
        """Kill whatever is still running; leave no orphans."""
