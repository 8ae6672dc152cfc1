"""A call row the store cannot decode (``store.codecs`` refuses to guess what a damaged row held)
never crashes a training run or its resume. A damaged row of an earlier, retried attempt costs
nothing (a step trains only the final attempt's calls); a damaged row of the final attempt leaves
that one rollout out of its step, counted and named, like an infrastructure failure (out of its
group's baseline). Real SQLite stores, damaged with ``sqlite3`` as a disk or a bad writer might."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.schemas import Call, Outcome, Task
from harnessrl.store import open_store
from harnessrl.trainer.config import TrainerSection
from harnessrl.trainer.failures import common_failure
from harnessrl.trainer.fleet import RolloutBook
from harnessrl.trainer.schedule import TaskSchedule
from harnessrl.trainer.step import prepare_step

RUN = "run"
TASKS = [Task(task_id="t0", split="train", data={"prompt": "task 0"})]


def call(rollout_id: str, attempt: int, token: int) -> Call:
    return Call(
        rollout_id=rollout_id,
        attempt=attempt,
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[token, token + 1],
        response_logprobs=[-0.5, -0.25],
        request={"messages": [{"role": "user", "content": "hi"}]},
        response={},
    )


def damage(db: Path, rollout_id: str, attempt: int) -> None:
    with sqlite3.connect(db) as conn:
        changed = conn.execute(
            "UPDATE calls SET response = '{damaged' WHERE rollout_id = ? AND attempt = ?",
            (rollout_id, attempt),
        ).rowcount
    assert changed == 1


def run_group(db: Path, rewards: list[float], *, damaged: dict[int, int]) -> tuple[Any, RolloutBook, Any]:
    """One group of ``len(rewards)`` rollouts: rollout k made a call in attempt 0; those in
    ``damaged`` (k -> attempt) had that attempt's row damaged. A damaged attempt 0 whose final attempt
    is 1 was retried (an infrastructure failure) and attempt 1 called and finished."""
    store = open_store(str(db))
    store.create_run(RUN)
    plan = TaskSchedule(TASKS, len(rewards), seed=0).group(0)
    book = RolloutBook(store, RUN, poll_s=0.05)
    asyncio.run(book.submit([plan]))
    assert len(store.claim_rollouts("w", len(rewards), run_id=RUN)) == len(rewards)
    for k, (rollout_id, reward) in enumerate(zip(plan.rollout_ids, rewards, strict=True)):
        store.add_call(call(rollout_id, 0, 10 + k))
        final = damaged.get(k, 0)
        if final == 1:  # attempt 0 retried: its row gets damaged below, attempt 1 calls and scores
            store.requeue_rollout(rollout_id, error="evaluator failed: x", attempt=0)
            [claimed] = store.claim_rollouts("w", 1, run_id=RUN)
            assert claimed.rollout_id == rollout_id
            store.add_call(call(rollout_id, 1, 20 + k))
            damage(db, rollout_id, 0)
        elif k in damaged:
            damage(db, rollout_id, 0)
        store.finish_rollout(rollout_id, Outcome.SUCCESS, reward, attempt=final)
    return store, book, plan


def test_a_damaged_row_of_an_earlier_attempt_never_stops_the_step_nor_the_resume(tmp_path):
    db = tmp_path / "store.db"
    store, book, plan = run_group(db, [1.0, 0.0], damaged={0: 1})
    retried = plan.rollout_ids[0]
    with pytest.raises(ValueError):  # the control: the row really cannot be read, all attempts at once
        store.list_calls(retried)

    [group] = asyncio.run(asyncio.wait_for(book.completed(1), 60))  # raised JSONDecodeError
    assert group.unreadable == {}
    assert [c.attempt for c in group.calls[retried]] == [1]  # the final attempt's, all the step uses
    batch = prepare_step([group], 0, TrainerSection(), AlgorithmConfig())
    advantages = {s.rollout_id: s.advantage for s in batch.samples}
    assert advantages[retried] > 0 > advantages[plan.rollout_ids[1]]
    assert batch.metrics["rollouts/calls_unreadable"] == 0

    # The resume's dead-group check read every attempt too (the run could never resume).
    assert book.failed_before_sampling([plan]) == set()
    store.close()


def test_a_damaged_row_of_the_final_attempt_leaves_that_rollout_out_counted_and_named(tmp_path):
    db = tmp_path / "store.db"
    store, book, plan = run_group(db, [1.0, 0.0, 1.0], damaged={0: 0})
    broken, low, high = plan.rollout_ids

    [group] = asyncio.run(asyncio.wait_for(book.completed(1), 60))
    assert set(group.unreadable) == {broken}
    assert "cannot be read" in group.unreadable[broken] and "JSONDecodeError" in group.unreadable[broken]
    batch = prepare_step([group], 0, TrainerSection(), AlgorithmConfig())
    advantages = {s.rollout_id: s.advantage for s in batch.samples}
    # Out of its group's baseline: the other two are rewards [0, 1] alone (a baseline of 1/2).
    assert set(advantages) == {low, high} and advantages[high] == pytest.approx(-advantages[low])
    assert batch.metrics["rollouts/calls_unreadable"] == 1 and batch.metrics["rollouts/total"] == 3
    assert batch.metrics["reward/mean"] == pytest.approx(0.5)
    assert common_failure([group]) is None  # it called the model: never "failed before sampling"

    asyncio.run(book.record_trained(1, [group], advantages))
    marked = store.get_rollout(broken).metadata
    assert marked["trained_at_step"] == 1 and marked["advantage"] is None
    assert "JSONDecodeError" in marked["calls_unreadable"]
    assert "calls_unreadable" not in store.get_rollout(low).metadata

    # A resume reading the same group: neither the dead-group check nor the check for weights a kill
    # discarded (each read the final attempt's calls) stops it; the group is reopened.
    assert book.failed_before_sampling([plan]) == set()
    resumed = RolloutBook(store, RUN, poll_s=0.05)
    assert asyncio.run(resumed.recover(lambda created: [plan], policy_version=0)) == 1
    assert resumed.open_groups == 1
    store.close()
