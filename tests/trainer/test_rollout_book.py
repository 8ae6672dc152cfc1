"""``RolloutBook``: completed groups are found from events and the open rollouts alone, never by
scanning the run, however many rollouts it already finished; an attempt running past the deadline
is cancelled and marked, so a group never waits forever on it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Any

import pytest

from harnessrl.schemas import Outcome, RolloutStatus, Task
from harnessrl.store import open_store
from harnessrl.trainer.fleet import RolloutBook, RolloutIdTaken
from harnessrl.trainer.schedule import EVAL_KIND, TRAIN_KIND, TaskSchedule

RUN = "run"
TASKS = [Task(task_id=f"t{i}", split="train", data={"prompt": f"task {i}"}) for i in range(3)]


class CountingStore:
    """The store, counting every call and every rollout row it hands back."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()
        self.rows = 0
        self.rollouts_read: set[str] = set()  # ids given to get_rollout

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name == "get_rollout":
                self.rollouts_read.add(args[0])
            out = attr(*args, **kwargs)
            self.rows += len(out) if isinstance(out, list) else 1
            return out

        return counted

    def reset(self) -> None:
        self.calls.clear()
        self.rows = 0
        self.rollouts_read.clear()


def finish(store: Any, rollout_ids: list[str], reward: float = 1.0) -> None:
    claimed = {r.rollout_id for r in store.claim_rollouts("w", len(rollout_ids), run_id=RUN)}
    assert set(rollout_ids) <= claimed
    for rollout_id in rollout_ids:
        store.finish_rollout(rollout_id, Outcome.SUCCESS, reward)


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store whose run already finished (and trained) 10,000 rollouts."""
    path = str(tmp_path_factory.mktemp("book") / "store.db")
    store = open_store(path)
    store.create_run(RUN)
    old = TaskSchedule(TASKS, 10, seed=0)
    for index in range(1000):
        plan = old.group(index)
        for rollout_id, task in plan.members:
            store.create_rollout(
                rollout_id=rollout_id,
                task=task.data,
                run_id=RUN,
                task_id=task.task_id,
                group_id=plan.group_id,
                step=index,
                metadata={"kind": TRAIN_KIND},
            )
    for rollout in store.claim_rollouts("w", 10_000, run_id=RUN):
        store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 1.0)
    assert store.count_rollouts(run_id=RUN) == 10_000
    store.close()
    return path


def test_completion_reads_only_the_open_rollouts_of_a_long_run(long_run: str):
    store = CountingStore(open_store(long_run))
    book = RolloutBook(store, RUN, poll_s=0.05)  # a fast timer: many wake-ups, each must stay cheap
    schedule = TaskSchedule(TASKS, 2, seed=1)
    plans = [schedule.group(1000 + i) for i in range(2)]

    async def idle_ticks(reads: int) -> None:
        """Until the book has re-read open rollouts ``reads`` more times (a tick reads each once)."""
        target = store.calls["get_rollout"] + reads
        while store.calls["get_rollout"] < target:
            await asyncio.sleep(0.01)

    async def main() -> list[Any]:
        await book.submit(plans)
        store.reset()
        waiter = asyncio.create_task(book.completed(2))
        for plan in plans:  # the groups end one after the other, with idle ticks in between
            await idle_ticks(3 * 4)
            await asyncio.to_thread(finish, store._store, list(plan.rollout_ids))
        return await asyncio.wait_for(waiter, 600)

    groups = asyncio.run(main())
    assert [g.group_id for g in groups] == [p.group_id for p in plans]
    assert all(len(g.rollouts) == 2 and all(r.reward == 1.0 for r in g.rollouts) for g in groups)
    # No read of the run as a whole: only single rollouts and their calls.
    assert set(store.calls) <= {"get_rollout", "list_calls"}, store.calls
    # Every tick read only the open groups' rollouts, each one row: never the 10,000 finished ones.
    assert store.rollouts_read == {r for plan in plans for r in plan.rollout_ids}
    assert store.rows == store.calls["get_rollout"], (store.calls, store.rows)  # no call was recorded

    # Control: the probe does notice a scan of the run (recovery reads it once, at start-up).
    store.reset()
    assert asyncio.run(book.recover(lambda created: [], policy_version=0)) == 1002
    assert store.calls["list_rollouts"] == 2 and store.rows > 10_000


def test_a_notify_wakes_the_wait_at_once(long_run: str):
    store = open_store(long_run)
    book = RolloutBook(store, RUN, poll_s=3600.0)  # the timer alone would take an hour
    plan = TaskSchedule(TASKS, 2, seed=2).group(2000)

    async def main() -> list[Any]:
        await book.submit([plan])
        waiter = asyncio.create_task(book.completed(1))
        await asyncio.to_thread(finish, store, list(plan.rollout_ids))
        # Before or after the waiter started waiting, a notify wakes it: it stays set until read.
        book.notify(plan.rollout_ids[-1])
        return await asyncio.wait_for(waiter, 600)  # a guard against a hang, not a timing

    [group] = asyncio.run(main())
    assert group.group_id == plan.group_id


def test_top_up_is_asked_on_every_wake_and_open_groups_are_counted(long_run: str):
    store = open_store(long_run)
    book = RolloutBook(store, RUN, poll_s=0.05)
    schedule = TaskSchedule(TASKS, 2, seed=3)
    created: list[str] = []

    full = asyncio.Event()  # the admission policy said "no more" at least once

    def top_up() -> list[Any]:
        if book.open_groups >= 2:  # the admission policy under test: two groups open at most
            full.set()
            return []
        plan = schedule.group(3000 + len(created))
        created.append(plan.group_id)
        return [plan]

    async def main() -> list[Any]:
        waiter = asyncio.create_task(book.completed(1, top_up=top_up))
        await asyncio.wait_for(full.wait(), 600)
        assert book.open_groups == 2 and book.in_flight == 4
        await asyncio.to_thread(finish, store, [f"{created[0]}-r0", f"{created[0]}-r1"])
        return await asyncio.wait_for(waiter, 10)

    [group] = asyncio.run(main())
    assert group.group_id == created[0] and len(created) == 2
    assert book.open_groups == 1 and book.in_flight == 2


def test_resume_leaves_out_groups_that_failed_before_sampling_and_survives_a_half_created_one(tmp_path):
    store = open_store(str(tmp_path / "store.db"))
    store.create_run(RUN)
    book = RolloutBook(store, RUN)
    schedule = TaskSchedule(TASKS, 2, seed=4)
    broken, scored, half = (schedule.group(i) for i in range(3))
    for plan in (broken, scored):
        asyncio.run(book.submit([plan]))
    store.create_rollout(rollout_id=half.rollout_ids[0], run_id=RUN, group_id=half.group_id)  # killed here
    for rollout in store.claim_rollouts("w", 10, run_id=RUN):
        reward = 0.0 if rollout.group_id == broken.group_id else 1.0
        store.finish_rollout(
            rollout.rollout_id, Outcome.POLICY_FAILURE, reward, metadata={"exit": {"code": 1}}
        )
    # The broken group never called the model (reward 0, no calls): it teaches nothing.
    assert book.failed_before_sampling([broken, scored, half]) == {broken.group_id}
    store.close()


def test_an_attempt_running_past_the_deadline_is_cancelled_marked_and_counted(tmp_path):
    from harnessrl.algorithms.config import AlgorithmConfig
    from harnessrl.schemas import RolloutStatus
    from harnessrl.trainer.config import TrainerSection
    from harnessrl.trainer.step import prepare_step

    store = open_store(str(tmp_path / "store.db"))
    store.create_run(RUN)
    now = [0.0]  # the book's clock, moved by hand
    book = RolloutBook(store, RUN, poll_s=3600.0, deadline_s=60.0, clock=lambda: now[0])
    stuck, done, queued = (TaskSchedule(TASKS, 2, seed=5).group(i) for i in range(3))

    async def main() -> list[Any]:
        await book.submit([stuck, done])
        claimed = store.claim_rollouts("w", 4, run_id=RUN)
        assert len(claimed) == 4
        await book.submit([queued])  # never claimed: a queued rollout is not stuck
        started = max(r.started_at for r in claimed)
        store.finish_rollout(stuck.rollout_ids[1], Outcome.SUCCESS, 1.0)
        for rollout_id in done.rollout_ids:
            store.finish_rollout(rollout_id, Outcome.SUCCESS, 0.5)
        now[0] = started + 59.0  # within the deadline: the stuck group stays open
        book.notify()
        first = await asyncio.wait_for(book.completed(1), 600)
        assert [g.group_id for g in first] == [done.group_id]
        assert store.get_rollout(stuck.rollout_ids[0]).status is RolloutStatus.RUNNING
        now[0] = started + 61.0
        book.notify()
        return await asyncio.wait_for(book.completed(1), 600)

    [group] = asyncio.run(main())
    assert group.group_id == stuck.group_id
    cancelled = store.get_rollout(stuck.rollout_ids[0])
    assert cancelled.status is RolloutStatus.CANCELLED
    assert cancelled.metadata["cancelled_stuck"]["deadline_s"] == 60.0
    assert {r.status for r in store.list_rollouts(run_id=RUN) if r.group_id == queued.group_id} == {
        RolloutStatus.QUEUED
    }
    metrics = prepare_step([group], 0, TrainerSection(), AlgorithmConfig()).metrics
    assert metrics["rollouts/cancelled_stuck"] == 1 and metrics["rollouts/no_reward"] == 1
    store.close()


def test_waiting_for_an_evaluation_keeps_admitting_training_groups(tmp_path):
    # A store of its own: ``finish`` claims the oldest queued rollouts, and the shared long run may
    # hold other tests' unfinished ones.
    store = open_store(str(tmp_path / "store.db"))
    store.create_run(RUN)
    book = RolloutBook(store, RUN, poll_s=0.05)
    schedule = TaskSchedule(TASKS, 2, seed=4)
    evaluation = dataclasses.replace(schedule.group(4000), kind=EVAL_KIND)
    created: list[str] = []

    def top_up() -> list[Any]:
        if book.open_groups >= 2:
            return []
        plan = schedule.group(4001 + len(created))
        created.append(plan.group_id)
        return [plan]

    async def main() -> Any:
        await book.submit([evaluation])
        waiter = asyncio.create_task(book.finished(evaluation, top_up=top_up))

        async def admitted() -> None:
            while len(created) < 2:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(admitted(), 60)  # admitted while the evaluation is still running
        assert not waiter.done()
        await asyncio.to_thread(finish, store, list(evaluation.rollout_ids))
        return await asyncio.wait_for(waiter, 600)

    group = asyncio.run(main())
    assert group.group_id == evaluation.group_id
    assert book.open_groups == 2 and book.in_flight == 4  # the evaluation's rollouts are not counted


def finish_run(store: Any, run_id: str, reward: float) -> None:
    """Every queued rollout of ``run_id`` claimed and finished with ``reward``."""
    for rollout in store.claim_rollouts("w", 100, run_id=run_id):
        store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, reward)


def schedule_of(book: RolloutBook, seed: int) -> TaskSchedule:
    """The run's schedule, its ids chosen as ``Trainer.run`` chooses them."""
    return TaskSchedule(TASKS, 2, seed=seed, id_prefix=book.rollout_id_prefix())


