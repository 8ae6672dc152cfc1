"""Answers that solve nothing must earn nothing: every accepted reasoning-gym dataset, swept.

A reasoning-gym dataset's own ``score_answer`` decides the reward, and a few pay for shortcuts: any
non-empty answer (``game_of_life_halting``), ``"0"`` (``coin_flip``), an expression that makes the
target from some of the numbers with the rest in a ``# comment`` (``countdown``), four numbers making
24 (``puzzle24``). Those are refused (``REFUSED_DATASETS``). This sweep asks every other dataset the
same kind of question, a few entries each, so the next such scorer (a new dataset, a new
reasoning-gym version) fails here instead of training a policy on the shortcut.

The cheats: constants (``""``, ``"0"``, ``"True"``, ``"banana"``, ...), a wrong answer with the gold's
numbers in a comment, and each number of the question or the entry's metadata (a target, a count)
followed by the gold's numbers in a comment, once in digits and once written without digits
(``(True+True)**(True+True+True)``: regex number counting does not see it, ``eval`` and sympy do).
A cheat that contains the gold answer, or equals it, is not a cheat and is left out.

What counts as paying: a full score (``>= 1``, what the evaluator's default ``strict = true`` pays)
for any dataset, and a score of ``PARTIAL_LIMIT`` or more for datasets not in
``UNSAFE_WITHOUT_STRICT`` (with ``strict = false`` the raw score is the reward). Scored in-process
(``score_answer``): the cheats are harmless strings, and the sandboxed scorer gives the same scores
(``test_reasoning_gym_scorer.py``).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import reasoning_gym

from harnessrl.tasks.reasoning_gym import (
    REFUSED_DATASETS,
    UNSAFE_WITHOUT_STRICT,
    dataset_names,
    reasoning_gym_tasks,
    refusal,
    scoring_entry,
)

ENTRIES = 3  # per dataset: the sweep of ~100 datasets takes ~10 s on 2 cores
PARTIAL_LIMIT = 0.9  # partial credit at or above this, for an answer that solves nothing, is paying
CONSTANTS = ("", "0", "1", "-1", "True", "False", "banana", "x", "None", "[]", "{}", "yes", "no")
NUMBERS_PER_ENTRY = 6  # of the question's numbers, tried as a target (each costs a few scores)
# Needs a config that names other datasets (each swept here on its own).
UNSWEPT = {"composite": "a mix of other datasets, each swept on its own"}


def _digit_free(value: int) -> str:
    """``value`` as an expression without a digit: ``(True+True)**(True+True) + ...``."""
    if value == 0:
        return "(True-True)"
    powers = [k for k in range(value.bit_length()) if value >> k & 1]
    return "+".join(f"(True+True)**({'+'.join(['True'] * k) or 'True-True'})" for k in powers)


def _same(a: str, b: str) -> bool:
    a, b = a.strip(), b.strip()
    if a.lower() == b.lower():
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def cheats(task: dict[str, Any]) -> list[str]:
    """Answers to ``task`` that do not solve it (see the module docstring)."""
    gold = str(task["hidden"]["answer"])
    gold_numbers = re.findall(r"\d+", gold)
    comment = " ".join(gold_numbers)
    found = list(CONSTANTS) + [f"0 # {comment}", f"x # {comment}"]
    metadata = task["hidden"]["metadata"]
    targets = [v for v in metadata.values() if isinstance(v, int) and not isinstance(v, bool)]
    targets += [int(n) for n in re.findall(r"\d+", task["question"])[:NUMBERS_PER_ENTRY]]
    for target in dict.fromkeys(targets):
        if 0 <= target <= 100_000 and str(target) not in gold_numbers:
            found += [f"{target} # {comment}", f"{_digit_free(target)} # {comment}"]
    return [c for c in dict.fromkeys(found) if not _same(c, gold) and gold.strip() not in c]


def paid(dataset: str, score: float) -> bool:
    return score >= 1.0 or (dataset not in UNSAFE_WITHOUT_STRICT and score >= PARTIAL_LIMIT)


def paying_cheats(task: dict[str, Any], dataset: Any, entry: dict[str, Any]) -> list[tuple[str, float]]:
    """The cheats that ``dataset``'s scorer pays for on ``entry`` (``task``'s); one that raises pays
    nothing (the evaluator gives it reward 0, flagged ``scorer_raised``)."""
    found = []
    for cheat in cheats(task):
        try:
            value = float(dataset.score_answer(cheat, entry))
        except Exception:
            continue
        if paid(task["dataset"], value):
            found.append((cheat[:80], value))
    return found


SWEPT = [name for name in dataset_names() if not refusal(name) and name not in UNSWEPT]


def test_the_sweep_covers_every_dataset():
    assert len(SWEPT) >= 90  # reasoning-gym 0.1.25 has 105; a rename must not empty the sweep
    assert set(dataset_names()) == set(SWEPT) | set(REFUSED_DATASETS) | set(UNSWEPT)


@pytest.mark.parametrize("dataset", SWEPT)
def test_no_cheat_pays(dataset):
    found = {}
    for index, task in enumerate(t.data for t in reasoning_gym_tasks(dataset, size=ENTRIES, seed=0)):
        # What score_answer (and the scorer process) scores, regenerated once per entry, not per cheat.
        if paying := paying_cheats(task, *scoring_entry(task)):
            found[index] = paying
    assert not found, f"{dataset} pays for answers that solve nothing: refuse it (REFUSED_DATASETS) {found}"


@pytest.mark.parametrize("dataset", sorted(REFUSED_DATASETS))
def test_the_sweep_catches_every_refused_dataset(dataset):
    """Control: the same cheats, on the same entries of the refused datasets, are paid; so the sweep
    above sees a scorer that pays for them."""
    generated = reasoning_gym.create_dataset(dataset, seed=0, size=ENTRIES)
    paying = []
    for index in range(ENTRIES):
        entry = generated[index]
        task = {
            "dataset": dataset,
            "question": entry["question"],
            "hidden": {"answer": entry["answer"], "metadata": entry["metadata"]},
        }
        paying += paying_cheats(task, generated, entry)
    assert paying, dataset
    with pytest.raises(ValueError, match=f"{dataset}.*refused"):
        scoring_entry({"dataset": dataset, "question": "q", "hidden": {"answer": "1"}})
