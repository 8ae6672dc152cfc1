"""``[tasks]`` and ``[heldout]``: where a run's tasks come from, one typed kind per ``type``.

``TaskSource`` is the discriminated union of the kinds (``type`` chooses; ``reasoning_gym`` when it
is left out); each kind has only its own fields and its own ``load``. What every kind shares is in
``SourceBase.load``: the optional ``prompt_template`` (from a task's visible fields only: the prompt
reaches the harness) and the check that no evaluator-only field is visible
(``tasks.fields.check_visible``, docs/evaluators.md#where-answers-live). A new kind is a class here
with its ``type`` literal, added to ``TaskSource``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter

from harnessrl.config import Section, validate_config
from harnessrl.errors import ConfigError
from harnessrl.schemas import Task
from harnessrl.tasks.fields import HIDDEN, check_visible


class SourceBase(Section):
    prompt_template: str | None = Field(
        default=None, description="optional '{question}'-style template for the task's prompt field"
    )

    def load(self, *, split: str, base_dir: Path | None = None) -> list[Task]:
        """The source's tasks (``split`` is "train" or "heldout"); relative paths are relative to
        ``base_dir`` (the config file's folder). ``ConfigError`` naming the problem."""
        tasks = self.read(split, base_dir)
        if not tasks:
            raise ConfigError(f"{split} tasks: the source produced no tasks")
        if self.prompt_template:
            for task in tasks:
                visible = {
                    k: v for k, v in task.data.items() if k != HIDDEN
                }  # the prompt reaches the harness
                try:
                    task.data["prompt"] = self.prompt_template.format(**visible)
                except KeyError as exc:
                    raise ConfigError(f"{split}.prompt_template: the task has no field {exc}") from exc
                except (IndexError, AttributeError, TypeError, ValueError) as exc:
                    # A stray brace, a positional "{0}", "{prompt.x}", "{prompt!z}": a traceback (exit
                    # 1) before, not the one line naming the field.
                    raise ConfigError(
                        f"{split}.prompt_template: {self.prompt_template!r} cannot be filled with the "
                        f"fields of task {task.task_id!r} ({exc}); write {{field}} for a field, {{{{ or }}}} for a brace"
                    ) from exc
        for task in tasks:  # every source, inline items and SWE-smith records included
            check_visible(task.data, where=f"{split} tasks: task {task.task_id!r}")
        return tasks

    def read(self, split: str, base_dir: Path | None) -> list[Task]:
        raise NotImplementedError


def _resolve(path: str, base_dir: Path | None) -> Path:
    p = Path(path)
    return base_dir / p if not p.is_absolute() and base_dir is not None else p


class ReasoningGymTasks(SourceBase):
    """A reasoning-gym dataset, generated offline."""

    type: Literal["reasoning_gym"] = "reasoning_gym"
    dataset: str = Field(min_length=1)
    size: int = Field(default=1000, ge=1)
    seed: int = 0
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset's own arguments")

    def read(self, split: str, base_dir: Path | None) -> list[Task]:
        from harnessrl.tasks.reasoning_gym import reasoning_gym_tasks

        return reasoning_gym_tasks(self.dataset, self.size, self.seed, self.config or None, split=split)


class JsonlTasks(SourceBase):
    """One task per line of a JSONL file."""

    type: Literal["jsonl"]
    path: str = Field(min_length=1)

    def read(self, split: str, base_dir: Path | None) -> list[Task]:
        from harnessrl.tasks.jsonl import load_tasks

        return load_tasks(_resolve(self.path, base_dir))


class InlineTasks(SourceBase):
    """Tasks written in the config file (``task_id`` optional: ``inline-<i>``)."""

    type: Literal["inline"]
    items: list[dict[str, Any]] = Field(min_length=1)

    def read(self, split: str, base_dir: Path | None) -> list[Task]:
        tasks: list[Task] = []
        first: dict[str, int] = {}  # task_id -> the item that has it
        for i, item in enumerate(self.items):
            task_id = item.get("task_id", f"inline-{i}")
            if isinstance(task_id, bool) or not isinstance(task_id, str | int) or not str(task_id).strip():
                raise ConfigError(
                    f"{split}.items[{i}].task_id: a non-empty string or an integer, got {task_id!r}"
                )
            if "\x00" in str(task_id):  # no store keeps it: the run failed once under way
                raise ConfigError(f"{split}.items[{i}].task_id: must not contain a NUL character")
            # As a JSONL file's: two tasks under one id were one task to everything keyed by it.
            if str(task_id) in first:
                raise ConfigError(
                    f"{split}.items[{i}].task_id: duplicate task_id {str(task_id)!r} "
                    f"(items[{first[str(task_id)]}] has it too)"
                )
            first[str(task_id)] = i
            tasks.append(Task(task_id=str(task_id), split=split, data=dict(item)))
        return tasks


class SweSmithTasks(SourceBase):
    """SWE-smith-style records as ``harnessrl data`` writes them, mapped by ``harnessrl.data.to_task``
    (docs/examples/coding.md)."""

    type: Literal["swesmith"]
    path: str = Field(min_length=1)

    def read(self, split: str, base_dir: Path | None) -> list[Task]:
        from harnessrl.data.records import read_records, to_task

        path = _resolve(self.path, base_dir)
        tasks = [Task(task_id=t["task_id"], split=split, data=t) for t in map(to_task, read_records(path))]
        ids = [task.task_id for task in tasks]
        if "" in ids or len(set(ids)) != len(ids):
            raise ConfigError(f"{split} tasks: {path}: every record needs a unique instance_id")
        return tasks


class ScienceWorldTasks(SourceBase):
    """ScienceWorld variations (``config`` = ``scienceworld_tasks`` keyword arguments;
    docs/examples/scienceworld.md)."""

    type: Literal["scienceworld"]
    size: int = Field(default=1000, ge=1)
    seed: int = 0
    config: dict[str, Any] = Field(default_factory=dict)

    def read(self, split: str, base_dir: Path | None) -> list[Task]:
        from harnessrl.tasks.scienceworld import scienceworld_tasks

        try:
            return scienceworld_tasks(size=self.size, seed=self.seed, split=split, **self.config)
        except TypeError as exc:  # an unknown key in [tasks.config]
            raise ConfigError(f"{split} tasks: scienceworld config: {exc}") from exc


class SearchQATasks(SourceBase):
    """Question answering in the Search-R1 / FlashRAG / NQ-open / HotpotQA JSONL layouts (``question``
    and gold answers), for a search agent (``harnessrl.tasks.search.load_searchqa``; docs/retrieval.md)."""

    type: Literal["searchqa"]
    path: str = Field(min_length=1)

    def read(self, split: str, base_dir: Path | None) -> list[Task]:
        from harnessrl.tasks.search import load_searchqa

        return load_searchqa(_resolve(self.path, base_dir), split=split)


def _kind(value: Any) -> str:
    """The kind of a source as written (``type``, ``reasoning_gym`` when left out) or as built."""
    if isinstance(value, dict):
        return value.get("type", "reasoning_gym")
    return getattr(value, "type", "reasoning_gym")


TaskSource = Annotated[
    Annotated[ReasoningGymTasks, Tag("reasoning_gym")]
    | Annotated[JsonlTasks, Tag("jsonl")]
    | Annotated[InlineTasks, Tag("inline")]
    | Annotated[SweSmithTasks, Tag("swesmith")]
    | Annotated[ScienceWorldTasks, Tag("scienceworld")]
    | Annotated[SearchQATasks, Tag("searchqa")],
    Discriminator(_kind),
]


_ADAPTER: TypeAdapter[TaskSource] = TypeAdapter(TaskSource)


def parse_task_source(data: Mapping[str, Any], *, where: str = "tasks") -> TaskSource:
    """A ``[tasks]``-style mapping as its kind; ``ConfigError`` naming each bad field."""
    return validate_config(_ADAPTER, dict(data), where=where)