def test_two_runs_on_one_store_each_get_and_train_their_own_rollouts(tmp_path):
    # docs/store.md: a store may hold many runs. The second run used to create nothing (its ids were
    # the first run's, and create_rollout is idempotent per id) and train on the first run's rows.
    store = open_store(str(tmp_path / "store.db"))
    store.create_run("a")
    store.create_run("b")
    book_a, book_b = RolloutBook(store, "a", poll_s=0.05), RolloutBook(store, "b", poll_s=0.05)
    plan_a = schedule_of(book_a, seed=0).group(0)
    asyncio.run(book_a.submit([plan_a]))
    finish_run(store, "a", reward=1.0)
    plan_b = schedule_of(book_b, seed=123).group(0)
    asyncio.run(book_b.submit([plan_b]))
    assert store.count_rollouts(run_id="b") == 2
    assert not set(plan_a.rollout_ids) & set(plan_b.rollout_ids)
    finish_run(store, "b", reward=0.0)

    [group] = asyncio.run(asyncio.wait_for(book_b.completed(1), 600))
    assert {r.run_id for r in group.rollouts} == {"b"} and {r.reward for r in group.rollouts} == {0.0}
    asyncio.run(book_b.record_trained(1, [group], {}))
    assert all("trained_at_step" not in r.metadata for r in store.list_rollouts(run_id="a"))
    store.close()


