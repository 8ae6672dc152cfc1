"""Which tasks get rolled out, in which order, under which ids: deterministic, so a resumed run
creates exactly the rollouts the crashed one would have (``create_rollout`` is idempotent per id).

Groups are numbered 0, 1, 2, ... in creation order; group ``g`` is task ``order[g % N]`` where
``order`` is a fresh seeded permutation of the task list every epoch. A group is ``group_size``
rollouts of that task with ids ``g{g:06d}-r{k}``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from harnessrl.errors import ConfigError
from harnessrl.schemas import Task
from harnessrl.tasks.fields import HIDDEN, check_visible
from harnessrl.trainer.config import TaskSource

TRAIN_KIND = "train"
EVAL_KIND = "eval"


def load_task_source(source: TaskSource, *, split: str, base_dir: Path | None = None) -> list[Task]:
    if source.type == "reasoning_gym":
        from harnessrl.tasks.reasoning_gym import reasoning_gym_tasks

        assert source.dataset is not None
        tasks = reasoning_gym_tasks(
            source.dataset, source.size, source.seed, source.config or None, split=split
        )
    elif source.type == "jsonl":
        from harnessrl.tasks.jsonl import load_tasks

        assert source.path is not None
        path = Path(source.path)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        tasks = load_tasks(path)
    elif source.type == "swesmith":  # records as `harnessrl data` writes them (docs/data.md)
        from harnessrl.data.records import read_records, to_task

        assert source.path is not None
        path = Path(source.path)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        tasks = [Task(task_id=t["task_id"], split=split, data=t) for t in map(to_task, read_records(path))]
        ids = [task.task_id for task in tasks]
        if "" in ids or len(set(ids)) != len(ids):
            raise ConfigError(f"{split} tasks: {path}: every record needs a unique instance_id")
    elif source.type == "scienceworld":
        from harnessrl.tasks.scienceworld import scienceworld_tasks

        try:
            tasks = scienceworld_tasks(size=source.size, seed=source.seed, split=split, **source.config)
        except TypeError as exc:  # an unknown key in [tasks.config]
            raise ConfigError(f"{split} tasks: scienceworld config: {exc}") from exc
    else:
        tasks = [
            Task(task_id=str(item.get("task_id", f"inline-{i}")), split=split, data=dict(item))
            for i, item in enumerate(source.items)
        ]
    if not tasks:
        raise ConfigError(f"{split} tasks: the source produced no tasks")
    if source.prompt_template:
        for task in tasks:
            visible = {k: v for k, v in task.data.items() if k != HIDDEN}  # the prompt reaches the harness
            try:
                task.data["prompt"] = source.prompt_template.format(**visible)
            except (KeyError, IndexError) as exc:
                raise ConfigError(f"{split}.prompt_template: the task has no field {exc}") from exc
    for task in tasks:  # every source, inline items and SWE-smith records included
        check_visible(task.data, where=f"{split} tasks: task {task.task_id!r}")
    return tasks


@dataclass(frozen=True)
class GroupPlan:
    index: int
    group_id: str
    task: Task
    rollout_ids: tuple[str, ...]


class TaskSchedule:
    def __init__(self, tasks: list[Task], group_size: int, seed: int):
        self.tasks = tasks
        self.group_size = group_size
        self.seed = seed
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.tasks)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders[epoch] = order
        return self._orders[epoch]

    def group(self, index: int) -> GroupPlan:
        epoch, position = divmod(index, len(self.tasks))
        task = self.tasks[self._order(epoch)[position]]
        group_id = f"g{index:06d}"
        rollout_ids = tuple(f"{group_id}-r{k}" for k in range(self.group_size))
        return GroupPlan(index, group_id, task, rollout_ids)


def eval_rollout_id(step: int, task_index: int) -> str:
    return f"eval-s{step:05d}-t{task_index:04d}"
