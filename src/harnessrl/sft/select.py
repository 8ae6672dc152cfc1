"""Which recorded rollouts are training data for ``harnessrl sft``: a pure filter with its reasons.

A rollout is kept when it finished (not failed for infrastructure, not cancelled, not running), has
a reward of at least ``min_reward``, no flag outside ``allow_flags``, and no audit finding at all.
The audit rule is absolute (issue 42: "a rollout the audit flagged is never training data"): a rollout
with any audit flag in its metadata, or any audit rule's name among its flags, is dropped whatever
``allow_flags`` says, even for ``outside_workspace``, which the audit records without zeroing the
reward: a teacher that reads outside its workspace is not behaviour to imitate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from harnessrl.controller.audit import ALL_RULES
from harnessrl.schemas import Rollout, RolloutStatus

#: Why a rollout was left out, in the order they are checked.
DROP_REASONS: tuple[str, ...] = ("not_finished", "no_reward", "audit_flagged", "flagged", "below_reward")


@dataclass(frozen=True)
class Selection:
    min_reward: float
    allow_flags: tuple[str, ...] = ()
    max_rollouts: int | None = None


@dataclass
class Selected:
    rollouts: list[Rollout]
    dropped: Counter[str] = field(default_factory=Counter)
    considered: int = 0

    def describe(self) -> str:
        """One line: how many were kept and why the others were not."""
        reasons = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(self.dropped.items()))
        return f"{len(self.rollouts)} of {self.considered} rollouts selected" + (
            f" (left out: {reasons})" if reasons else ""
        )


def audit_flagged(rollout: Rollout) -> bool:
    return bool(rollout.metadata.get("audit")) or any(flag in ALL_RULES for flag in rollout.flags)


def drop_reason(rollout: Rollout, selection: Selection) -> str | None:
    """Why ``rollout`` is not training data (one of ``DROP_REASONS``), or None if it is."""
    if rollout.status is not RolloutStatus.FINISHED:
        return "not_finished"
    if rollout.reward is None:
        return "no_reward"
    if audit_flagged(rollout):
        return "audit_flagged"
    if any(flag not in selection.allow_flags for flag in rollout.flags):
        return "flagged"
    if rollout.reward < selection.min_reward:
        return "below_reward"
    return None


def select_rollouts(rollouts: Iterable[Rollout], selection: Selection) -> Selected:
    out = Selected(rollouts=[])
    for rollout in rollouts:
        out.considered += 1
        reason = drop_reason(rollout, selection)
        if reason is not None:
            out.dropped[reason] += 1
        elif selection.max_rollouts is not None and len(out.rollouts) >= selection.max_rollouts:
            out.dropped["over_max_rollouts"] += 1
        else:
            out.rollouts.append(rollout)
    return out