def test_a_rollout_id_taken_by_another_run_is_refused_not_shared(tmp_path):
    # Whatever made two runs plan one id (here both plan the bare ids of runs created before ids
    # had the run's name), the second run must not silently adopt the first run's rollouts.
    store = open_store(str(tmp_path / "store.db"))
    store.create_run("a")
    store.create_run("b")
    plan = TaskSchedule(TASKS, 2, seed=0).group(0)
    asyncio.run(RolloutBook(store, "a").submit([plan]))
    with pytest.raises(RolloutIdTaken, match=r"taken in the store by run 'a'"):
        asyncio.run(RolloutBook(store, "b").submit([plan]))
    assert store.count_rollouts(run_id="b") == 0
    # Another task under an id of this run (a schedule that changed since) is refused as well.
    another_task = next(t for t in TASKS if t.task_id != plan.task.task_id)
    other = dataclasses.replace(plan, members=tuple((rid, another_task) for rid in plan.rollout_ids))
    with pytest.raises(RolloutIdTaken, match=f"task {another_task.task_id!r}"):
        asyncio.run(RolloutBook(store, "a").submit([other]))
    asyncio.run(RolloutBook(store, "a").submit([plan]))  # control: its own rows are found again
    store.close()


def test_a_run_created_with_bare_rollout_ids_resumes_on_its_own_rows(tmp_path):
    # A run created before rollout ids had the run's name: its rows are g000000-r0, ... and eval-...;
    # its --resume must find them (not create a second set under new ids).
    store = open_store(str(tmp_path / "store.db"))
    store.create_run("old")
    store.create_run("new")
    bare = TaskSchedule(TASKS, 2, seed=0)
    asyncio.run(RolloutBook(store, "old").submit([bare.group(0), bare.group(1)]))
    finish_run(store, "old", reward=1.0)

    book = RolloutBook(store, "old", poll_s=0.05)
    assert book.rollout_id_prefix() == ""
    resumed = schedule_of(book, seed=0)
    reopen = lambda created: [resumed.group(i) for i in range(created)]  # noqa: E731
    assert asyncio.run(book.recover(reopen, policy_version=0)) == 2
    groups = asyncio.run(asyncio.wait_for(book.completed(2), 600))
    assert [g.group_id for g in groups] == ["g000000", "g000001"]
    assert {r.rollout_id for g in groups for r in g.rollouts} == {
        r.rollout_id for r in store.list_rollouts(run_id="old")
    }
    assert store.count_rollouts(run_id="old") == 4
    # A new run on the same store is not mistaken for an old one.
    assert RolloutBook(store, "new").rollout_id_prefix() == "new-"
    store.close()


