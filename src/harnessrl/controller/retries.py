"""Infrastructure failures: which exits are one, and whether an attempt that had one is retried.

An exit the harness's sandbox, the cluster or the evaluator caused (``outcome_for`` → ``None``) is
not the policy's doing: the rollout is requeued as a new attempt while ``max_infra_retries`` allows,
then failed with ``Outcome.INFRA_FAILURE`` (left out of its group's baseline). Policy failures are
never retried. Retries are counted in the rollout's metadata (``INFRA_FAILURES_KEY``).
"""

from __future__ import annotations

import asyncio
import logging

from harnessrl.controller.base import Exit, ExitKind
from harnessrl.controller.tamper import void_finished_elsewhere
from harnessrl.errors import InvalidTransition
from harnessrl.schemas import Outcome, Rollout, RolloutStatus
from harnessrl.store.base import Store

log = logging.getLogger(__name__)

#: The rollout metadata key counting its attempts that ended in an infrastructure failure (what
#: ``max_infra_retries`` bounds; attempts a shutdown or a requeue ended are not among them).
INFRA_FAILURES_KEY = "infra_failures"


def outcome_for(exit_: Exit) -> Outcome | None:
    """The outcome an exit implies before evaluation; ``None`` for an infrastructure failure."""
    if exit_.kind is ExitKind.INFRA:
        return None
    if exit_.kind is ExitKind.TIMEOUT:
        return Outcome.TIMEOUT
    if exit_.kind is ExitKind.EXITED and exit_.exit_code == 0:
        return Outcome.SUCCESS
    return Outcome.POLICY_FAILURE


async def retry_or_fail(
    store: Store, rollout: Rollout, error: str, *, max_retries: int, judge_ended: bool = True
) -> Rollout | None:
    """Retry as a new attempt while retries are left (returns None), else fail the rollout.
    A rollout someone else ended in this attempt meanwhile is judged by ``void_finished_elsewhere``
    unless ``judge_ended`` is off (after a store error: the end may be this controller's own
    write, committed before the error reached it).

    Retries are counted in the rollout's metadata (``INFRA_FAILURES_KEY``), not read off its
    attempt number: that one also counts the attempts a shutdown or a restarted trainer requeued,
    so a rollout interrupted twice failed for good at its first infrastructure failure."""
    log.warning("rollout %s attempt %d: %s", rollout.rollout_id, rollout.attempt, error)
    rollout_id = rollout.rollout_id
    try:
        current = await asyncio.to_thread(store.get_rollout, rollout_id)
        if current.status is not RolloutStatus.RUNNING or current.attempt != rollout.attempt:
            return await _ended_meanwhile(store, rollout, current, judge_ended)
        earlier = current.metadata.get(INFRA_FAILURES_KEY)
        failures = (earlier if isinstance(earlier, int) and earlier >= 0 else 0) + 1
        await asyncio.to_thread(store.update_rollout_metadata, rollout_id, {INFRA_FAILURES_KEY: failures})
        if failures <= max_retries:
            await asyncio.to_thread(store.requeue_rollout, rollout_id, error=error, attempt=rollout.attempt)
            return None
        return await asyncio.to_thread(
            store.finish_rollout,
            rollout_id,
            Outcome.INFRA_FAILURE,
            0.0,
            error=error,
            attempt=rollout.attempt,
        )
    except InvalidTransition:
        return await _ended_meanwhile(store, rollout, None, judge_ended)


async def _ended_meanwhile(store: Store, rollout: Rollout, current: Rollout | None, judge: bool) -> Rollout:
    if judge:
        return await void_finished_elsewhere(store, rollout)
    return current or await asyncio.to_thread(store.get_rollout, rollout.rollout_id)
