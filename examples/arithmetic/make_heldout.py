"""Writes ``heldout.jsonl``: 100 basic_arithmetic problems none of which occurs in the training tasks.

reasoning-gym builds item ``i`` of seed ``s`` from ``Random(s + i)``, so the held-out items come from a
seed far from the training range (``eval_seed``). The problem space is small (2 terms of 1-2 digits,
+ and -: about 20k problems, and the 1-digit ones are drawn far more often), so even a far seed repeats
some training questions by chance; those are skipped, and ``check_disjoint`` proves the rest are new.
Reads the training source from ``train.toml`` so the two cannot drift apart. Each task keeps its
answer (and what regenerates it) under ``hidden``, as ``reasoning_gym_tasks`` makes it; reading the
file back with ``load_tasks`` checks that nothing evaluator-only is visible to the harness.

    .venv/bin/python examples/arithmetic/make_heldout.py
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from harnessrl.tasks.jsonl import load_tasks, save_tasks
from harnessrl.tasks.reasoning_gym import (
    check_disjoint,
    eval_seed,
    overlapping_questions,
    reasoning_gym_tasks,
)

HERE = Path(__file__).resolve().parent
HELDOUT_SIZE = 100
POOL = 400  # drawn from the far seed; the first HELDOUT_SIZE not in training are kept


def main() -> None:
    tasks = tomllib.loads((HERE / "train.toml").read_text())["tasks"]
    train = reasoning_gym_tasks(tasks["dataset"], tasks["size"], tasks["seed"], tasks["config"])
    seed = eval_seed(tasks["seed"], tasks["size"], POOL)
    pool = reasoning_gym_tasks(tasks["dataset"], POOL, seed, tasks["config"], split="heldout")
    seen = set(overlapping_questions(train, pool))
    heldout, questions = [], set()
    for task in pool:
        question = " ".join(task.data["question"].split())
        if question in seen or question in questions:  # also no duplicates within the held-out set
            continue
        questions.add(question)
        heldout.append(task)
        if len(heldout) == HELDOUT_SIZE:
            break
    check_disjoint(train, heldout)
    save_tasks(HERE / "heldout.jsonl", heldout)
    assert load_tasks(HERE / "heldout.jsonl") == heldout  # raises ConfigError on a visible answer
    print(
        f"wrote {len(heldout)} held-out tasks (seed {seed}; skipped {len(seen)} questions seen in training "
        f"of {tasks['size']} at seed {tasks['seed']})"
    )


if __name__ == "__main__":
    main()