def test_evaluations_after_the_checkpoint_are_retired_and_redone_under_new_ids(tmp_path):
    # A kill between publishing step 2's weights and its checkpoint being whole: the resumed run
    # (from step 1) must not read back step 2's evaluation, nor run its queued rollouts for nothing.
    store = open_store(str(tmp_path / "store.db"))
    store.create_run(RUN)
    schedule = TaskSchedule(TASKS, 2, seed=0, id_prefix="run-")
    book = RolloutBook(store, RUN)
    kept, lost = (schedule.evaluation(s, TASKS[:2], schedule.sampling) for s in (1, 2))
    asyncio.run(book.submit([kept, lost]))
    finish(store, [*kept.rollout_ids, lost.rollout_ids[0]])  # the other of step 2's stays queued

    assert book.retire_evaluations(1) == {2: 1}
    finished, queued = (store.get_rollout(rid) for rid in lost.rollout_ids)
    assert finished.status is RolloutStatus.FINISHED and queued.status is RolloutStatus.CANCELLED
    assert all("sampled_by_discarded_weights" in r.metadata for r in (finished, queued))
    assert all(  # control: the checkpoint's own evaluation stands
        "sampled_by_discarded_weights" not in store.get_rollout(rid).metadata for rid in kept.rollout_ids
    )
    schedule.redo_evaluations({2: 1})
    redo = schedule.evaluation(2, TASKS[:2], schedule.sampling)
    assert redo.group_id == "eval-s00002-redo1" and redo.rollout_ids[0] == "run-eval-s00002-redo1-t0000"
    asyncio.run(book.submit([redo]))
    assert book.retire_evaluations(1) == {2: 2}  # killed again in the same window: the next redo
    store.close()


