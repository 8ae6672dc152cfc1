"""reasoning-gym as a task source, and the scoring the ``reasoning_gym`` evaluator calls.

Each task's data carries the reasoning-gym entry *and* how to regenerate it, so scoring uses the
dataset's own ``score_answer`` on exactly the entry that was asked, with its native metadata types
(tuples, sets) rather than their JSON round-trip. The harness sees only ``prompt``, ``question`` and
``dataset``; the answer, the entry's ``metadata`` (some datasets keep the solution there) and the
regeneration data (``config``, ``seed``, ``size``, ``index``: enough to rebuild the answer) are under
``hidden``::

    {"prompt", "question", "dataset",
     "hidden": {"answer", "metadata", "config", "seed", "size", "index"}}

Seeds: reasoning-gym builds item ``i`` of a dataset with seed ``s`` from ``Random(s + i)``. Two
task lists overlap whenever their ``[seed, seed + size)`` ranges do: 4000 train items at seed 2000
and eval items at seed 3000 are the *same* questions. Keep the ranges apart (``eval_seed`` gives
one) and check with ``overlapping_questions`` / ``check_disjoint`` (which also catch duplicates that
small problem spaces produce by chance).

Scoring a policy's answer runs the dataset's ``score_answer``, and several of reasoning-gym's scorers
evaluate the answer as Python (``eval`` in string_insertion, spiral_matrix, binary_matrix, n_queens;
``sympy.parse_expr`` in countdown, polynomial_multiplication, the integration datasets). So the
``reasoning_gym`` evaluator never calls ``score_answer`` in the controller: it hands ``scoring_entry``'s
entry and the answer to a sandboxed scorer process (``harnessrl.tasks.reasoning_gym_scorer``).
``score_answer`` here runs in the caller's process and is for trusted answers only (offline checks,
tests). Datasets whose scorer rewards an answer that does not solve the asked question are refused
(``REFUSED_DATASETS``); those whose partial credit does are safe only under the evaluator's
``strict = true`` (``UNSAFE_WITHOUT_STRICT``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from harnessrl.errors import ConfigError
from harnessrl.schemas import Task
from harnessrl.tasks.fields import HIDDEN

PROMPT_SUFFIX = (
    '\n\nWork it out, then end your reply with a final line of the form "Answer: X" '
    "where X is only the final answer."
)


# Datasets whose own scorer gives full marks without the asked question being solved: training on
# them rewards the shortcut, so they are refused as tasks and by the evaluator.
# tests/tasks/test_reasoning_gym_cheats.py sweeps every other dataset with such shortcuts.
REFUSED_DATASETS: dict[str, str] = {
    "puzzle24": "its score_answer never checks that the answer uses the puzzle's four numbers "
    "('9+9+5+1' scores 1.0 on every puzzle)",
    "countdown": "its score_answer counts the numbers used with a regex over the whole answer, but "
    "evaluates it with sympy, which ignores a '# comment': '66 + 98 # 34 54 6' scores 1.0 on "
    "'make 164 from 66, 34, 98, 54, 6', and digit-free expressions such as "
    "'(True+True)**(True+True) + ... # 66 34 98 54 6' score 1.0 on every puzzle",
    "coin_flip": "its score_answer gives prefix credit divided by the shorter of the two numbers: "
    "'0' scores 1.0 on every question whose probability is below 1",
    "game_of_life_halting": "its score_answer compares bool(answer) with bool(gold), and both golds "
    "('True', 'False') are non-empty strings: any non-empty answer ('banana') scores 1.0",
}

# Datasets whose partial credit pays for closeness, so a constant answer earns most of a point
# ('00:00' scores 0.98 on '00:34:28'): safe only with the evaluator's ``strict = true`` (the
# default), which pays 1.0 for a full score and 0 for anything less.
UNSAFE_WITHOUT_STRICT: dict[str, str] = {
    "time_intervals": "its partial credit shrinks with the distance to the gold duration: '0' "
    "scores 0.95 on '5 days', '00:00' 0.98 on '00:34:28'",
}


def refusal(dataset: str) -> str | None:
    """Why ``dataset`` is refused (``REFUSED_DATASETS``), or None."""
    why = REFUSED_DATASETS.get(dataset)
    return None if why is None else f"reasoning-gym dataset {dataset!r} is refused: {why}"


def dataset_names() -> list[str]:
    import reasoning_gym.factory  # slow import: only when reasoning-gym is used

    return sorted(reasoning_gym.factory.DATASETS)


@functools.lru_cache(maxsize=64)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


def _config_json(config: Mapping[str, Any] | None) -> str:
    config = dict(config or {})
    if {"seed", "size"} & set(config):
        raise ConfigError("reasoning_gym: pass seed and size as arguments, not inside config")
    return json.dumps(config, sort_keys=True)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def task_id_for(dataset: str, seed: int, index: int, config: Mapping[str, Any] | None = None) -> str:
    """Deterministic: the same dataset, config, seed and index always give the same id."""
    suffix = ""
    if config:
        suffix = "-" + hashlib.sha256(_config_json(config).encode()).hexdigest()[:8]
    return f"rg-{dataset}{suffix}-s{seed}-{index}"


def reasoning_gym_tasks(
    dataset: str, size: int, seed: int, config: dict[str, Any] | None = None, split: str = "train"
) -> list[Task]:
    """``size`` tasks from reasoning-gym ``dataset`` built with ``seed`` (and dataset ``config``)."""
    if size < 1:
        raise ConfigError(f"reasoning_gym: size must be >= 1, got {size}")
    if dataset not in dataset_names():
        raise ConfigError(f"reasoning_gym: unknown dataset {dataset!r}")
    if refusal(dataset):
        raise ConfigError(f"reasoning_gym: {refusal(dataset)}")
    config_json = _config_json(config)
    try:
        ds = _dataset(dataset, config_json, seed, size)
    except (TypeError, ValueError, AssertionError) as exc:  # reasoning-gym validates configs with assert
        raise ConfigError(f"reasoning_gym: bad config for {dataset!r}: {exc}") from exc
    tasks = []
    for index in range(size):
        entry = ds[index]
        data = {
            "prompt": entry["question"] + PROMPT_SUFFIX,
            "question": entry["question"],
            "dataset": dataset,
            HIDDEN: {
                "answer": entry["answer"],
                "metadata": _jsonable(entry.get("metadata", {})),
                "config": json.loads(config_json),
                "seed": seed,
                "size": size,
                "index": index,
            },
        }
        tasks.append(Task(task_id=task_id_for(dataset, seed, index, config), split=split, data=data))
    return tasks


def scoring_entry(task: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The dataset and the entry that ``task`` asked, as the dataset's ``score_answer`` takes them.

    Regenerates the entry from ``dataset`` and ``hidden`` (config, seed, size, index) when the task
    has them and the regenerated question matches; otherwise (another reasoning-gym version,
    hand-written tasks) uses ``question`` and the hidden ``answer``/``metadata``. Raises
    ``ValueError`` for a task that names no dataset, a refused one, or has neither. Trusted: it reads
    only the task, never an answer.
    """
    hidden = task.get(HIDDEN) or {}
    name = task.get("dataset") or (hidden.get("metadata") or {}).get("source_dataset")
    if not name:
        raise ValueError("the task has no reasoning-gym 'dataset' field")
    if refusal(name):
        raise ValueError(refusal(name))
    config_json = _config_json(hidden.get("config"))
    if hidden.get("seed") is not None and hidden.get("index") is not None:
        index = int(hidden["index"])
        ds = _dataset(name, config_json, int(hidden["seed"]), int(hidden.get("size") or index + 1))
        generated = ds[index]
        if "question" not in task or generated["question"] == task["question"]:
            return ds, generated
    if "answer" not in hidden:
        raise ValueError("the task has neither hidden (seed, index) to regenerate it nor a 'hidden.answer'")
    entry = {
        "question": task.get("question", ""),
        "answer": hidden["answer"],
        "metadata": hidden.get("metadata") or {},
    }
    return _dataset(name, config_json, 0, 1), entry


