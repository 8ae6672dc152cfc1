"""Write the assistant example's tasks: ``tasks/train.jsonl`` and ``tasks/heldout.jsonl``.

Instruction following with an outcome in the workspace: each task asks a general-purpose assistant
for a small file (or folder) with several exact properties — a number of lines, words from a given
list, a title and a bullet list, a JSON key, upper case and nothing else, a countdown — and carries
under ``hidden.checks`` the constraints ``check.py`` verifies afterwards (the reward is the share of
them met, so a partly right answer earns part of the reward). Lines are bare task data
(``{"task_id", "prompt", "hidden"}``) for the ``jsonl`` task source.

The held-out split shares no prompt with training; the script checks that before writing.
Deterministic: the same ``--seed`` gives the same bytes.

    python examples/assistant/make_tasks.py            # 300 training tasks, 40 held-out
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEMS = ["notes", "list", "plan", "summary", "answer", "items", "report", "todo", "draft", "words"]
EXTENSIONS = [".txt", ".md"]
WORDS = [
    "apple", "banana", "cherry", "river", "garden", "rocket", "planet", "silver", "window", "pencil",
    "forest", "castle", "yellow", "purple", "winter", "summer", "tiger", "lemon", "cloud", "stone",
]  # fmt: skip
TITLES = ["Shopping", "Packing", "Chores", "Reading", "Groceries", "Errands", "Goals", "Ideas"]
KEYS = ["count", "limit", "retries", "port", "size", "level"]
DIRS = ["box", "inbox", "archive", "drafts", "assets"]


def _file(rng: random.Random) -> str:
    return rng.choice(STEMS) + rng.choice(EXTENSIONS)


def lines_from_words(rng: random.Random) -> dict:
    path, n, words = _file(rng), rng.randint(2, 4), rng.sample(WORDS, 3)
    prompt = f"Write a file named {path} with exactly {n} lines; each line is one of these words: {', '.join(words)}."
    checks = [
        {"kind": "file", "path": path},
        {"kind": "line_count", "path": path, "value": n},
        {"kind": "lines_from", "path": path, "value": words},
    ]
    return {"family": "lines_from_words", "prompt": prompt, "checks": checks}


def title_and_bullets(rng: random.Random) -> dict:
    path, title, items = rng.choice(STEMS) + ".md", rng.choice(TITLES), rng.sample(WORDS, rng.randint(2, 3))
    prompt = (
        f"Create {path} whose first line is the heading '# {title}', followed by a bullet list "
        f"('- ' items), one per line, of: {', '.join(items)}."
    )
    checks = [
        {"kind": "file", "path": path},
        {"kind": "first_line", "path": path, "value": f"# {title}"},
        {"kind": "bullets", "path": path, "value": items},
    ]
    return {"family": "title_and_bullets", "prompt": prompt, "checks": checks}


def uppercase_only(rng: random.Random) -> dict:
    path, word = _file(rng), rng.choice(WORDS)
    prompt = f"Write the word {word} in uppercase letters into {path}, and nothing else."
    checks = [{"kind": "file", "path": path}, {"kind": "exact", "path": path, "value": word.upper()}]
    return {"family": "uppercase_only", "prompt": prompt, "checks": checks}


def json_key(rng: random.Random) -> dict:
    key, value = rng.choice(KEYS), rng.randint(2, 99)
    path = rng.choice(["config", "settings", "options"]) + ".json"
    prompt = f'Create a JSON file {path} containing an object with the key "{key}" set to the number {value}.'
    checks = [{"kind": "file", "path": path}, {"kind": "json_key", "path": path, "key": key, "value": value}]
    return {"family": "json_key", "prompt": prompt, "checks": checks}


def countdown(rng: random.Random) -> dict:
    path, low = _file(rng), rng.randint(1, 20)
    high = low + rng.randint(2, 5)
    prompt = f"Write {path} listing the whole numbers from {high} down to {low}, one per line."
    lines = [str(i) for i in range(high, low - 1, -1)]
    checks = [
        {"kind": "file", "path": path},
        {"kind": "line_count", "path": path, "value": len(lines)},
        {"kind": "lines_exact", "path": path, "value": lines},
    ]
    return {"family": "countdown", "prompt": prompt, "checks": checks}


def folder_of_empty_files(rng: random.Random) -> dict:
    folder = rng.choice(DIRS)
    first, second = (f"{stem}.txt" for stem in rng.sample(STEMS, 2))
    prompt = f"Create a folder named {folder} containing two empty files, {first} and {second}."
    checks = [
        {"kind": "dir", "path": folder},
        {"kind": "empty_file", "path": f"{folder}/{first}"},
        {"kind": "empty_file", "path": f"{folder}/{second}"},
    ]
    return {"family": "folder_of_empty_files", "prompt": prompt, "checks": checks}


FAMILIES = [lines_from_words, title_and_bullets, uppercase_only, json_key, countdown, folder_of_empty_files]


def generate(rng: random.Random, count: int, prefix: str, exclude: set[str]) -> list[dict]:
    """``count`` distinct tasks, families in turn, none with a prompt in ``exclude``."""
    records: list[dict] = []
    seen = set(exclude)
    while len(records) < count:
        task = FAMILIES[len(records) % len(FAMILIES)](rng)
        if task["prompt"] in seen:
            continue
        seen.add(task["prompt"])
        task_id = f"{prefix}-{len(records):04d}"
        records.append({"task_id": task_id, "prompt": task["prompt"], "family": task["family"],
                        "hidden": {"checks": task["checks"]}})  # fmt: skip
    return records


def check_disjoint(train: list[dict], heldout: list[dict]) -> None:
    shared = {r["prompt"] for r in train} & {r["prompt"] for r in heldout}
    if shared:
        raise SystemExit(f"held-out split shares {len(shared)} task(s) with training")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "tasks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=300)
    parser.add_argument("--heldout", type=int, default=40)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    heldout = generate(rng, args.heldout, "heldout", set())
    train = generate(rng, args.train, "train", {r["prompt"] for r in heldout})
    check_disjoint(train, heldout)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, records in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        (args.out / name).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    print(json.dumps({"train": len(train), "heldout": len(heldout), "out": str(args.out)}))


if __name__ == "__main__":
    main()
