"""A rollout finished behind its controller's back is voided once: a second void of the same attempt
(the controller's failure path after its finish already voided it, a void retried after PostgreSQL
lost its COMMIT's answer) overwrote the first's record of the voided finish with the void's own
``policy_failure`` and 0, losing what the tampering finish had claimed, and warned of a second
tampering that never happened."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from harnessrl.controller.tamper import TAMPER_FINISHED, VOIDED_FINISH_KEY, void_finished_elsewhere
from harnessrl.schemas import Outcome, RolloutStatus
from harnessrl.store import open_store


def test_a_second_void_of_one_attempt_keeps_the_first_record_of_the_voided_finish(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    claimed = store.start_rollout(store.create_rollout(metadata={"infra_failures": 0}).rollout_id)
    # The agent, with a stolen admin key, finishes its own attempt with a reward it made up.
    store.finish_rollout(claimed.rollout_id, Outcome.SUCCESS, 1.0, metadata={"calls_seen": 0})
    with caplog.at_level(logging.WARNING, logger="harnessrl.controller.tamper"):
        first = asyncio.run(void_finished_elsewhere(store, claimed))
        second = asyncio.run(void_finished_elsewhere(store, claimed))
    assert first.status is RolloutStatus.FINISHED and first.reward == 0.0
    assert first.flags == [TAMPER_FINISHED]
    assert first.metadata == {"infra_failures": 0, VOIDED_FINISH_KEY: {"outcome": "success", "reward": 1.0}}
    assert second == first == store.get_rollout(claimed.rollout_id)
    assert len([r for r in caplog.records if "someone other than its controller" in r.getMessage()]) == 1


def test_a_tampering_finish_behind_a_reported_tamper_flag_is_still_voided(tmp_path: Path) -> None:
    """The flag a void adds is no proof of a void: a scorer may report any flag name (the controller
    stores them before its finish), and a finish behind it must not keep its reward."""
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    claimed = store.start_rollout(store.create_rollout().rollout_id)
    store.set_rollout_flags(claimed.rollout_id, [TAMPER_FINISHED])  # as a scorer reported it
    store.finish_rollout(
        claimed.rollout_id, Outcome.POLICY_FAILURE, 0.0, metadata={VOIDED_FINISH_KEY: {}, "calls_seen": 0}
    )
    voided = asyncio.run(void_finished_elsewhere(store, claimed))
    assert voided.metadata == {VOIDED_FINISH_KEY: {"outcome": "policy_failure", "reward": 0.0}}
    store.finish_rollout(  # and one with a reward: voided whatever flags it carries
        (other := store.start_rollout(store.create_rollout().rollout_id)).rollout_id, Outcome.SUCCESS, 1.0
    )
    store.set_rollout_flags(other.rollout_id, [TAMPER_FINISHED])
    assert asyncio.run(void_finished_elsewhere(store, other)).reward == 0.0
