"""A rollout row the store cannot decode (its ``task``/``flags``/``metadata`` damaged by a disk or a
bad writer: ``RolloutUnreadable``) never stops a training run nor its resume: the trainer's book
treats it as an infrastructure failure of that one rollout, left out of its group (and of its
group's baseline), counted in ``rollouts/row_unreadable`` and logged. Real SQLite stores, damaged
with ``sqlite3`` as a disk or a bad writer might, beside undamaged control rows."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.schemas import Call, Outcome, RolloutStatus, Task
from harnessrl.store import open_store
from harnessrl.store.base import Store
from harnessrl.store.damage import RolloutUnreadable
from harnessrl.trainer.config import TrainerSection
from harnessrl.trainer.failures import common_failure
from harnessrl.trainer.fleet import RolloutBook
from harnessrl.trainer.schedule import GroupPlan, TaskSchedule
from harnessrl.trainer.step import prepare_step

RUN = "run"
TASKS = [Task(task_id="t0", split="train", data={"prompt": "task 0"})]


def call(rollout_id: str, token: int) -> Call:
    return Call(
        rollout_id=rollout_id,
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[token, token + 1],
        response_logprobs=[-0.5, -0.25],
        request={"messages": [{"role": "user", "content": "hi"}]},
        response={},
    )


def damage(db: Path, rollout_id: str, column: str = "metadata") -> None:
    with sqlite3.connect(db) as conn:
        changed = conn.execute(
            f"UPDATE rollouts SET {column} = '{{damaged' WHERE rollout_id = ?", (rollout_id,)
        ).rowcount
    assert changed == 1


def start_group(db: Path, size: int) -> tuple[Store, RolloutBook, GroupPlan]:
    store = open_store(str(db))
    store.create_run(RUN)
    plan = TaskSchedule(TASKS, size, seed=0).group(0)
    book = RolloutBook(store, RUN, poll_s=0.05)
    asyncio.run(book.submit([plan]))
    assert len(store.claim_rollouts("w", size, run_id=RUN)) == size
    for k, rollout_id in enumerate(plan.rollout_ids):
        store.add_call(call(rollout_id, 10 + k))
    return store, book, plan


@pytest.mark.parametrize("ended", [True, False], ids=["damaged-after-it-ended", "damaged-while-running"])
def test_a_damaged_rollout_row_is_left_out_of_its_step_counted_and_named(tmp_path, caplog, ended):
    db = tmp_path / "store.db"
    store, book, plan = start_group(db, 3)
    broken, low, high = plan.rollout_ids
    if ended:
        store.finish_rollout(broken, Outcome.SUCCESS, 1.0)
    store.finish_rollout(low, Outcome.SUCCESS, 0.0)
    store.finish_rollout(high, Outcome.SUCCESS, 1.0)
    damage(db, broken, "task")
    with pytest.raises(RolloutUnreadable):  # the control: the row really cannot be read
        store.get_rollout(broken)

    # Raised JSONDecodeError from the book's re-read (and never completed the group while running).
    [group] = asyncio.run(asyncio.wait_for(book.completed(1), 60))
    assert [r.rollout_id for r in group.rollouts] == [low, high]
    assert set(group.rows_unreadable) == {broken}
    assert f"rollout {broken}" in group.rows_unreadable[broken] and "task" in group.rows_unreadable[broken]
    assert any(broken in record.getMessage() for record in caplog.records)

    batch = prepare_step([group], 0, TrainerSection(), AlgorithmConfig())
    advantages = {s.rollout_id: s.advantage for s in batch.samples}
    # Out of its group's baseline: the other two are rewards [0, 1] alone (a baseline of 1/2).
    assert set(advantages) == {low, high} and advantages[high] == pytest.approx(-advantages[low])
    assert batch.metrics["rollouts/row_unreadable"] == 1 and batch.metrics["rollouts/total"] == 2
    assert batch.metrics["reward/mean"] == pytest.approx(0.5)
    assert common_failure([group]) is None

    asyncio.run(book.record_trained(1, [group], advantages))
    assert store.get_rollout(low).metadata["trained_at_step"] == 1
    store.close()


def test_a_resume_goes_on_past_damaged_rollout_rows(tmp_path):
    db = tmp_path / "store.db"
    store, book, plan = start_group(db, 4)
    done, running, broken_done, broken_running = plan.rollout_ids
    store.finish_rollout(done, Outcome.SUCCESS, 1.0)
    store.finish_rollout(broken_done, Outcome.SUCCESS, 1.0)
    damage(db, broken_done, "metadata")
    damage(db, broken_running, "flags")
    with pytest.raises(RolloutUnreadable):  # the control: what the old listing raised on
        store.get_rollout(broken_running)

    # The dead process's book is gone; a resumed run lists the run (every row, raised
    # JSONDecodeError), requeues what was left running, recreates the group (create_rollout of a
    # damaged id raised) and checks it for weights a kill discarded.
    resumed = RolloutBook(store, RUN, poll_s=0.05)
    assert asyncio.run(resumed.recover(lambda created: [plan] if created else [], policy_version=0)) == 1
    assert resumed.open_groups == 1
    assert store.get_rollout(running).status is RolloutStatus.QUEUED  # requeued: the control row
    assert store.get_rollout(done).status is RolloutStatus.FINISHED

    [claimed] = store.claim_rollouts("w2", 4, run_id=RUN)
    assert claimed.rollout_id == running
    store.finish_rollout(running, Outcome.SUCCESS, 0.0)
    [group] = asyncio.run(asyncio.wait_for(resumed.completed(1), 60))
    assert [r.rollout_id for r in group.rollouts] == [done, running]
    assert set(group.rows_unreadable) == {broken_done, broken_running}
    batch = prepare_step([group], 0, TrainerSection(), AlgorithmConfig())
    assert batch.metrics["rollouts/row_unreadable"] == 2

    resumed.requeue_running("run over")  # listed the run again at its end
    assert resumed.retire_evaluations(after_step=0) == {}
    store.close()


def test_a_group_whose_readable_rollouts_failed_before_sampling_stays_left_out(tmp_path):
    """A resume leaves out a group that stopped the run because its rollouts failed before the
    policy was sampled; a damaged row beside them (left out of the step too) does not reopen it, or
    the run would stop on it again at every resume."""
    db = tmp_path / "store.db"
    store = open_store(str(db))
    store.create_run(RUN)
    plan = TaskSchedule(TASKS, 3, seed=0).group(0)
    book = RolloutBook(store, RUN, poll_s=0.05)
    asyncio.run(book.submit([plan]))
    assert len(store.claim_rollouts("w", 3, run_id=RUN)) == 3
    for rollout_id in plan.rollout_ids:  # no call: the harness never reached the model
        store.finish_rollout(rollout_id, Outcome.INFRA_FAILURE, 0.0, metadata={"exit": {"code": 1}})
    assert book.failed_before_sampling([plan]) == {plan.group_id}  # the control: undamaged
    damage(db, plan.rollout_ids[0], "metadata")
    assert book.failed_before_sampling([plan]) == {plan.group_id}  # raised JSONDecodeError
    damage(db, plan.rollout_ids[1], "metadata")
    damage(db, plan.rollout_ids[2], "metadata")
    assert book.failed_before_sampling([plan]) == set()  # nothing readable: nothing says it failed
    store.close()
