"""A rollout finished behind its controller's back: the finish is voided and the rollout flagged.

Only the controller running an attempt finishes it. One already finished or failed in that attempt
when the controller comes to end it was ended by someone else — the agent, with a stolen admin key —
and what it declared (a reward, or an ``infra_failure`` that would leave it out of its group's
baseline) must not count. ``void_finished_elsewhere`` keeps the claimed metadata, records the voided
finish under ``VOIDED_FINISH_KEY`` and voids the reward (0) with the flag ``TAMPER_FINISHED``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import Any

from harnessrl.schemas import Outcome, Rollout, RolloutStatus
from harnessrl.store.base import DROPPED_CALLS_KEY, Store

log = logging.getLogger(__name__)

TAMPER_FINISHED = "tamper_finished"  # the flag of a rollout finished behind its controller's back
#: The metadata key of a voided rollout holding the outcome and reward of the finish that was voided.
VOIDED_FINISH_KEY = "voided_finish"


async def void_finished_elsewhere(store: Store, rollout: Rollout) -> Rollout:
    """Only this controller finishes a rollout attempt it is running. One that is already
    finished or failed (not cancelled) in this attempt when the controller comes to end it was
    ended by someone else — the agent, with a stolen admin key: its reward is void (0) and it is
    flagged ``tamper_finished``. That includes an ``infra_failure`` it declared (status failed:
    left out of its group's baseline, which a failing policy prefers to a 0), and an end it wrote
    before making its attempt an infrastructure failure (the ended rollout refused the retry).
    A later attempt's result (a requeue superseded this one: a restarted trainer requeues what it
    finds running) is not this attempt's to judge."""
    rollout_id = rollout.rollout_id
    current = await asyncio.to_thread(store.get_rollout, rollout_id)
    ended = current.status in (RolloutStatus.FINISHED, RolloutStatus.FAILED)
    if not ended or current.attempt != rollout.attempt:
        return current
    # Its metadata as this attempt began (``rollout``, as claimed), with the gateway's count of
    # dropped calls: whatever the other finish merged in (``calls_seen = 0``, a mark that keeps it
    # out of training) would otherwise turn the void 0 into "not counted".
    kept = {**rollout.metadata, **{k: v for k, v in current.metadata.items() if k == DROPPED_CALLS_KEY}}
    if _voided_already(current, kept):
        # This controller's failure path after its finish voided it, a void retried after its
        # COMMIT's answer was lost, another controller: voiding the void again recorded its own
        # policy_failure and 0 as the voided finish, losing what the tampering finish claimed. Two
        # voids that both read the tampered row before either wrote write the same values.
        return current
    log.warning("rollout %s was finished by someone other than its controller: tampering", rollout_id)
    kept[VOIDED_FINISH_KEY] = {
        "outcome": current.outcome.value if current.outcome else None,
        "reward": current.reward,
    }
    return await asyncio.to_thread(
        functools.partial(
            store.void_rollout,
            rollout_id,
            flag=TAMPER_FINISHED,
            error=f"finished by someone other than its controller (reward {current.reward} voided)",
            metadata=jsonable(kept),
        )
    )


def _voided_already(current: Rollout, kept: dict[str, Any]) -> bool:
    """Whether ``current`` holds all a void with ``kept`` would write but its record of the voided
    finish. The flag alone is no proof: a scorer may report any flag name, so a tampering finish
    behind a scorer's ``tamper_finished`` would have kept its reward."""
    return (
        TAMPER_FINISHED in current.flags
        and current.status is RolloutStatus.FINISHED
        and current.outcome is Outcome.POLICY_FAILURE
        and current.reward == 0.0
        and VOIDED_FINISH_KEY in current.metadata
        and {k: v for k, v in current.metadata.items() if k != VOIDED_FINISH_KEY} == jsonable(kept)
    )


def jsonable(value: Any) -> Any:
    """``value`` as the store will hold it: JSON types only (anything else as its ``str``)."""
    return json.loads(json.dumps(value, default=str))
