"""Task fields: which ones a harness may see, and dotted paths into a task (``hidden.answer``).

A task is free-form JSON. Everything at its top level reaches the harness (``HARNESSRL_TASK``,
``task.json``, ``{task[FIELD]}``); everything under ``hidden`` is for evaluators (and the
controller's ``harness.repo``) only and never reaches the harness
(``harnessrl.controller.harness.harness_view``).

The rule every task source and loader enforces (``check_visible``): a task whose top level holds a
name in ``EVALUATOR_ONLY`` (the answer, a gold patch, hidden tests, the original repository's path)
is refused with a ``ConfigError`` naming the field; put it under ``hidden`` instead. The list is
short on purpose: it catches the usual names, it cannot recognise an answer under any name, so a
task source still has to put what its scorer needs under ``hidden`` itself.

Dotted paths (``get_field``): ``"hidden.answer"`` is ``task["hidden"]["answer"]``; a dot always
separates levels (a top-level key containing a dot cannot be addressed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harnessrl.errors import ConfigError

HIDDEN = "hidden"

# Names that, at a task's top level, would hand the harness its answer or the scorer's data.
EVALUATOR_ONLY = frozenset(
    {
        "answer",
        "answers",
        "gold",
        "gold_answer",
        "solution",
        "patch",
        "gold_patch",
        "test_patch",
        "hidden_tests",
        "repo_path",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        # The layouts the searchqa source reads (Search-R1 / FlashRAG, verl's processed rows): such a
        # file loaded as plain JSONL handed the harness its answers in HARNESSRL_TASK.
        "golden_answers",
        "reward_model",
        "ground_truth",
    }
)


def check_visible(task: Mapping[str, Any], *, where: str) -> None:
    """Raise ``ConfigError`` (prefixed with ``where``) if ``task`` shows the harness evaluator-only data."""
    leaked = sorted(EVALUATOR_ONLY & set(task))
    if leaked:
        name = leaked[0]
        raise ConfigError(
            f"{where}: task field {name!r} is evaluator-only but visible to the harness; "
            f"put it under {HIDDEN!r} (evaluators read it as '{HIDDEN}.{name}')"
        )
    if HIDDEN in task and not isinstance(task[HIDDEN], Mapping):
        raise ConfigError(f"{where}: task field {HIDDEN!r} must be a JSON object")


def is_hidden_path(path: str) -> bool:
    """Whether the dotted ``path`` names hidden data (``hidden`` or anything under it)."""
    return path.split(".", 1)[0] == HIDDEN


def get_field(task: Mapping[str, Any], path: str) -> Any:
    """The value at dotted ``path`` in ``task``; ``KeyError(path)`` if any level is missing."""
    value: Any = task
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(path)
        value = value[part]
    return value
