"""Scoring an attempt whose harness exited: the evaluator's reward, the audit's verdict on it, and the
metadata finished with the rollout.

``evaluate_attempt`` turns an evaluator that fails or crashes into the message of an infrastructure
failure (the controller retries it); ``audit_attempt`` reads the commands and the workspace diff and
zeroes the reward of a flagged rollout. No store: the controller records what these return.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from harnessrl.controller.attempt_files import STDOUT_FOR_EVALUATOR_BYTES, file_tail, log_tail
from harnessrl.controller.audit import AuditConfig, AuditReport, audit_rollout, reward_after_audit
from harnessrl.controller.audit.workspace import WorkspaceDiff
from harnessrl.controller.base import Exit, SandboxPaths
from harnessrl.controller.evaluators import EvaluationInput, EvaluationResult, Evaluator, EvaluatorError
from harnessrl.sandbox.rootfs import ImageRoot
from harnessrl.schemas import Call, Rollout
from harnessrl.trajectory.samples import CALLS_SEEN_KEY

log = logging.getLogger(__name__)


async def evaluate_attempt(
    evaluator: Evaluator,
    rollout: Rollout,
    exit_: Exit,
    calls: list[Call],
    *,
    workspace: Path,
    attempt_dir: Path,
    root: ImageRoot | None,
) -> EvaluationResult | str:
    """The evaluator's result, or the infrastructure failure it was (``"evaluator failed: ..."``)."""
    stdout_path = attempt_dir / "stdout.log"
    try:
        return await evaluator.evaluate(
            EvaluationInput(
                task=rollout.task,
                workspace=workspace,
                calls=calls,
                exit_code=exit_.exit_code,
                exit_kind=exit_.kind.value,
                stdout=await asyncio.to_thread(file_tail, stdout_path, STDOUT_FOR_EVALUATOR_BYTES),
                # None: the evaluator writes the full task (hidden fields included) to its own file
                task_file=None,
                rollout_id=rollout.rollout_id,
                environment=root,
            )
        )
    except EvaluatorError as exc:
        return f"evaluator failed: {exc}"
    except Exception as exc:  # a bug of ours must still end the rollout, never leave it running
        log.exception("rollout %s: the evaluator raised", rollout.rollout_id)
        return f"evaluator crashed: {type(exc).__name__}: {exc}"


async def audit_attempt(
    calls: list[Call],
    result: EvaluationResult,
    audit: AuditConfig,
    *,
    workspace: Path,
    inside: SandboxPaths | None,
    changes: WorkspaceDiff | None,
) -> tuple[AuditReport, float, list[str]]:
    """``(report, reward, flags)``: the audit's report, the evaluator's reward after it (0 when a rule
    in ``audit.zero_reward_on`` fired), and the scorer's and the audit's flags, in order."""
    report = await asyncio.to_thread(  # reading a workspace diff takes a while: off the event loop
        audit_rollout, calls, audit, workspace=seen_folders(workspace, inside), changes=changes
    )
    reward = reward_after_audit(float(result.reward), report, audit)
    flags = list(dict.fromkeys([*result.flags, *report.rules]))  # the scorer's and the audit's
    return report, reward, flags


def seen_folders(workspace: Path, inside: SandboxPaths | None) -> tuple[Path, ...]:
    """The folders the policy's commands may name as its own: the workspace and home as the harness
    saw them, and their host paths (a harness outside the sandbox, or a path read from a log)."""
    host = (workspace, workspace.parent / "home")
    return (*host, inside.workspace, inside.home) if inside is not None else host


def attempt_metadata(
    exit_: Exit,
    result: EvaluationResult,
    report: AuditReport,
    calls: list[Call],
    *,
    attempt_dir: Path,
    started: float,
    root: ImageRoot | None,
    image: str | None,
) -> dict[str, Any]:
    """The metadata finished with a scored attempt: how the harness exited, what the evaluator and the
    audit said, where its logs are, and how many calls were read (``started``: ``time.time()`` at
    launch)."""
    metadata: dict[str, Any] = {
        "exit": {"kind": exit_.kind.value, "code": exit_.exit_code, "detail": exit_.detail},
        "evaluation": result.details,
        "audit": [flag.model_dump() for flag in report.flags],
        "audit_files": {"changed": report.files_checked, "bounds": report.workspace_bounds},
        "reward_before_audit": float(result.reward),
        "log_dir": str(attempt_dir),
        "stderr_tail": log_tail(attempt_dir),
        "harness_seconds": round(time.time() - started, 3),
        # How many calls the evaluator and audit read: a call the gateway recorded after this
        # (its rollout not yet finished) is never trained on (trajectory.samples.CALLS_SEEN_KEY).
        CALLS_SEEN_KEY: len(calls),
    }
    if root is not None or image is not None:  # which image the harness and the scorer ran on
        metadata["environment"] = {
            "image": root.name if root is not None else image,
            "image_id": root.image_id[:12] if root is not None else None,
        }
    return metadata