def score_answer(task: Mapping[str, Any], answer: str | None) -> float:
    """The dataset's own score (0..1, partial credit included) of ``answer`` for ``task``'s data.

    Runs the dataset's scorer **in this process**, and some evaluate the answer as code: only for
    answers you trust. A policy's answers go through the ``reasoning_gym`` evaluator, which scores
    them in a sandboxed process (``harnessrl.tasks.reasoning_gym_scorer``).
    """
    ds, entry = scoring_entry(task)
    return float(ds.score_answer(answer, entry))


def eval_seed(train_seed: int, train_size: int, eval_size: int, gap: int = 1_000_000) -> int:
    """A seed whose ``Random(seed + i)`` streams cannot meet the training set's (for any eval_size)."""
    return train_seed + train_size + max(gap, eval_size)


def _question(task: Task | Mapping[str, Any]) -> str:
    data = task.data if isinstance(task, Task) else task
    return " ".join(str(data.get("question", data.get("prompt", ""))).split())


def overlapping_questions(a: Iterable[Task], b: Iterable[Task]) -> list[str]:
    """Questions (whitespace-normalized) that occur in both task lists, sorted."""
    return sorted({_question(t) for t in a} & {_question(t) for t in b} - {""})


def check_disjoint(train: Iterable[Task], evaluation: Iterable[Task]) -> None:
    """Raise ``ConfigError`` if any evaluation question also occurs in training."""
    train, evaluation = list(train), list(evaluation)
    shared = overlapping_questions(train, evaluation)
    if shared:
        raise ConfigError(
            f"{len(shared)} of {len(evaluation)} evaluation questions also occur in the training tasks "
            f"(e.g. {shared[0][:80]!r}); reasoning-gym items come from Random(seed + index), so keep "
            "[seed, seed + size) ranges apart (see harnessrl.tasks.reasoning_gym.eval_seed)"
        )
