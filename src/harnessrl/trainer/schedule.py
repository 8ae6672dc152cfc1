"""Which tasks get rolled out, in which order, under which ids: deterministic, so a resumed run
creates exactly the rollouts the crashed one would have (``create_rollout`` is idempotent per id).

Groups are numbered 0, 1, 2, ... in creation order; group ``g`` is task ``order[g % N]`` where
``order`` is a fresh seeded permutation of the task list every epoch. A group is ``group_size``
rollouts of that task with ids ``<run>-g{g:06d}-r{k}``. A held-out evaluation at step ``s`` is one
group of one rollout per held-out task, ``<run>-eval-s{s:05d}-t{i:04d}`` (``eval-s{s:05d}-redo{k}-…``
when a resumed run redoes an evaluation the kill's lost weights sampled). Rollout ids are unique in
the store (one store may hold many runs), so they start with the run's name (``run_id_prefix``); a
run created before they did keeps its bare ids (``g000000-r0``), which its ``--resume`` must find.
Group ids (``g{g:06d}``, ``eval-s{s:05d}``) are the run's own: the store's ``run_id`` tells runs apart.

"Step" always means an optimizer step (a policy version): a training rollout's stored ``step`` is
the policy step at which its group was created, a held-out rollout's the step it evaluates. The
group's index is ``metadata["group"]`` (and the ``g{g:06d}`` of its ``group_id``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from harnessrl.schemas import SamplingOverrides, Task
from harnessrl.trainer.config import TrainerSection

#: A group's kind, kept in each of its rollouts' ``metadata["kind"]``.
GroupKind = Literal["train", "eval"]
TRAIN_KIND: GroupKind = "train"
EVAL_KIND: GroupKind = "eval"


def heldout_overlap(train: list[Task], heldout: list[Task]) -> int:
    """Held-out tasks whose question also appears among the training tasks (overstates accuracy)."""

    def question(task: Task) -> object:
        return task.data.get("question") or task.data.get("prompt")

    seen = {question(t) for t in train}
    return sum(1 for t in heldout if question(t) in seen)


@dataclass(frozen=True)
class GroupPlan:
    """Rollouts created together and consumed together: a training group (one task, ``group_size``
    times) or one held-out evaluation (each held-out task once)."""

    group_id: str
    kind: GroupKind
    step: int  # stored as each rollout's step: the policy step it was created at / evaluates
    members: tuple[tuple[str, Task], ...]  # (rollout_id, task)
    sampling: SamplingOverrides = field(default_factory=SamplingOverrides)
    index: int | None = None  # a training group's index in the schedule (metadata["group"])

    @property
    def rollout_ids(self) -> tuple[str, ...]:
        return tuple(rollout_id for rollout_id, _ in self.members)

    @property
    def task(self) -> Task:
        """A training group's task (every member has the same one)."""
        return self.members[0][1]


def train_sampling(cfg: TrainerSection) -> SamplingOverrides:
    """What training calls sample with, whatever the harness asks (docs/train.md, "What is recorded")."""
    # The trainer's logprobs come from the full tempered softmax; with top_p < 1 the engines record
    # the renormalized nucleus instead, so the nucleus is forced too unless the config opts out.
    top_p = None if cfg.top_p == "harness" else cfg.top_p
    return SamplingOverrides(temperature=cfg.temperature, top_p=top_p, max_tokens=cfg.max_tokens)


def eval_sampling(cfg: TrainerSection) -> SamplingOverrides:
    return SamplingOverrides(temperature=cfg.eval_temperature, max_tokens=cfg.max_tokens)


def run_id_prefix(run_id: str) -> str:
    """What a run's rollout ids start with: two runs on one store never share an id."""
    return f"{run_id}-"


class TaskSchedule:
    """``id_prefix``: what every rollout id starts with (``run_id_prefix``; "" for the bare ids of a
    run created before ids had one)."""

    def __init__(
        self,
        tasks: list[Task],
        group_size: int,
        seed: int,
        sampling: SamplingOverrides | None = None,
        *,
        id_prefix: str = "",
    ):
        self.tasks = tasks
        self.group_size = group_size
        self.seed = seed
        self.sampling = sampling or SamplingOverrides()
        self.id_prefix = id_prefix
        self._orders: dict[int, list[int]] = {}
        #: step -> redo number of the evaluations a resumed run redoes (``redo_evaluations``)
        self._eval_redos: dict[int, int] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.tasks)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders[epoch] = order
        return self._orders[epoch]

    def group(self, index: int, *, step: int = 0) -> GroupPlan:
        """Group ``index``, created while the policy is at ``step`` (a resumed run recreating a
        group passes any step: the rollouts exist already and keep the step they were created at)."""
        epoch, position = divmod(index, len(self.tasks))
        task = self.tasks[self._order(epoch)[position]]
        members = tuple(
            (train_rollout_id(index, k, id_prefix=self.id_prefix), task) for k in range(self.group_size)
        )
        return GroupPlan(train_group_id(index), TRAIN_KIND, step, members, self.sampling, index=index)

    def evaluation(self, step: int, heldout: list[Task], sampling: SamplingOverrides) -> GroupPlan:
        """The held-out evaluation at ``step``: each held-out task once."""
        redo = self._eval_redos.get(step, 0)
        return eval_plan(step, heldout, sampling, id_prefix=self.id_prefix, redo=redo)

    def redo_evaluations(self, redos: dict[int, int]) -> None:
        """A resumed run's evaluations at these steps get new ids (``redo``): the rollouts under the
        earlier ids were sampled by weights the kill lost (``RolloutBook.retire_evaluations``)."""
        self._eval_redos.update(redos)


def train_group_id(index: int) -> str:
    return f"g{index:06d}"


def train_rollout_id(index: int, k: int, *, id_prefix: str = "") -> str:
    return f"{id_prefix}{train_group_id(index)}-r{k}"


def eval_group_id(step: int, redo: int = 0) -> str:
    return f"eval-s{step:05d}" + (f"-redo{redo}" if redo else "")


def eval_redo(group_id: str) -> int:
    """The redo number in an evaluation's group id (0 for the first)."""
    _, _, redo = group_id.partition("-redo")
    return int(redo) if redo.isdigit() else 0


def eval_rollout_id(step: int, task_index: int, *, id_prefix: str = "", redo: int = 0) -> str:
    return f"{id_prefix}{eval_group_id(step, redo)}-t{task_index:04d}"


def eval_plan(
    step: int, heldout: list[Task], sampling: SamplingOverrides, *, id_prefix: str = "", redo: int = 0
) -> GroupPlan:
    members = tuple(
        (eval_rollout_id(step, i, id_prefix=id_prefix, redo=redo), task) for i, task in enumerate(heldout)
    )
    return GroupPlan(eval_group_id(step, redo), EVAL_KIND, step, members, sampling)
