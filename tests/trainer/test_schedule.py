"""Task schedule: deterministic groups, every task once per epoch, stable ids for resume."""

from __future__ import annotations

from harnessrl.schemas import Task
from harnessrl.trainer.schedule import TaskSchedule


def test_groups_are_deterministic_and_cover_each_epoch():
    tasks = [Task(task_id=f"t{i}") for i in range(5)]
    a, b = TaskSchedule(tasks, 3, seed=7), TaskSchedule(tasks, 3, seed=7)
    plans = [a.group(i) for i in range(10)]
    assert [p.task.task_id for p in plans] == [b.group(i).task.task_id for i in range(10)]
    assert sorted(p.task.task_id for p in plans[:5]) == [f"t{i}" for i in range(5)]
    assert sorted(p.task.task_id for p in plans[5:]) == [f"t{i}" for i in range(5)]
    assert plans[3].rollout_ids == ("g000003-r0", "g000003-r1", "g000003-r2")
    assert [p.task.task_id for p in plans] != [
        TaskSchedule(tasks, 3, seed=8).group(i).task.task_id for i in range(10)
    ]
