"""Getting one attempt ready to launch: the harness rendered for its rollout, the workspace prepared,
the task's image found, the workspace snapshot the audit diffs against, and the ``Launch`` the
runner is given. No store: ``Controller._run_attempt`` launches, waits and records.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from harnessrl.controller.audit import AuditConfig
from harnessrl.controller.audit.workspace import WorkspaceSnapshot, snapshot_workspace
from harnessrl.controller.base import ROLLOUT_PATHS, HarnessSpec, Launch, SandboxPaths
from harnessrl.controller.harness import harness_view, render_harness
from harnessrl.controller.task_environments import TaskEnvironments
from harnessrl.sandbox.bwrap import check_mounts
from harnessrl.sandbox.rootfs import ImageRoot
from harnessrl.sandbox.workspace import prepare_workspace
from harnessrl.schemas import Rollout


@dataclass(frozen=True)
class GatewayEndpoint:
    """Where harnesses reach the gateway (inside a sandbox, the same port on its own loopback)."""

    host: str
    port: int

    def rollout_url(self, rollout_id: str) -> str:
        """The rollout's root (Anthropic SDKs add ``/v1`` themselves): its id as one path segment,
        quoted (a run name may hold ``#``, ``?``, ``%`` or a space, which cut the URL short)."""
        return f"http://{self.host}:{self.port}/rollouts/{quote(rollout_id, safe='')}"

    def base_url(self, rollout_id: str) -> str:
        return f"{self.rollout_url(rollout_id)}/v1"


@dataclass(frozen=True)
class PreparedAttempt:
    """An attempt ready to launch, with what scoring it needs later."""

    launch: Launch
    before: WorkspaceSnapshot | None  # the workspace as the harness found it (None: the audit reads no diff)
    root: ImageRoot | None  # the task's image mounted here
    image: str | None  # or the reference a cluster pulls
    inside: SandboxPaths | None  # where the harness sees its folders (None: the host paths)


async def prepare_attempt(
    rollout: Rollout,
    harness: HarnessSpec,
    *,
    attempt_dir: Path,
    gateway: GatewayEndpoint,
    run_dir: Path,
    environments: TaskEnvironments,
    image_references: bool,
    audit: AuditConfig,
) -> PreparedAttempt:
    """Render the harness, prepare the workspace (``attempt_dir/workspace``, emptied by the caller),
    find the task's image and snapshot the workspace. Raises ``HarnessRLError`` or ``OSError``: the
    attempt could not be launched (an infrastructure failure)."""
    workspace = attempt_dir / "workspace"
    check_mounts(harness.mounts, forbidden=[run_dir])
    inside = ROLLOUT_PATHS if harness.sandbox == "bwrap" else None
    rendered = render_harness(
        harness,
        rollout=rollout,
        workspace=workspace,
        base_url=gateway.base_url(rollout.rollout_id),
        anthropic_base_url=gateway.rollout_url(rollout.rollout_id),
        inside=inside,
    )
    await asyncio.to_thread(
        prepare_workspace,
        workspace,
        repo=rendered.repo,
        files=rendered.files,
        git_history=harness.git_history,
    )
    root, image = await environments.locate(
        harness, rollout, rendered.argv, workspace, references=image_references
    )
    # What the harness starts from, so the audit reads what it wrote, not only what it typed.
    before = None
    if audit.reads_workspace:
        before = await asyncio.to_thread(snapshot_workspace, workspace, audit.workspace_limits)
    launch = Launch(
        rollout_id=rollout.rollout_id,
        attempt=rollout.attempt,
        argv=rendered.argv,
        env=rendered.env,
        task=harness_view(rollout.task),  # what the runner may show the harness
        files=rendered.files,
        task_file=rendered.task_file,
        cwd=rendered.cwd,
        workspace=workspace,
        log_dir=attempt_dir,
        home=workspace.parent / "home",
        root=root,
        image=image,
        inside=inside,
        timeout_s=harness.timeout_s,
        mounts=tuple(Path(m) for m in harness.mounts),
        limits=harness.limits,
        network=harness.network,
        gateway_port=gateway.port,
        sandbox=harness.sandbox,
    )
    return PreparedAttempt(launch=launch, before=before, root=root, image=image, inside=inside)