class MovesOnAfterRead:
    """The store the book uses, with another process's write landing right after one read: ``after``
    runs (once) when ``method`` has returned, as an external controller's write would between the
    book's read and its own write. Deterministic: no sleep, no second thread."""

    def __init__(self, store: Any, method: str, after: Any) -> None:
        self._store, self._method, self._after = store, method, after

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name != self._method:
            return attr

        def read_then_move_on(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            if self._after is not None:
                after, self._after = self._after, None
                after()
            return out

        return read_then_move_on


def _running_plan(store: Any, seed: int) -> Any:
    """A group of two rollouts, both claimed (running at attempt 0) by a controller."""
    plan = TaskSchedule(TASKS, 2, seed=seed).group(0)
    asyncio.run(RolloutBook(store, RUN).submit([plan]))
    assert len(store.claim_rollouts("w", 2, run_id=RUN)) == 2
    return plan


@pytest.mark.parametrize("how", ["shutdown", "resume"])
def test_a_rollout_finished_elsewhere_after_the_listing_is_kept_and_the_rest_requeued(tmp_path, how):
    """``requeue_running`` (the run's shutdown) and ``recover`` (a resume) list the running rollouts,
    then requeue them one by one: an external controller finishing one in between neither loses its
    result nor stops the others going back to the queue (it raised ``InvalidTransition``)."""
    path = str(tmp_path / "store.db")
    store, controller = open_store(path), open_store(path)  # the controller: another process's handle
    store.create_run(RUN)
    plan = _running_plan(store, seed=6)
    done, left = plan.rollout_ids

    def controller_finishes() -> None:
        controller.finish_rollout(done, Outcome.SUCCESS, 1.0, attempt=0)

    book = RolloutBook(MovesOnAfterRead(store, "list_rollouts", controller_finishes), RUN)
    if how == "shutdown":
        book.requeue_running("run stopped")
    else:
        assert asyncio.run(book.recover(lambda created: [], policy_version=0)) == 1
    finished = store.get_rollout(done)
    assert (finished.status, finished.reward, finished.attempt) == (RolloutStatus.FINISHED, 1.0, 0)
    requeued = store.get_rollout(left)
    assert (requeued.status, requeued.attempt) == (RolloutStatus.QUEUED, 1)
    store.close()
    controller.close()


def test_a_stuck_attempt_requeued_and_claimed_again_after_the_read_is_not_cancelled(tmp_path):
    """The deadline check reads a rollout running past the deadline, then cancels it: an attempt a
    requeue and a fresh claim started in between is not the stuck one, and keeps running."""
    path = str(tmp_path / "store.db")
    store, controller = open_store(path), open_store(path)
    store.create_run(RUN)
    plan = _running_plan(store, seed=7)
    stuck, other = plan.rollout_ids
    started = max(store.get_rollout(rollout_id).started_at for rollout_id in plan.rollout_ids)

    def controller_retries() -> None:  # its harness died: the controller retries the rollout at once
        controller.requeue_rollout(stuck, error="sandbox died", attempt=0)
        assert [r.rollout_id for r in controller.claim_rollouts("w2", 1, run_id=RUN)] == [stuck]

    wrapped = MovesOnAfterRead(store, "get_rollout", controller_retries)
    book = RolloutBook(wrapped, RUN, poll_s=3600.0, deadline_s=60.0, clock=lambda: started + 61.0)
    asyncio.run(book.submit([plan]))
    book._refresh()
    fresh = store.get_rollout(stuck)
    assert (fresh.status, fresh.attempt) == (RolloutStatus.RUNNING, 1)
    assert "cancelled_stuck" not in fresh.metadata
    assert store.get_rollout(other).status is RolloutStatus.CANCELLED  # its attempt was the stuck one
    assert book.in_flight == 1  # the retried rollout is still awaited
    store.close()
    controller.close()
