"""Write the shell_agent example's tasks: ``tasks/train.jsonl`` and ``tasks/heldout.jsonl``.

Each task asks for one small change in an empty workspace — create a file, a file containing a word
or a number, a directory, a file inside a new directory — and carries under ``hidden.check`` what
``check.py`` verifies afterwards. Records are SWE-smith-shaped (``instance_id``,
``problem_statement``), so ``harnessrl data calibrate/select/split`` read them as they are.

The held-out split shares no task instance (no identical problem statement) with training; the
script checks that before writing. Deterministic: the same ``--seed`` gives the same bytes.

    python examples/shell_agent/make_tasks.py            # 400 training tasks, 60 held-out
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEMS = [
    "answer",
    "result",
    "notes",
    "data",
    "report",
    "output",
    "summary",
    "value",
    "list",
    "info",
    "message",
    "config",
    "status",
    "record",
    "draft",
    "todo",
    "score",
    "total",
    "index",
    "memo",
]
EXTENSIONS = [".txt", ".md", ".log", ".csv"]
WORDS = [
    "apple",
    "banana",
    "cherry",
    "river",
    "mountain",
    "garden",
    "rocket",
    "planet",
    "silver",
    "orange",
    "window",
    "pencil",
    "forest",
    "castle",
    "dragon",
    "yellow",
    "purple",
    "winter",
    "summer",
    "tiger",
    "lemon",
    "cloud",
    "stone",
    "bridge",
    "candle",
    "piano",
    "violet",
    "ocean",
]
DIRS = [
    "build",
    "docs",
    "src",
    "tests",
    "data",
    "backup",
    "assets",
    "scripts",
    "config",
    "output",
    "cache",
    "reports",
    "images",
    "notes",
    "archive",
    "tmp_files",
]
# The names in mini_shell.yaml's worked examples never appear in a task.
EXAMPLE_NAMES = {"greeting.txt", "out.txt", "logs", "hello", "7"}

FAMILIES = [("file", 25), ("word", 30), ("number", 20), ("dir", 15), ("file_in_dir", 10)]


def _file(rng: random.Random) -> str:
    return rng.choice(STEMS) + rng.choice(EXTENSIONS)


def make_task(rng: random.Random) -> tuple[str, str, dict]:
    """(family, problem statement, check) for one random task."""
    family = rng.choices([f for f, _ in FAMILIES], weights=[w for _, w in FAMILIES])[0]
    if family == "file":
        name = _file(rng)
        return family, f"Create a file named {name}.", {"kind": "file", "path": name}
    if family == "word":
        name, word = _file(rng), rng.choice(WORDS)
        return (
            family,
            f"Create a file named {name} containing the word {word}.",
            {"kind": "contains", "path": name, "value": word},
        )
    if family == "number":
        name, number = _file(rng), str(rng.randint(2, 999))
        return (
            family,
            f"Create a file named {name} containing the number {number}.",
            {"kind": "contains", "path": name, "value": number},
        )
    if family == "dir":
        name = rng.choice(DIRS)
        return family, f"Create a directory named {name}.", {"kind": "dir", "path": name}
    folder, name = rng.choice(DIRS), _file(rng)
    return (
        family,
        f"Create a directory named {folder} and inside it a file named {name}.",
        {"kind": "file_in_dir", "path": f"{folder}/{name}"},
    )


def make_split(rng: random.Random, n: int, prefix: str, taken: set[str]) -> list[dict]:
    records: list[dict] = []
    while len(records) < n:
        family, statement, check = make_task(rng)
        names = set(check["path"].split("/")) | {check.get("value", "")}
        if statement in taken or names & EXAMPLE_NAMES:
            continue
        taken.add(statement)
        records.append(
            {
                "instance_id": f"{prefix}-{len(records):04d}",
                "problem_statement": statement,
                "family": family,
                "hidden": {"check": check},
            }
        )
    return records


def check_disjoint(train: list[dict], heldout: list[dict]) -> None:
    shared = {r["problem_statement"] for r in train} & {r["problem_statement"] for r in heldout}
    if shared:
        raise SystemExit(f"held-out shares {len(shared)} task(s) with training, e.g. {sorted(shared)[0]!r}")


def write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--heldout", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "tasks")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    taken: set[str] = set()
    heldout = make_split(rng, args.heldout, "heldout", taken)  # first: training never takes its tasks
    train = make_split(rng, args.train, "train", taken)
    check_disjoint(train, heldout)
    write(args.out / "train.jsonl", train)
    write(args.out / "heldout.jsonl", heldout)
    counts = {f: sum(r["family"] == f for r in heldout) for f, _ in FAMILIES}
    print(json.dumps({"train": len(train), "heldout": len(heldout), "heldout_families": counts}))


if __name__ == "__main__":
    main()
