"""A step that cannot be the policy's fault: every rollout ended the same way without the policy
being sampled once (the harness died before its first model call, or every attempt was an
infrastructure failure with the same error). Training on it would teach nothing and every later
step would fail alike, so the run stops with the reason instead of "training" on zeros.

A missing script, a harness that cannot import its own dependencies, a wrong model name the
gateway refuses, an evaluator that crashes on every workspace: each shows as one signature (exit
kind and code plus the tail of stderr, or the infrastructure error) shared by all the step's
rollouts, none of which made a model call. A policy that answers badly always makes calls, so it
never matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harnessrl.errors import HarnessRLError
from harnessrl.schemas import Outcome, Rollout

STOPPED_RUN_KEY = "stopped_run"  # rollout metadata: the reason a step of them stopped the run
#: rollout metadata: its attempt ran past ``trainer.rollout_deadline_s`` and the trainer cancelled it
#: (``fleet.RolloutBook``): ``{"attempt", "running_s", "deadline_s"}``
CANCELLED_STUCK_KEY = "cancelled_stuck"


class StepFailed(HarnessRLError):
    """Every rollout of a step failed the same way before the policy had a say."""


def failure_signature(rollout: Rollout, calls: Sequence[Any]) -> str | None:
    """How the rollout failed, in words equal across rollouts failing alike; None if the policy was
    sampled in its last attempt or it earned a reward (then the policy may be the cause)."""
    if rollout.reward or any(c.attempt == rollout.attempt for c in calls):
        return None
    if rollout.outcome is Outcome.INFRA_FAILURE:
        return f"infrastructure failure: {_same_for_all(rollout, rollout.error or 'no error recorded')}"
    stuck = rollout.metadata.get(CANCELLED_STUCK_KEY)
    if stuck:
        return (
            f"the harness was still running after trainer.rollout_deadline_s = {stuck.get('deadline_s')} s "
            "without a model call, and was cancelled"
        )
    exit_ = rollout.metadata.get("exit") or {}
    tail = _same_for_all(rollout, str(rollout.metadata.get("stderr_tail") or "")).strip()
    code = exit_.get("code")
    how = f"exit code {code}" if exit_.get("kind") in (None, "exited") else f"{exit_.get('kind')} ({code})"
    return f"the harness ended ({how}) without a model call; its stderr ends: {tail or '(empty)'}"


def common_failure(groups: Sequence[Any]) -> str | None:
    """The one way every rollout of a step's ``groups`` failed before the policy was sampled, or
    None. Needs two rollouts at least: "the same way" means something only then. A rollout whose
    final attempt's calls cannot be read (``Group.unreadable``) has call rows there: the policy was
    sampled, so it has no signature (its calls read as none would have given it one)."""
    signatures = [
        None
        if rollout.rollout_id in getattr(group, "unreadable", {})
        else failure_signature(rollout, group.calls.get(rollout.rollout_id, ()))
        for group in groups
        for rollout in group.rollouts
    ]
    if len(signatures) < 2 or None in signatures or len(set(signatures)) != 1:
        return None
    return f"all {len(signatures)} rollouts of the step failed the same way: {signatures[0]}"


def _same_for_all(rollout: Rollout, text: str) -> str:
    """``text`` with what differs between rollouts of one failure (their ids, their folders) masked."""
    for own, mask in (
        (str(rollout.metadata.get("log_dir") or ""), "<attempt>"),
        (rollout.rollout_id, "<rollout>"),
        (rollout.group_id or "", "<group>"),
    ):
        if own:
            text = text.replace(own, mask)
    return text
